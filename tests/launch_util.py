"""The tests launch real torchrun jobs through the package's own launcher."""
from traceanalyzer.workloads.launch import Launch, LaunchError, launch  # noqa: F401
