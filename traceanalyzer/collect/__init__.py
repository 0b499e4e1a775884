"""Collectors: run inside a training job and write what the analyzer ingests.

    from traceanalyzer import collect
    with collect.profile(out_dir, run="myrun", ground_truth={...}) as prof:
        for batch in data:
            train_step(batch)
            prof.step()

torch is imported only when a collector runs, so importing this package
(and `traceanalyzer`) works without torch.
"""

from traceanalyzer.collect.fr_dump import dump_flight_recorder, enable_flight_recorder
from traceanalyzer.collect.manifest import allowed_env
from traceanalyzer.collect.op_timeline import OpTimeline
from traceanalyzer.collect.profiler import Collector, profile

__all__ = ["Collector", "OpTimeline", "allowed_env", "dump_flight_recorder", "enable_flight_recorder", "profile"]
