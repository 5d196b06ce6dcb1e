"""UVM caching (issue 34 item 3): hit rates from access-count bins, the memory of a cached table, the rule that
caches what HBM cannot hold, every sharder planning through it, and the backends' prices."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dreamshard.caching import LOAD_FACTORS, choose_caching, hit_rate, load_factor_for
from dreamshard.errors import DreamShardError, InfeasibleTaskError, InvalidPlanError
from dreamshard.memory import GB, MemoryModel
from dreamshard.plan import Plan, Shard, device_memory_bytes, validate_plan
from dreamshard.sharders import HEURISTICS, LEARNED
from dreamshard.tables import NUM_BINS, Table
from dreamshard.tasks import Device, Task
from helpers import analytic

UVM = ("fused", "fused_uvm_caching")
# half the rows a step reads are read once; a few are read hundreds of times
SKEWED = (0.5, 0.2, 0.1, 0.08, 0.05, 0.03, 0.02, 0.01, 0.005, 0.003, 0.001, 0.001, 0, 0, 0, 0, 0)
ONCE = tuple(float(k == 0) for k in range(NUM_BINS))  # every row read once a step: no hot rows


def test_hit_rates_come_from_the_bins():
    big = Table("big", 10_000_000, 64, 5.0, SKEWED)
    rates = [hit_rate(big, f, 4096) for f in LOAD_FACTORS]
    assert rates == sorted(rates) and all(0 < r <= 1 for r in rates)
    assert rates[0] > 0.9  # the hot rows a step reads many times fit a 1% cache
    assert hit_rate(big, 1.0, 4096) == pytest.approx(1.0)
    # no row read twice: nothing recurs from one step to the next, and the cache's rows beyond the last step's
    # serve their share of the others, about the load factor's share as without bins
    assert hit_rate(replace(big, bins=ONCE), 0.2, 4096) == pytest.approx(0.2, abs=0.005)
    assert hit_rate(replace(big, bins=None), 0.2, 4096) == 0.2
    assert load_factor_for(big, 4096) == LOAD_FACTORS[0]
    assert load_factor_for(replace(big, bins=None), 4096) == LOAD_FACTORS[-1]  # none reaches the target
    assert hit_rate(big, 0.0, 4096) == 0.0  # wholly in host memory (fused_uvm): no lookup finds a cache
    with pytest.raises(ValueError, match="load factor must be in"):
        hit_rate(big, 1.5, 4096)


def uvm_task(memory_gb: float = 2.0, **extra) -> Task:
    tables = (Table("huge", 20_000_000, 64, 5.0, SKEWED), Table("b", 1_000_000, 64, 3.0, SKEWED),
              Table("c", 100_000, 32, 2.0, SKEWED))
    return Task("uvm", tables, tuple(Device(int(memory_gb * GB)) for _ in range(2)), MemoryModel(batch_size=512),
                kernels=UVM, **extra)


def test_the_rule_caches_the_largest_tables_until_they_fit():
    task = uvm_task()  # 5.0 GB of tables on 2 x 2 GB
    assert choose_caching(task) == {"huge": LOAD_FACTORS[0]}
    assert choose_caching(replace(task, kernels=("fused",))) == {}  # not allowed
    assert choose_caching(uvm_task(memory_gb=4.0)) == {}  # fits without
    assert "huge" not in choose_caching(uvm_task(uncached=("huge",)))
    assert "huge" not in choose_caching(uvm_task(whole=("huge",)))
    with pytest.raises(ValueError, match="kernels must include 'fused'"):
        replace(task, kernels=("fused_uvm_caching",))


def test_a_cached_shard_holds_its_load_factors_share_and_the_caches_bookkeeping():
    task = uvm_task()
    huge = task.tables[0]
    full = task.shard_bytes(huge)
    cached = task.shard_bytes(huge, cache=0.1)
    buffers = full - 20_000_000 * 64 * 4
    assert cached == round(20_000_000 * 64 * 4 * 0.1) + 20_000_000 * (4 + 0.1 * 16) + buffers
    plan = Plan(2, (Shard("huge", 0, 0, 64, cache=0.1), Shard("b", 1, 0, 64), Shard("c", 1, 0, 32)))
    validate_plan(task, plan)
    assert device_memory_bytes(task, plan)[0] == cached
    assert Plan.from_dict(plan.to_dict()) == plan and plan.to_dict()["shards"][0]["cache_load_factor"] == 0.1
    with pytest.raises(InvalidPlanError, match="allows kernels fused only"):
        validate_plan(replace(task, kernels=("fused",)), plan)
    mixed = Plan(2, (Shard("huge", 0, 0, 32, cache=0.1), Shard("huge", 1, 32, 64, cache=0.2), Shard("b", 1, 0, 64),
                     Shard("c", 1, 0, 32)))
    with pytest.raises(InvalidPlanError, match="cached with load factors"):
        validate_plan(task, mixed)


def any_sharder(name: str, depth: int):
    from test_pieces import any_sharder

    return any_sharder(name, depth)


@pytest.mark.parametrize("name", HEURISTICS + LEARNED)
def test_every_sharder_of_ours_plans_tables_hbm_cannot_hold(name):
    task = uvm_task()
    plan = any_sharder(name, depth=2).shard(task)
    validate_plan(task, plan)
    assert {s.cache for s in plan.shards if s.table == "huge"} == {LOAD_FACTORS[0]}
    assert all(s.cache is None for s in plan.shards if s.table != "huge")
    with pytest.raises(InfeasibleTaskError, match="tables need"):
        any_sharder(name, depth=2).shard(replace(task, kernels=("fused",)))


def test_cache_misses_cost_host_memory_reads():
    """The analytic model: a cached table costs more than in HBM, the more the fewer its lookups hit."""
    backend = analytic(batch_size=1024)
    task = uvm_task(memory_gb=8.0)
    rest = (Shard("b", 1, 0, 64), Shard("c", 1, 0, 32))
    in_hbm = backend.plan_cost(task, Plan(2, (Shard("huge", 0, 0, 64), *rest))).devices[0].fwd_ms
    skewed = backend.plan_cost(task, Plan(2, (Shard("huge", 0, 0, 64, cache=0.01), *rest))).devices[0].fwd_ms
    flat_task = replace(task, tables=(replace(task.tables[0], bins=ONCE), *task.tables[1:]))
    flat = backend.plan_cost(flat_task, Plan(2, (Shard("huge", 0, 0, 64, cache=0.01), *rest))).devices[0].fwd_ms
    assert in_hbm < skewed < flat


def test_fbgemm_on_cpu_refuses_to_time_a_cached_table():
    pytest.importorskip("fbgemm_gpu")
    from dreamshard.data.lookups import GeneratedLookups
    from dreamshard.hardware.fbgemm import FbgemmBackend, FbgemmConfig, operator_groups

    task = uvm_task(memory_gb=8.0)
    shards = [Shard("c", 0, 0, 32), Shard("b", 0, 0, 64, cache=0.1)]
    assert [[s.table for s in g] for g in operator_groups(task, shards)] == [["c"], ["b"]]  # a cache per operator
    backend = FbgemmBackend(GeneratedLookups(seed=0), FbgemmConfig(batch_size=16, warmup=0, iterations=1))
    with pytest.raises(DreamShardError, match="UVM-cached .fused_uvm_caching., a CUDA kernel"):
        backend.compute_cost(task, shards)


def test_generated_bins_give_a_hit_rate_between_the_extremes():
    rng = np.random.default_rng(0)
    bins = tuple(float(x) for x in rng.dirichlet(np.ones(NUM_BINS)))
    t = Table("t", 1_000_000, 16, 10.0, bins)
    assert 0.05 <= hit_rate(t, 0.05, 2048) <= 1.0


def simulated_lru(batches: list[np.ndarray], rows: int, load_factor: float) -> float:
    """The share of lookups an LRU cache of load_factor x rows rows finds, each step's rows brought in after its
    lookups (FBGEMM prefetches a step's rows, evicting the least recently used; the rows of one step tie, and a
    cache too small for them keeps a share of each): the mean over the second half of 4 passes over `batches`."""
    capacity = load_factor * rows
    last = np.full(rows, -1)
    found = []
    steps = 4 * len(batches)
    for step in range(steps):
        ids, counts = np.unique(batches[step % len(batches)], return_counts=True)
        used = np.sort(last[last >= 0])[::-1]  # last-use steps, most recent first
        if used.size <= capacity:
            cutoff, share_at_cutoff = -1, 1.0
        else:
            cutoff = used[int(capacity)]  # the step whose rows only partly stay
            share_at_cutoff = (capacity - (used > cutoff).sum()) / (used == cutoff).sum()
        seen = last[ids]
        cached = np.where(seen > cutoff, 1.0, np.where((seen == cutoff) & (seen >= 0), share_at_cutoff, 0.0))
        if step >= steps // 2:
            found.append(float((cached * counts).sum() / counts.sum()))
        last[ids] = step
    return float(np.mean(found))


@pytest.mark.parametrize("alpha", [0.6, 1.0, 1.2])
def test_hit_rates_follow_an_lru_cache_on_a_stream_of_batches(alpha):
    """The oracle: an LRU simulation of 8 batches split from one draw (the same hot rows, fresh draws). A cache that
    held a step's hottest rows (the model before) was 0.2-0.8 too high here at load factors 0.01-0.05."""
    from dreamshard.data.dlrm import TableProfile, generate_lookups, table_statistics

    rows, pooling, batch = 200_000, 20.0, 8192
    ids, lengths = generate_lookups(TableProfile(rows, pooling, alpha), 8 * batch, 0)
    ends = np.concatenate([[0], np.cumsum(lengths)])[::batch]
    batches = [ids[ends[i]:ends[i + 1]] for i in range(8)]
    table = Table("t", rows, 64, pooling, tuple(table_statistics(batches[0], lengths[:batch]).bins))
    for factor in (0.01, 0.05, 0.2):
        assert hit_rate(table, factor, batch) == pytest.approx(simulated_lru(batches, rows, factor), abs=0.05), factor
