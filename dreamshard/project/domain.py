"""The domain, for the stages, benchmarks, experiments and tools: errors, files, tables, tasks, plans, the memory
model, the limits (the library's core: dreamshard.errors, io, limits, memory, tables, tasks, plan, placement)."""
from __future__ import annotations

from dreamshard.errors import DataFormatError, DreamShardError, InfeasibleTaskError
from dreamshard.io import atomic_path, write_parquet, write_text
from dreamshard.limits import MAX_TIME_LIMIT, SEARCH_SCALE
from dreamshard.memory import GB, MemoryModel
from dreamshard.placement import table_sizes
from dreamshard.plan import Plan, Shard
from dreamshard.tables import BIN_COLUMNS, TABLE_STATS_SCHEMA, Table, access_count_bins, read_tables_file
from dreamshard.tasks import Task, read_tasks, stats_table, table_dims, table_pool, tasks_to_arrow

__all__ = [
    "BIN_COLUMNS", "GB", "MAX_TIME_LIMIT", "SEARCH_SCALE", "TABLE_STATS_SCHEMA", "DataFormatError", "DreamShardError",
    "InfeasibleTaskError",
    "MemoryModel", "Plan", "Shard", "Table", "Task", "access_count_bins", "atomic_path", "read_tables_file",
    "read_tasks", "stats_table", "table_dims", "table_pool", "table_sizes", "tasks_to_arrow", "write_parquet", "write_text",
]
