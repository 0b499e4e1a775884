"""Export: the stored events (and the replay's predicted timeline) as a Chrome/Perfetto trace."""
from .trace import export_trace, write_trace

__all__ = ["export_trace", "write_trace"]
