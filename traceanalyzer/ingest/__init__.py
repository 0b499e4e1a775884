"""Ingest: every input file of a run into the store's canonical tables, in one atomic commit.

The modules, in the order one trace file passes through them:

- :mod:`.batch` -- finds the inputs, parses each in a worker, checks the batch, commits it;
- :mod:`.kineto` -- one Kineto JSON trace -> per-rank tables (reader, exact time parsing, build);
- :mod:`.comms` -- communication normalised from every dialect into ``comms`` (links the Flight
  Recorder's sequence ids through :mod:`.flight_recorder`);
- :mod:`.p2p_groups` -- gloo p2p ops on subgroups, resolved across the ranks of the batch;
- :mod:`.sidecars` -- per-process inputs (Flight Recorder dumps, :mod:`.nccl` logs and plugin output);
- :mod:`.safe_pickle` -- the restricted unpickler every pickle goes through.

Light on purpose: ``traceanalyzer.ingest`` the function (:func:`.batch.ingest`) is bound in the
top-level package, which must not load pyarrow just to start the CLI.
"""
