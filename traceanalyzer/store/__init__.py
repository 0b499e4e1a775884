"""The store: Hive-partitioned Parquet, one manifest as the commit point, DuckDB views over it."""
from .files import open_store

__all__ = ["open_store"]
