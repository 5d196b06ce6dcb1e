"""Data-parallel tables: a copy of a small table on every device, chosen before the other tables are placed.

A data-parallel table (TorchRec's data_parallel) looks up each device's own samples where they are, so it sends
no pooled outputs through the all-to-all; instead its dense gradient is all-reduced every step. The rule, for a
task whose sharding allows "data": a table is data-parallel when that all-reduce moves no more bytes per device
than the all-to-all it spares (rows x bytes per weight <= features x global batch x 4: TorchRec's outputs are
fp32) and the copies fit on every device. Tables with constraints (pins, groups, avoid, whole, model_parallel)
and sequence tables stay model-parallel; a table whose own kinds allow data-parallel alone is always replicated.
`with_replicas` is called by `with_pieces`, so every sharder of ours plans through it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from dreamshard.errors import InfeasibleTaskError
from dreamshard.memory import GB
from dreamshard.plan import Plan, Shard, validate_plan
from dreamshard.tables import Table
from dreamshard.tasks import Task

OUTPUT_BYTES = 4  # a pooled output element as TorchRec's all-to-all sends it (fp32)


def spares_traffic(task: Task, table: Table) -> bool:
    """Does all-reducing `table`'s gradient move no more bytes per device than the all-to-all of its outputs?"""
    global_batch = task.memory.batch_size * task.num_devices
    return table.rows * task.memory.bytes_per_weight(table.precision) <= table.features * global_batch * OUTPUT_BYTES


def data_parallel_tables(task: Task, rule: Callable[[Task, Table], bool] | None = None) -> list[Table]:
    """The tables the rule of the module docstring (or `rule`: which tables copies serve better) makes
    data-parallel, smallest first, as many as fit every device with half its capacity left for the others, beside
    those that must be; none without "data" in the task's sharding, with one device, or with no batch size in the
    memory model (no traffic to compare)."""
    if "data" not in task.sharding or task.num_devices < 2:
        return []
    forced = must_replicate(task)
    if task.memory.batch_size == 0:
        return forced
    fixed = task.never_cut() | set(task.avoided()) | {t.name for t in forced}
    candidates = sorted((task.shard_bytes(t, replica=True), t.name, t) for t in task.tables
                        if t.name not in fixed and task.allows(t.name, "data") and not t.sequence
                        and (rule or spares_traffic)(task, t))
    room = min(task.capacities()) // 2
    chosen, used = list(forced), sum(task.shard_bytes(t, replica=True) for t in forced)
    for need, _, t in candidates:
        if used + need > room:
            break
        chosen.append(t)
        used += need
    return chosen


def must_replicate(task: Task) -> list[Table]:
    """The tables whose own kinds allow data-parallel alone (TorchRec's constraint sharding_types=[data_parallel]):
    data-parallel whatever their size, on every device (none with one device: a whole table is its replica)."""
    if task.num_devices < 2:
        return []
    return [t for t in task.tables if task.kinds_of(t.name) == ("data",)]


def replica_shards(table: Table, num_devices: int) -> list[Shard]:
    """`table` data-parallel: a whole replica on every device."""
    return [Shard(table.name, d, 0, table.dim, replica=True) for d in range(num_devices)]


def with_replicas(task: Task, replicated: list[Table], plan_rest: Callable[[Task], Plan]) -> Plan:
    """`replicated` data-parallel, the other tables planned by `plan_rest` on what the copies leave of each
    device (Task.held)."""
    names = {t.name for t in replicated}
    shards = [s for t in replicated for s in replica_shards(t, task.num_devices)]
    rest = [t for t in task.tables if t.name not in names]
    held = sum(task.shard_bytes(t, replica=True) for t in replicated)
    if held > min(task.capacities()):
        raise InfeasibleTaskError(f"task {task.name!r}: data-parallel copies of {', '.join(sorted(names)[:3])}"
                                  f"{', ...' if len(names) > 3 else ''} take {held / GB:.3f} GB on every device, "
                                  f"more than the smallest holds ({min(task.capacities()) / GB:.3f} GB)")
    if rest:
        base = task.held or (0,) * task.num_devices
        sub = replace(task.derived(rest, {}), held=tuple(h + held for h in base))
        shards = list(plan_rest(sub).shards) + shards
    plan = Plan(task.num_devices, tuple(shards))
    validate_plan(task, plan)
    return plan
