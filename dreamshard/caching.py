"""UVM caching (TorchRec's fused_uvm_caching kernel): a table's weights in host memory, its hottest rows in HBM.

A cached table takes on its device a `load_factor` share of its weights and optimizer state, FBGEMM's cache
bookkeeping (4 bytes a row and 16 a cache slot, as TorchRec's storage estimator counts it) and the usual
buffers. The lookups the cache serves (its hit rate) are priced from the table's access-count bins: the cache
holds the load_factor x rows most-accessed rows, and the hit rate is their share of the lookups. Which tables
are cached, and how much: `choose_caching`, called by `with_pieces` for tasks whose kernels allow it.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from dreamshard.tables import NUM_BINS, Table

if TYPE_CHECKING:
    from dreamshard.tasks import Task

UVM_KERNEL = "fused_uvm_caching"
KERNELS = ("fused", UVM_KERNEL)  # Task.kernels: "fused" (weights in HBM) always; UVM caching when asked for
DEFAULT_LOAD_FACTOR = 0.2  # TorchRec's default cache load factor (its planner's UVM_CACHING_RATIO)
# the load factors `choose_caching` tries, smallest first: the smallest whose cache serves HIT_TARGET of the lookups
LOAD_FACTORS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
HIT_TARGET = 0.9
CACHE_FILL = 0.9  # choose_caching caches tables until they need at most this share of the devices' memory
_BIN_COUNTS = [2.0**k for k in range(NUM_BINS)]  # a bin's representative access count (bin 0: once)


def hit_rate(table: Table, load_factor: float, batch_size: int) -> float:
    """Share of `table`'s lookups served by a cache of its `load_factor` x rows most-accessed rows, with
    `batch_size` samples a step. The bins say how a step's lookups fall on the rows it reads: rows read more than
    once a step (bins 1..16) are the hot ones, cached first, hottest first; the lookups of rows read once (bin 0)
    are the tail, spread evenly over every other row of the table, so the cache's remaining room serves its
    share of them. Without bins every row is alike: the hit rate is the load factor."""
    if not 0 < load_factor <= 1:
        raise ValueError(f"table {table.name!r}: cache load factor must be in (0, 1], got {load_factor!r}")
    if table.bins is None or sum(table.bins) == 0 or table.pooling_factor == 0 or batch_size == 0:
        return float(load_factor)
    total = sum(table.bins)
    shares = [b / total for b in table.bins]
    mean_count = sum(s * c for s, c in zip(shares, _BIN_COUNTS))
    read = min(float(table.rows), table.pooling_factor * batch_size / mean_count)  # distinct rows read a step
    lookups = read * mean_count
    room = load_factor * table.rows
    hits = 0.0
    for share, count in sorted(zip(shares[1:], _BIN_COUNTS[1:]), key=lambda sc: -sc[1]):  # the hot rows
        rows = share * read
        hits += min(rows, room) * count
        room = max(0.0, room - rows)
    tail_rows = table.rows - read * (1 - shares[0])  # every row not hot, read once or not at all this step
    if tail_rows > 0:
        hits += shares[0] * read * min(1.0, room / tail_rows)
    return min(1.0, hits / lookups)


def load_factor_for(table: Table, batch_size: int) -> float:
    """The smallest of LOAD_FACTORS whose cache serves HIT_TARGET of the lookups (hit_rate), else the largest."""
    for factor in LOAD_FACTORS:
        if hit_rate(table, factor, batch_size) >= HIT_TARGET:
            return factor
    return LOAD_FACTORS[-1]


def cached_weight_bytes(weight_bytes_of_table: int, rows: int, width: int, table: Table, load_factor: float) -> int:
    """HBM bytes of the weights of a rows x width shard of a cached `table`, as TorchRec's storage estimator counts
    them: the table's weights times the load factor (rounded), the shard's share of it (rounded up)."""
    return math.ceil(round(weight_bytes_of_table * load_factor) * rows * width / (table.rows * table.dim))


def cache_state_bytes(rows: int, load_factor: float) -> int:
    """FBGEMM's cache bookkeeping of a shard of `rows` rows, as TorchRec counts it: 4 bytes a row, 16 a slot."""
    return math.ceil(rows * (4 + load_factor * 16))


def choose_caching(task: Task) -> dict[str, float]:
    """Table name -> load factor of the tables to keep in host memory, cached: none unless the task's kernels allow
    UVM caching and its tables need more than CACHE_FILL of all devices' memory; then the tables with the fewest
    lookups per byte first (the largest of equals first), each at `load_factor_for` (hit rates at the memory
    model's global batch), until they need no more; when all of them cached still need more, their caches shrink
    in the same order. Tables with constraints (pin, avoid, group, whole, uncached) and sequence tables are never
    cached. (`with_pieces` asks only when the task cannot be planned in device memory.)"""
    if "fused_uvm_caching" not in task.kernels:
        return {}
    have = CACHE_FILL * sum(task.capacities())
    need = sum(task.shard_bytes(t) for t in task.tables)
    fixed = task.never_cut() | set(task.avoided()) | set(task.uncached)
    batch = task.memory.batch_size * task.num_devices
    chosen: dict[str, float] = {}
    by_name = {t.name: t for t in task.tables}

    def saving(t: Table, factor: float) -> int:
        return task.shard_bytes(t) - task.shard_bytes(replace(t, cache_load_factor=factor))

    def traffic(t: Table) -> tuple[float, int, str]:
        size = task.shard_bytes(t)
        return t.pooling_factor * t.features / size, -size, t.name

    for t in sorted((t for t in task.tables if t.name not in fixed and not t.sequence), key=traffic):
        if need <= have:
            break
        chosen[t.name] = load_factor_for(t, batch)
        need -= saving(t, chosen[t.name])
    # still too much: smaller caches, in the same order, down the ladder of LOAD_FACTORS
    for name in list(chosen):
        for factor in reversed([f for f in LOAD_FACTORS if f < chosen[name]]):
            if need <= have:
                return chosen
            t = by_name[name]
            need -= saving(t, factor) - saving(t, chosen[name])
            chosen[name] = factor
    return chosen
