"""`torchrec_model`: our search over cuts and placements rated by TorchRec's perf model (no trained model).

Its rating of a plan must be TorchRec's own (each piece priced once per cut, summed per rank); it must beat or
match TorchRec's planner by that rating, and reach the optimum over cuts and placements on a task small enough
to enumerate."""
from __future__ import annotations

import itertools
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("torchrec", reason="torchrec is not installed (see docs/torchrec.md)")

from dreamshard.errors import InfeasibleTaskError  # noqa: E402
from dreamshard.interop.torchrec import quiet_torchrec, table_layout, torchrec_perf_estimate  # noqa: E402
from dreamshard.memory import MemoryModel  # noqa: E402
from dreamshard.plan import validate_plan  # noqa: E402
from dreamshard.sharders import make_sharder  # noqa: E402
from dreamshard.sharders.pieces import Cut, cut_oversized, cut_task  # noqa: E402
from dreamshard.sharders.torchrec_model import ModelSearchConfig, _cuts_of, piece_prices  # noqa: E402
from dreamshard.tables import Table  # noqa: E402
from dreamshard.tasks import Device, Task  # noqa: E402
from helpers import brute_force_feasible  # noqa: E402

BATCH = 512


def task_of(seed: int, n: int, devices: int, gb: float, sharding=("table", "column", "row", "data")) -> Task:
    rng = random.Random(seed)
    tables = [Table(f"t{i}", rng.choice([50, 5_000, 200_000, 3_000_000]), rng.choice([32, 64, 128]),
                    rng.choice([1.0, 3.0, 10.0, 40.0, 100.0])) for i in range(n)]
    return replace(Task.uniform(f"trm{seed}", tables, devices, gb, MemoryModel(batch_size=BATCH)), sharding=sharding)


def rated_by_prices(task: Task, plan) -> float:
    """The plan's slowest rank by the search's own prices (each table's pieces at its layout's cut)."""
    prices = piece_prices(task, _cuts_of(task, ModelSearchConfig()), BATCH)
    load = np.zeros(task.num_devices)
    for i, t in enumerate(task.tables):
        shards = sorted((s for s in plan.shards if s.table == t.name), key=lambda s: (s.row_start, s.col_start))
        layout = table_layout(task, i, shards)
        cut = Cut(row_wise=True) if layout == "row_wise" else Cut(columns=len(shards))
        for s, price in zip(shards, prices[(t.name, cut)]):
            load[s.device] += price
    return float(load.max())


@pytest.mark.parametrize("seed,devices,gb", [(0, 4, 2.0), (1, 4, 0.6), (2, 8, 1.5)])
def test_its_rating_is_torchrecs_own_and_never_behind_torchrecs_planner(seed, devices, gb):
    task = task_of(seed, 14, devices, gb, sharding=("table", "column", "row"))
    plan = make_sharder("torchrec_model", batch_size=BATCH).shard(task)
    validate_plan(task, plan)
    with quiet_torchrec():
        ours = torchrec_perf_estimate(task, plan, BATCH).cost_ms
        assert rated_by_prices(task, plan) == pytest.approx(ours, rel=1e-9)  # pieces priced once: TorchRec's sum
        theirs = torchrec_perf_estimate(task, make_sharder("torchrec_full", batch_size=BATCH).shard(task),
                                        BATCH).cost_ms
    assert ours <= theirs * (1 + 1e-9), (ours, theirs)


def test_it_finds_the_optimum_over_cuts_and_placements_of_a_small_task():
    # one dominant table and two small ones on 2 devices: the optimum cuts the dominant one
    tables = [Table("big", 1_000_000, 64, 60.0), Table("a", 20_000, 32, 4.0), Table("b", 300, 32, 2.0)]
    task = replace(Task.uniform("dominant", tables, 2, 1.0, MemoryModel(batch_size=BATCH)),
                   sharding=("table", "column", "row"))
    options = _cuts_of(task, ModelSearchConfig())
    prices = piece_prices(task, options, BATCH)
    best = float("inf")
    for cuts in itertools.product(*(options[t.name] for t in task.tables)):
        chosen = {t.name: c for t, c in zip(task.tables, cuts) if not c.whole}
        cut, _ = cut_task(task, chosen)
        weights = [p for t, c in zip(task.tables, cuts) for p in prices[(t.name, c)]]
        pins = {n: d for n, d in cut.pins}
        for assignment in itertools.product(range(2), repeat=len(cut.tables)):
            if any(pins.get(t.name, d) != d for t, d in zip(cut.tables, assignment)):
                continue
            used = np.zeros(2)
            for t, d in zip(cut.tables, assignment):
                used[d] += cut.shard_bytes(t)
            if (used > np.array(cut.capacities())).any():
                continue
            load = np.zeros(2)
            np.add.at(load, list(assignment), weights)
            best = min(best, float(load.max()))
    plan = make_sharder("torchrec_model", batch_size=BATCH).shard(task)
    with quiet_torchrec():
        ours = torchrec_perf_estimate(task, plan, BATCH).cost_ms
    assert any(s.col_end - s.col_start < 64 or s.is_row_range for s in plan.shards if s.table == "big")
    assert ours == pytest.approx(best, rel=1e-9)
    bound = make_sharder("torchrec_model", batch_size=BATCH).bound_ms(task)
    assert 0 < bound <= best * (1 + 1e-9)  # a lower bound of the optimum


def two_hosts(task: Task, per_host: int) -> Task:
    """`task` with its devices named on hosts of `per_host` consecutive devices, row-wise over one host allowed."""
    devices = tuple(replace(d, host=f"h{i // per_host}") for i, d in enumerate(task.devices))
    return replace(task, devices=devices, sharding=(*task.sharding, "host"))


def test_across_hosts_a_table_row_wise_over_one_host_is_valid_exported_and_refused_where_not_allowed():
    from dreamshard.errors import InvalidPlanError
    from dreamshard.interop.torchrec import to_torchrec_module_plan
    from dreamshard.plan import Plan, Shard, host_blocks

    tables = [Table("t0", 10_001, 16, 4.0), Table("t1", 500, 16, 2.0)]
    task = two_hosts(Task.uniform("hosts", tables, 8, 1.0, MemoryModel(batch_size=BATCH)), 4)
    blocks = host_blocks(10_001, 4, 1)
    assert [d for d, _ in blocks] == [4, 5, 6, 7] and blocks[-1][1][1] == 10_001
    plan = Plan(8, tuple(Shard("t0", d, 0, 16, r0, r1) for d, (r0, r1) in blocks) + (Shard("t1", 2, 0, 16),))
    validate_plan(task, plan)
    assert table_layout(task, 0, sorted(plan.device_shards(4) + plan.device_shards(5) + plan.device_shards(6)
                                        + plan.device_shards(7), key=lambda s: s.row_start)) == "table_row_wise"
    module_plan = to_torchrec_module_plan(task, plan)  # TorchRec's own blocks checked against the plan's
    assert module_plan["t0"].sharding_type == "table_row_wise" and module_plan["t0"].ranks == [4, 5, 6, 7]
    with pytest.raises(InvalidPlanError, match="t0"):  # neither row-wise kind allowed
        validate_plan(replace(task, sharding=("table", "column")), plan)
    shifted = Plan(8, tuple(Shard("t0", d - 1, 0, 16, r0, r1) for d, (r0, r1) in blocks) + (Shard("t1", 2, 0, 16),))
    with pytest.raises(InvalidPlanError, match="t0"):  # blocks across two hosts are no host's layout
        validate_plan(replace(task, sharding=("table", "column", "host")), shifted)


def test_across_hosts_it_rates_at_or_above_its_bound_and_never_behind_torchrecs_planner():
    task = two_hosts(task_of(3, 14, 8, 1.0, sharding=("table", "column", "row", "data")), 4)
    sharder = make_sharder("torchrec_model", batch_size=BATCH)
    plan = sharder.shard(task)
    validate_plan(task, plan)
    with quiet_torchrec():
        ours = torchrec_perf_estimate(task, plan, BATCH).cost_ms
        theirs = torchrec_perf_estimate(task, make_sharder("torchrec_full", batch_size=BATCH).shard(task),
                                        BATCH).cost_ms
    assert sharder.bound_ms(task) <= ours * (1 + 1e-9)
    assert ours <= theirs * (1 + 1e-9), (ours, theirs)


def test_the_mlperf_model_on_8_ranks_of_16_gib_at_least_twice_as_fast_as_torchrecs_plan_by_its_model():
    # issue 34's target, by TorchRec's own perf and storage estimators (benchmarks/mlperf_dcnv2.py)
    from benchmarks import mlperf_dcnv2 as mlperf

    with quiet_torchrec():
        topo = mlperf.topology(8, 16.0)
        usable = mlperf.usable_hbm(topo, BATCH)
        theirs = mlperf.torchrec_row(mlperf.topology(8, 16.0), BATCH, usable, None)
        ours = mlperf.ours_row(mlperf.topology(8, 16.0), BATCH, usable, "torchrec_model", None)
    assert ours["fits_usable"] and ours["cpu_seconds"] < 10  # CPU time: the other test worker shares the cores
    assert theirs["max_rank_perf_ms"] / ours["max_rank_perf_ms"] >= 2.0, (ours, theirs)


def test_the_mlperf_model_on_2_hosts_of_8_ahead_of_torchrecs_plan_and_at_or_above_the_bound():
    # issue 50: across hosts, judged on the cluster TorchRec's plan is rated on (benchmarks/mlperf_dcnv2.py)
    from benchmarks import mlperf_dcnv2 as mlperf

    with quiet_torchrec():
        topo = mlperf.topology(16, 16.0, 8)
        usable = mlperf.usable_hbm(topo, BATCH)
        theirs = min(mlperf.torchrec_row(mlperf.topology(16, 16.0, 8), BATCH, usable, m)["max_rank_perf_ms"]
                     for m in (None, 64))
        ours = mlperf.ours_row(mlperf.topology(16, 16.0, 8), BATCH, usable, "torchrec_model", None)
    # planning's CPU time (the other test worker shares the cores and stretches wall time). Issue 50's 10 s target
    # is the benchmark's (benchmarks/mlperf_dcnv2.py, a quiet machine); here a guard with room for slower processors
    # (what it reads: results/make-test-time/)
    assert ours["fits_usable"] and ours["cpu_seconds"] < 15
    assert "table_row_wise/fused" in ours["kinds"]
    assert ours["bound_ms"] <= ours["max_rank_perf_ms"] and theirs / ours["max_rank_perf_ms"] >= 1.15, (ours, theirs)


@st.composite
def small_tasks(draw) -> Task:
    n, devices = draw(st.integers(1, 6)), draw(st.integers(1, 3))
    memory = draw(st.sampled_from([MemoryModel(), MemoryModel("fp16", "adam", batch_size=64)]))
    tables = tuple(Table(f"t{i}", rows=draw(st.integers(1, 5000)), dim=4 * draw(st.integers(1, 16)),
                         pooling_factor=draw(st.floats(0, 200, allow_nan=False))) for i in range(n))
    sizes = [memory.shard_bytes(t.rows, t.dim) for t in tables]
    scale = max(max(sizes), sum(sizes) / devices)  # capacities around the feasibility boundary
    caps = tuple(Device(int(scale * draw(st.floats(0.7, 1.4)))) for _ in range(devices))
    sharding = draw(st.sampled_from([("table", "column", "row"), ("table", "column", "row", "data"), ("table",)]))
    return replace(Task("prop", tables, caps, memory), sharding=sharding)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=small_tasks())
def test_its_plans_are_valid_whenever_the_pieces_of_the_first_cut_can_be_placed(task):
    try:
        feasible = brute_force_feasible(cut_oversized(task)[0])
    except InfeasibleTaskError:  # a single row larger than every device
        feasible = False
    outcomes = {}
    for name in ("torchrec_model", "size_lookup_greedy"):  # the same cuts: the same verdict as the other sharders
        try:
            validate_plan(task, make_sharder(name).shard(task))  # beyond the first cut, cut finer as every sharder may
            outcomes[name] = "plan"
        except InfeasibleTaskError:
            assert not feasible, name
            outcomes[name] = "infeasible"
    assert len(set(outcomes.values())) == 1, outcomes


def test_a_one_row_table_is_never_cut_row_wise():
    # found by the property test above: the one "block" of a 1-row table is the whole table, whose buffers the
    # plan counts as a whole table's; cut "row-wise" it was packed as a block's, and the plan overflowed
    tables = (Table("t2", 118, 8, 1.0), Table("t3", 1, 4, 2.0), Table("t0", 1, 4, 0.0))
    task = replace(Task("one-row", tables, (Device(9440), Device(9440)), MemoryModel("fp16", "adam", batch_size=64)),
                   sharding=("table", "column", "row"))
    for name in ("torchrec_model", "size_lookup_greedy"):
        with pytest.raises(InfeasibleTaskError):
            make_sharder(name).shard(task)


def test_a_time_limit_stops_the_moves_and_keeps_the_best_plan_found():
    from dreamshard.sharders.torchrec_model import TorchRecModelSharder

    task = task_of(3, 30, 8, 4.0)
    with quiet_torchrec():
        free = TorchRecModelSharder(512).shard(task)
        rushed = TorchRecModelSharder(512, time_limit=0.0).shard(task)  # the starts only: no move
    validate_plan(task, rushed)
    # the moves take it from the starts' 0.79 ms to 0.78 by TorchRec's model: without them it stays behind
    assert torchrec_perf_estimate(task, rushed, 512).cost_ms > torchrec_perf_estimate(task, free, 512).cost_ms * 1.01


def test_a_start_that_packs_whole_only_by_backing_up_is_kept_whole():
    # found by the property test above: no direct pass places these tables whole, a backing-up placement does,
    # and every finer cut packs worse (more buffers); the start cut everything row-wise and gave up
    tables = (Table("t0", 304, 20, 0.0), Table("t1", 496, 56, 17.0), Table("t2", 1, 4, 81.0),
              Table("t3", 117, 52, 0.0), Table("t4", 1594, 12, 120.0), Table("t5", 908, 64, 0.875))
    task = Task("prop", tables, (Device(787330), Device(659160)), MemoryModel("fp16", "adam", batch_size=64))
    with quiet_torchrec():
        validate_plan(task, make_sharder("torchrec_model").shard(task))
