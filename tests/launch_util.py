"""The tests launch real torchrun jobs through the package's own launcher."""
from traceanalyzer.workloads.launch import REPO_ROOT, Launch, LaunchError, launch  # noqa: F401
