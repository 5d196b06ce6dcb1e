"""Tables larger than any device: cut into row pieces that the sharders place as tables.

The rule: a table whose bytes exceed the largest device's capacity is cut by rows into the
fewest pieces k whose largest piece fits that device, rows shared as evenly as possible
(the first rows % k pieces get one row more). Rows, not columns: a row piece carries
exactly its own rows' weights and optimizer state (row-wise state is per row), so the
pieces' bytes add up to the table's, whatever the optimizer, while column slices would each
carry the per-row state again. A piece is a table of its rows with the share of the
table's lookups its rows get (pooling x piece rows / rows: hot rows are scattered over a
table) and the table's access-count bins. If a single row is larger than every device, no
plan exists, and the error says so.

`with_pieces(task, shard_whole)` is the one place this happens: every sharder of ours plans
through it, so each places pieces by its own rule, as it places tables, and the plan maps
them back to row ranges of the user's tables.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from dreamshard.errors import InfeasibleTaskError
from dreamshard.memory import GB
from dreamshard.plan import Plan, Shard, validate_plan
from dreamshard.tables import Table
from dreamshard.tasks import Task


def piece_count(table: Table, task: Task, capacity: int) -> int:
    """The fewest equal row pieces of `table` whose largest fits in `capacity` bytes (1: no cut)."""
    if task.memory.shard_bytes(table.rows, table.dim) <= capacity:
        return 1
    row = task.memory.shard_bytes(1, table.dim)
    if row > capacity:
        raise InfeasibleTaskError(
            f"task {task.name!r}: table {table.name!r}: a single row ({table.dim} dims) takes {row} bytes, more than "
            f"any device holds ({capacity} bytes, {capacity / GB:.3f} GB): no plan exists")
    k = math.ceil(task.memory.shard_bytes(table.rows, table.dim) / capacity)
    while task.memory.shard_bytes(math.ceil(table.rows / k), table.dim) > capacity:
        k += 1
    return k


def row_ranges(rows: int, k: int) -> list[tuple[int, int]]:
    """k consecutive ranges covering [0, rows), sizes differing by at most one row."""
    base, extra = divmod(rows, k)
    out, start = [], 0
    for i in range(k):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def cut_oversized(task: Task) -> tuple[Task, dict[str, tuple[str, int, int]]]:
    """The task with every table too large for any device replaced by its row pieces, and
    piece name -> (table, row_start, row_end). The task itself when nothing needs cutting."""
    capacity = max(d.memory_bytes for d in task.devices)
    tables: list[Table] = []
    pieces: dict[str, tuple[str, int, int]] = {}
    for t in task.tables:
        k = piece_count(t, task, capacity)
        if k == 1:
            tables.append(t)
            continue
        for start, end in row_ranges(t.rows, k):
            name = f"{t.name}[rows {start}:{end}]"
            pieces[name] = (t.name, start, end)
            tables.append(replace(t, name=name, rows=end - start, pooling_factor=t.pooling_factor * (end - start) / t.rows))
    if not pieces:
        return task, {}
    return Task(task.name, tuple(tables), task.devices, task.memory, task.family), pieces


def with_pieces(task: Task, shard_whole: Callable[[Task], Plan]) -> Plan:
    """`shard_whole`'s plan for `task`, its oversized tables cut into row pieces first (see the module)."""
    cut, pieces = cut_oversized(task)
    if not pieces:
        return shard_whole(task)
    plan = shard_whole(cut)
    shards = []
    for s in plan.shards:
        if s.table not in pieces:
            shards.append(s)
            continue
        table, start, end = pieces[s.table]
        p0, p1 = s.rows(end - start)
        shards.append(Shard(table, s.device, s.col_start, s.col_end, start + p0, start + p1))
    out = Plan(plan.num_devices, tuple(shards))
    validate_plan(task, out)
    return out
