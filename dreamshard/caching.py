"""UVM caching (TorchRec's fused_uvm_caching kernel): a table's weights in host memory, a cache of rows in HBM.

A cached table takes on its device a `load_factor` share of its weights and optimizer state, FBGEMM's cache
bookkeeping (4 bytes a row and 16 a cache slot, as TorchRec's storage estimator counts it) and the usual
buffers: Task.shard_bytes counts them (dreamshard.tasks holds the kernels' names and a cached shard's bytes,
below this module, which chooses for a task). The lookups the cache serves (its hit rate) are priced from the
table's access-count bins: the cache holds load_factor x rows rows, the ones the last steps read (LRU), and the
hit rate is the share of a step's lookups it finds there (`hit_rate`). Which tables are cached, and how much:
`choose_caching`, called by `with_pieces` for tasks whose kernels allow it.
"""
from __future__ import annotations

from dataclasses import replace

from dreamshard.tables import NUM_BINS, Table
from dreamshard.tasks import HOST_KERNEL, UVM_KERNEL, Task

DEFAULT_LOAD_FACTOR = 0.2  # TorchRec's default cache load factor (its planner's UVM_CACHING_RATIO)
# the load factors `choose_caching` tries, smallest first: the smallest whose cache serves HIT_TARGET of the lookups
LOAD_FACTORS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
HIT_TARGET = 0.9
CACHE_FILL = 0.9  # choose_caching caches tables until they need at most this share of the devices' memory
# the shares tried in turn when the pieces of the tables a share leaves in device memory do not pack
CACHE_FILLS = (CACHE_FILL, 0.6, 0.3, 0.0)
# a bin's representative access count: bin 0 holds the rows read once, bin 1 those read twice, bin k >= 2 the
# counts in (2^(k-1), 2^k], represented by their midpoint (the bin's upper end counted hot rows too hot)
_BIN_COUNTS = [1.0, 2.0] + [0.75 * 2.0**k + 0.5 for k in range(2, NUM_BINS)]


def hit_rate(table: Table, load_factor: float, batch_size: int) -> float:
    """Share of `table`'s lookups a step of `batch_size` samples finds in a cache of `load_factor` x rows rows,
    as FBGEMM's LRU cache (its default, and TorchRec's) keeps them: each step brings the rows it reads into the
    cache, evicting the least recently used, so the cache holds the rows of the last steps, not the hottest ones.
    From the bins: a step reads U distinct rows (its lookups over their mean count); the share of its lookups
    whose row the step before read too is 1 - N1 / lookups (Good-Turing: the rows read once estimate the mass of
    rows not seen). A cache smaller than U holds that share of the last step's rows; a larger one holds them all
    and spreads the rest over the other rows. Checked against a simulated LRU (tests/unit/test_caching.py; why:
    results/gpu/README.md, 2026-11-27). Without bins every row is alike: the hit rate is the load factor."""
    if not 0 <= load_factor <= 1:
        raise ValueError(f"table {table.name!r}: cache load factor must be in [0, 1], got {load_factor!r}")
    if load_factor == 0:  # wholly in host memory (fused_uvm): every lookup goes there
        return 0.0
    if table.bins is None or sum(table.bins) == 0 or table.pooling_factor == 0 or batch_size == 0:
        return float(load_factor)
    total = sum(table.bins)
    shares = [b / total for b in table.bins]
    mean_count = sum(s * c for s, c in zip(shares, _BIN_COUNTS))
    lookups = table.pooling_factor * batch_size
    read = min(float(table.rows), lookups / mean_count)  # distinct rows a step reads
    seen = max(0.0, 1.0 - shares[0] / mean_count)  # lookups of rows the step before read (N1 / lookups unseen)
    room = load_factor * table.rows
    if room >= table.rows:
        return 1.0
    if room <= read:
        return room / read * seen
    return min(1.0, seen + (room - read) / (table.rows - read) * (1.0 - seen))


def load_factor_for(table: Table, batch_size: int) -> float:
    """The smallest of LOAD_FACTORS whose cache serves HIT_TARGET of the lookups (hit_rate), else the largest."""
    for factor in LOAD_FACTORS:
        if hit_rate(table, factor, batch_size) >= HIT_TARGET:
            return factor
    return LOAD_FACTORS[-1]


def choose_caching(task: Task, fill: float = CACHE_FILL) -> dict[str, float]:
    """Table name -> load factor of the tables to keep in host memory, cached: none unless the task's kernels allow
    UVM caching and its tables need more than CACHE_FILL of all devices' memory; then the tables with the fewest
    lookups per byte first (the largest of equals first), each at `load_factor_for` (hit rates at the memory
    model's global batch), until they need no more; when all of them cached still need more, their caches shrink
    in the same order. Tables with constraints (pin, avoid, group, whole, uncached) and sequence tables are never
    cached. Tables that must be cached (Task.must_cache) are, first; a load factor the task gives a table
    (Task.cache_factors) is the one it is cached at. (`with_pieces` asks only when the task cannot be planned in
    device memory, or when some table must be cached.)"""
    caching, host = UVM_KERNEL in task.kernels, HOST_KERNEL in task.kernels
    if not (caching or host):
        return {}
    have = fill * sum(task.capacities())
    need = sum(task.shard_bytes(t) for t in task.tables)
    given = dict(task.cache_factors)  # load factors the user's constraints fix: never shrunk
    fixed = task.never_cut() | set(task.avoided()) | set(task.must_cache)
    batch = task.memory.batch_size * task.num_devices
    by_name = {t.name: t for t in task.tables}
    uncached, never_host = set(task.uncached), set(task.never_host)

    def may_cache(t: Table) -> bool:
        return caching and t.name not in uncached

    def may_host(t: Table) -> bool:
        return host and t.name not in never_host

    def first_factor(t: Table) -> float:  # a cache if the table may have one, else wholly in host memory
        if t.name in given:
            return given[t.name]
        return load_factor_for(t, batch) if may_cache(t) else 0.0

    # the tables whose kernels keep them in host memory, whatever the room
    chosen: dict[str, float] = {n: first_factor(by_name[n]) for n in task.must_cache}

    def saving(t: Table, factor: float) -> int:
        return task.shard_bytes(t) - task.shard_bytes(replace(t, cache_load_factor=factor))

    def traffic(t: Table) -> tuple[float, int, str]:
        size = task.shard_bytes(t)
        return t.pooling_factor * t.features / size, -size, t.name

    need -= sum(saving(by_name[n], f) for n, f in chosen.items())
    candidates = sorted((t for t in task.tables if t.name not in fixed and not t.sequence
                         and (may_cache(t) or may_host(t))), key=traffic)
    for t in candidates:
        if need <= have:
            break
        chosen[t.name] = first_factor(t)
        need -= saving(t, chosen[t.name])
    # still too much: smaller caches, in the same order, down the ladder of LOAD_FACTORS
    for name in [n for n in chosen if n not in given]:
        for factor in reversed([f for f in LOAD_FACTORS if f < chosen[name]]):
            if need <= have:
                return chosen
            t = by_name[name]
            need -= saving(t, factor) - saving(t, chosen[name])
            chosen[name] = factor
    # still too much: wholly in host memory (fused_uvm), in the same order, where the kernels allow it
    for t in [by_name[n] for n in chosen] + [t for t in candidates if t.name not in chosen]:
        if need <= have:
            break
        if t.name in given or not may_host(t) or chosen.get(t.name) == 0.0:
            continue
        need -= saving(t, 0.0) - (saving(t, chosen[t.name]) if t.name in chosen else 0)
        chosen[t.name] = 0.0
    return chosen
