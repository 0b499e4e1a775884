"""Transfers of a pipeline plan: how many p2p ops each rank posts per step under a schedule, and
what posting them costs its host (replay/pipeline.py).

Each transfer has two costs. Its time on the wire (producer done -> consumer may start) is a message
of the simulated graph, one per chunk boundary and micro-batch at the recorded p2p cost
(``pipeline_costs._p2p_costs``). Its host cost -- the rank's thread posting the gloo send or receive
(the ``c10d::send`` / ``c10d::recv_`` op itself, the wait for its completion excluded) -- is work
of the rank that does not scale with its compute: a plan that cuts a rank's layers into more chunks
(1F1B -> Interleaved1F1B) makes the end ranks post more transfers per action (the first and last
rank: 1 per action in 1F1B, 1.5 with two chunks), and that is added to the rank's work between its
actions here, at the host cost measured in the recorded run (``StageCosts.p2p_host_ns``, per rank
the median duration of its recorded p2p ops).

The schedule's own Python around a transfer (building the p2p ops, batching them) is not visible
as an op in a 1F1B or GPipe trace: it is inside the recorded work between actions
(``overhead_ns``), which the plan keeps per action.
"""
from __future__ import annotations


def transfers_per_step(order: dict, n_ranks: int, stages_per_rank: int) -> dict:
    """Per rank position, the p2p ops (sends + receives) it posts in one step of ``order`` (rank
    position -> actions, ``schedule_order``): a forward receives the activations of stage - 1 and
    sends its own to stage + 1, a backward receives the gradients of stage + 1 and sends its own to
    stage - 1, when that stage is on another rank (stage s is on rank position s mod p)."""
    p = int(n_ranks)
    last = p * int(stages_per_rank) - 1
    out = {}
    for pos, acts in order.items():
        n = 0
        for s, k, _ in acts:
            src, dst = (s - 1, s + 1) if k == "F" else (s + 1, s - 1)
            n += sum(1 for peer in (src, dst) if 0 <= peer <= last and peer % p != s % p)
        out[pos] = n
    return out


def overhead_delta_ns(host_ns: dict, ranks: list, rec: dict, new: dict) -> dict:
    """Per rank id, what the new plan adds to the host work between two actions (ns, may be < 0):
    (new transfers per gap - recorded transfers per gap) x the rank's host cost per transfer.
    ``rec`` / ``new``: rank position -> (transfers per step, actions per step). The recorded work
    between actions already holds the recorded transfers, so only the change per gap is added."""
    out = {}
    for pos, rank in enumerate(ranks):
        (n_rec, a_rec), (n_new, a_new) = rec[pos], new[pos]
        per_gap = n_new / max(a_new - 1, 1) - n_rec / max(a_rec - 1, 1)
        out[rank] = int(round(per_gap * host_ns.get(rank, 0)))
    return out
