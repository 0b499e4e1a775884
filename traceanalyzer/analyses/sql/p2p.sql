-- Point-to-point transfers: every receive joined to the send that fed it, with who waited.
--
-- How: a send on rank s and a receive on rank d are the same transfer when they have the same
-- (pg_name, src_rank, dst_rank, tag, p2p_seq): p2p_seq numbers each rank's ops of one channel in
-- order, and a channel delivers in order. Clock offsets (clock_offsets.sql) are added first.
-- The receiver waited for the sender when the send was posted after the receive: the sender's
-- own work before its send then decided when the receive completed (critical_path.py follows
-- such edges as it follows a collective's last arriver).
--
-- requires: clock_offsets, step_alignment

-- Each rank's sends and receives with a known peer, on the aligned clock (clock offsets added) and
-- with aligned steps. Columns: run, rank, step, op, pg, tag, p2p_seq, src_rank, dst_rank,
-- arrival_ns (the call was posted), release_ns (it returned: the end of its gloo span or of the
-- enqueue op that blocked, whichever is later).
-- scope: rank
CREATE OR REPLACE TEMP VIEW _p2p_calls AS
SELECT c.run, c.rank, coalesce(sa.aligned_step, c.step) AS step, c.op, coalesce(c.pg_name, '?') AS pg, c.tag, c.p2p_seq, c.src_rank, c.dst_rank,
       coalesce(c.enqueue_ts_ns, c.start_ts_ns) + coalesce(o.offset_ns, 0) AS arrival_ns,
       greatest(coalesce(c.end_ts_ns, 0), coalesce(c.enqueue_ts_ns + c.enqueue_dur_ns, 0))
           + coalesce(o.offset_ns, 0) AS release_ns
FROM comms c LEFT JOIN clock_offsets o ON o.run = c.run AND o.rank = c.rank
LEFT JOIN step_alignment sa ON sa.run = c.run AND sa.rank = c.rank AND sa.window_id = c.window_id AND sa.step = c.step
WHERE c.is_p2p AND c.op IN ('send', 'recv') AND c.src_rank IS NOT NULL AND c.dst_rank IS NOT NULL;

-- The sends to a connection's ranks made by ranks whose files it does not hold (_p2p_calls' rows):
-- none over a whole run. A map task (summaries.py) holds a chunk of ranks and provides the sends
-- of the ranks outside it that feed its receives, so that each receiver's transfers are made
-- with its own rows, as every rank view is.
-- scope: peers
CREATE OR REPLACE TEMP VIEW _p2p_peer_sends AS SELECT * FROM _p2p_calls WHERE false;

-- Columns: run, step (the receive's, aligned: step_alignment.sql), pg, tag, p2p_seq, src_rank, dst_rank, send_arrival_ns (the
-- sender posted its send), recv_arrival_ns (the receiver posted its receive), recv_release_ns
-- (the receive returned: the end of its gloo span or of the enqueue op that blocked, whichever is
-- later), recv_wait_ns (send_arrival - recv_arrival, >= 0: the receiver's wait for the sender).
-- A receiver's rows need its own receives and its senders' sends (_p2p_peer_sends in a map task).
-- scope: rank
CREATE OR REPLACE TEMP VIEW p2p_transfers AS
WITH sends AS (
    SELECT * FROM _p2p_calls WHERE op = 'send'
    UNION ALL
    SELECT * FROM _p2p_peer_sends
)
SELECT r.run, r.step, r.pg, r.tag, r.p2p_seq, r.src_rank, r.dst_rank,
       s.arrival_ns AS send_arrival_ns, r.arrival_ns AS recv_arrival_ns, r.release_ns AS recv_release_ns,
       greatest(s.arrival_ns - r.arrival_ns, 0) AS recv_wait_ns
FROM _p2p_calls r JOIN sends s
  ON s.run = r.run AND s.rank = r.src_rank AND s.pg = r.pg AND s.src_rank = r.src_rank
 AND s.dst_rank = r.dst_rank AND s.tag IS NOT DISTINCT FROM r.tag AND s.p2p_seq = r.p2p_seq
WHERE r.op = 'recv' AND r.rank = r.dst_rank;
