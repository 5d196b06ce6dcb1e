"""The lower bound with row ranges (`row_splits`, dreamshard/evaluation/bounds.py) on the analytic backend.

Every plan of small tasks whose tables are whole, cut into two row halves or (with columns)
into two column halves, each part on either device, is costed: the bound must stay below the
optimum in both fusion regimes, while the bound for whole tables does not (row halves beat it).
Then the plans the sharders make for tasks with tables larger than a device (TorchRec's
row-wise blocks, column slices, both), and the helpers that read `row_splits` off plans.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from dreamshard.evaluation.bounds import (
    MIXED,
    ROW_PROBE_RATIO,
    SUB_ADDITIVE,
    additivity_ratio,
    column_splits_in,
    least_work,
    lower_bound,
    regime_of,
    row_probe_sizes,
    row_splits_of,
    work_terms,
)
from dreamshard.hardware.analytic import AnalyticBackend
from dreamshard.hardware.comm import dist_groups, dist_latency_ms, plan_traffic
from dreamshard.plan import Plan, Shard, validate_plan
from dreamshard.sharders import HEURISTICS, make_sharder
from dreamshard.tables import NUM_BINS, Table
from dreamshard.tasks import Task
from helpers import analytic, seeded

BATCH = 2048
REGIMES = ("super_additive", "sub_additive")


def row_ranges(rows: int, k: int) -> list[tuple[int, int]]:
    """k consecutive ranges covering [0, rows), sizes differing by at most one row."""
    base, extra = divmod(rows, k)
    out, start = [], 0
    for i in range(k):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def random_tables(rng: np.random.Generator, name: str, count: int, max_log_rows: float = 6.0) -> list[Table]:
    """Heavy-tailed tables (rows 1e2..10^max_log_rows, pooling lognormal around 7), most with access-count bins."""
    tables = []
    for i in range(count):
        bins = tuple(rng.dirichlet(np.full(NUM_BINS, 0.3)).tolist()) if rng.random() < 0.8 else None
        tables.append(Table(f"{name}/t{i}", int(10 ** rng.uniform(2, max_log_rows)),
                            int(rng.choice([4, 8, 16, 32, 64, 128])), float(rng.lognormal(math.log(7.0), 1.0)), bins))
    return tables


def cuts(t: Table, columns: bool) -> list[list[tuple[int, int | None, int, int]]]:
    """The ways the exhaustive check cuts a table: whole, two row halves, (with columns) two column halves;
    each part as (row_start, row_end or None, col_start, col_end)."""
    out: list[list[tuple[int, int | None, int, int]]] = [[(0, None, 0, t.dim)]]
    if t.rows >= 2:
        half = t.rows // 2
        out.append([(0, half, 0, t.dim), (half, t.rows, 0, t.dim)])
    if columns and t.dim >= 8:
        mid = t.dim // 2 // 4 * 4
        out.append([(0, None, 0, mid), (0, None, mid, t.dim)])
    return out


def halves(task: Task) -> dict[str, int]:
    """The row_splits of the exhaustive check: every table of 2+ rows, pieces of at least half its rows."""
    return {t.name: t.rows // 2 for t in task.tables if t.rows >= 2}


def exhaustive_with_splits(b: AnalyticBackend, task: Task, columns: bool) -> tuple[float, Plan, float]:
    """(optimum, its plan, the optimum over whole-table plans) over every plan whose tables are cut as
    `cuts` says, each part on any device; each device's shard set costed once."""
    n = task.num_devices
    options = [[tuple(Shard(t.name, d, c0, c1, r0, r1) for (r0, r1, c0, c1), d in zip(parts, devices))
                for parts in cuts(t, columns) for devices in itertools.product(range(n), repeat=len(parts))]
               for t in task.tables]
    compute: dict[tuple[Shard, ...], tuple[float, float]] = {}
    best, best_plan, whole = math.inf, None, math.inf
    for combo in itertools.product(*options):
        if combo[0][0].device != 0:
            continue  # identical devices: device names do not matter
        per_device = [tuple(s for option in combo for s in option if s.device == d) for d in range(n)]
        for shards in per_device:
            if shards not in compute:
                c = b.compute_cost(task, list(shards))
                compute[shards] = (c.fwd_ms, c.total_ms)
        fwd = np.array([compute[s][0] for s in per_device])
        plan = Plan(n, tuple(s for option in combo for s in option))
        fwd_comm, bwd_comm = b.communication_cost(fwd, plan_traffic(plan, task, b.topology))
        dists = sum(dist_latency_ms(dist_groups(plan, task), n, b.topology))  # the plan's lookup groups' dists
        cost = float((np.array([compute[s][1] for s in per_device]) + fwd_comm + bwd_comm).max()) + dists
        if cost < best:
            best, best_plan = cost, plan
        if all(len(option) == 1 and option[0].width == t.dim for option, t in zip(combo, task.tables)):
            whole = min(whole, cost)
    assert best_plan is not None
    return best, best_plan, whole


def measured_regime(b: AnalyticBackend, task: Task) -> str:
    return regime_of([additivity_ratio(b, task)])


# ---------------------------------------------------------------- the exhaustive check with row halves


@pytest.mark.parametrize("regime_name", REGIMES)
@pytest.mark.parametrize("columns", [False, True], ids=["rows", "rows+columns"])
def test_bound_below_the_optimum_over_plans_with_row_halves(regime_name, columns):
    rng = np.random.default_rng(11)
    b = analytic(regime_name, BATCH)
    gaps, whole_bound_broken = [], 0
    for k in range(5):
        task = Task.uniform(f"rows{k}", random_tables(rng, f"r{k}", 5 if not columns and k < 2 else 4), 2, 64.0)
        optimum, plan, whole = exhaustive_with_splits(b, task, columns)
        validate_plan(task, plan)
        assert b.plan_cost(task, plan).cost_ms == pytest.approx(optimum)  # the optimum is a real plan's cost
        regime = measured_regime(b, task)
        bound = lower_bound(b, task, regime, columns, halves(task))
        assert bound.total_ms <= optimum * (1 + 1e-9), (task.name, bound, optimum)
        for also in (MIXED, SUB_ADDITIVE):  # whichever regime the evaluate stage measures
            assert lower_bound(b, task, also, columns,
                               halves(task)).total_ms <= optimum * (1 + 1e-9)
        # pieces of any size (1 row): proven too, looser
        every_row = {t.name: 1 for t in task.tables}
        assert lower_bound(b, task, regime, columns, every_row).total_ms <= optimum * (1 + 1e-9)
        gaps.append(optimum / bound.total_ms)
        old = lower_bound(b, task, regime, columns)
        whole_bound_broken += old.total_ms > optimum * (1 + 1e-9)
        assert old.total_ms <= whole * (1 + 1e-9)  # the whole-table bound still holds for whole-table plans
    if not columns:
        assert whole_bound_broken >= 2  # why row_splits exists: row halves beat the whole-table bound
    assert max(gaps) < 1.3, gaps  # useful, not just valid (observed 1.02-1.2)


# One hot table of 4 columns (no column cut) dominates; on 2 devices its row halves are the best plan.
HOT = [Table("hot", 80_000, 4, 90.0)] + [Table(f"small{i}", 500, 4, 1.0) for i in range(3)]


@pytest.mark.parametrize("regime_name", REGIMES)
def test_a_hot_narrow_table_in_row_halves_beats_the_whole_table_bound_not_the_row_bound(regime_name):
    task = Task.uniform("hot", HOT, 2, 1.0)
    b = analytic(regime_name, BATCH)
    optimum, plan, whole = exhaustive_with_splits(b, task, columns=False)
    hot = sorted((s.rows(80_000), s.device) for s in plan.shards if s.table == "hot")
    assert [r for r, _ in hot] == [(0, 40_000), (40_000, 80_000)] and {d for _, d in hot} == {0, 1}
    assert optimum < 0.6 * whole
    regime = measured_regime(b, task)
    old = lower_bound(b, task, regime)
    new = lower_bound(b, task, regime, row_splits=halves(task))
    assert old.max_table_ms > optimum  # the hot table alone: no bound once it may be cut
    assert new.total_ms <= optimum
    assert new.total_ms > 0.85 * optimum
    # the busiest device of the hot table: at least half its work, plus one piece's transfer
    assert new.max_table_ms > 0.8 * optimum


# ---------------------------------------------------------------- the lemma: what a cut table's shards do at least

# tables whose work per row is least whole (few lookups: each piece's outputs dominate), in pieces of a few
# thousand rows (a working set of half the cache), or in the smallest pieces (many lookups, a large working set)
LEMMA_TABLES = [Table("light", 5_000, 32, 0.5), Table("mid", 400_000, 64, 8.0), Table("heavy", 1_000_000, 64, 20.0),
                HOT[0]]


def operator_ms(b: AnalyticBackend) -> float:
    """The analytic model's per-operator cost o: a launch in the forward and one in the backward."""
    return 2 * b.config.launch_us / 1000


def piece_work(b: AnalyticBackend, task: Task, rows: int, width: int, o: float,
               memo: dict[tuple[int, int], float]) -> float:
    """Single cost beyond o of `rows` rows x `width` columns of the task's one table."""
    if (rows, width) not in memo:
        t = task.tables[0]
        shard = Shard(t.name, 0, 0, width, 0, None if rows == t.rows else rows)
        memo[rows, width] = b.compute_cost(task, [shard]).total_ms - o
    return memo[rows, width]


@pytest.mark.parametrize("columns", [False, True], ids=["rows", "rows+columns"])
def test_however_a_table_is_cut_its_shards_do_at_least_its_least_work(columns):
    """The lemma under the bound, at the true o: pieces of at least m rows (equal or not, also column halves)
    do at least least_work(terms, o) beyond o each; and some cut comes close (the bound is not loose)."""
    b = analytic("sub_additive", BATCH)  # a single shard costs the same in both regimes
    o = operator_ms(b)
    rng = np.random.default_rng(4)
    closest = []
    for t in LEMMA_TABLES:
        task = Task.uniform("lemma", [t], 1, 64.0)
        single = b.compute_cost(task, [Shard(t.name, 0, 0, t.dim)]).total_ms
        memo: dict[tuple[int, int], float] = {}  # (R1): a piece's cost depends on its rows and width only
        for least in (1, t.rows // 64, t.rows // 2):
            terms, _ = work_terms(b, task, 0, single, columns, least, ROW_PROBE_RATIO)
            bound = least_work(terms, o)
            cuts_tried = [[r1 - r0 for r0, r1 in row_ranges(t.rows, k)] for k in range(1, t.rows // least + 1)
                          if k <= 200]
            for _ in range(20):  # uneven cuts: random cut points, pieces of at least `least` rows
                k = int(rng.integers(2, min(8, t.rows // least) + 1))
                spare = t.rows - k * least
                extra = np.diff(np.sort(np.concatenate([[0, spare], rng.integers(0, spare + 1, k - 1)])))
                cuts_tried.append([least + int(x) for x in extra])
            widths = [[t.dim]] + ([[t.dim // 2, t.dim // 2], [4] * (t.dim // 4)] if columns and t.dim >= 8 else [])
            done = [sum(piece_work(b, task, r, w, o, memo) for r in sizes for w in ws) for sizes in cuts_tried for ws in widths]
            assert min(done) >= bound * (1 - 1e-9), (t.name, least, min(done), bound)
            closest.append(min(done) / bound)
    assert max(closest) < 1.25, closest


@pytest.mark.parametrize("regime_name", REGIMES)
def test_the_busiest_device_of_a_cut_table_is_bounded_at_the_true_operator_cost(regime_name):
    """The per-table term claims no more than o + least_work(o) / N plus one piece's transfer at the true o:
    its least value over 0 <= o <= fixed is taken, not its value at fixed."""
    b = analytic(regime_name, BATCH)
    o, topo = operator_ms(b), b.config.topology
    for t in LEMMA_TABLES:
        for n in (2, 4):
            task = Task.uniform("busiest", [t], n, 64.0)
            single = b.compute_cost(task, [Shard(t.name, 0, 0, t.dim)]).total_ms
            terms, _ = work_terms(b, task, 0, single, False, t.rows // 4, ROW_PROBE_RATIO)
            bound = lower_bound(b, task, MIXED, row_splits={t.name: t.rows // 4})
            transfer = topo.latency_us * 1e-3 + (n - 1) / n * BATCH * t.dim * topo.output_bytes / (
                topo.intra_host_gbps * 1e9) * 1e3
            assert bound.max_table_ms <= o + least_work(terms, o) / n + 2 * transfer + 1e-12
            assert bound.compute_mean_ms <= (o + least_work(terms, o)) / n + 1e-12


# ---------------------------------------------------------------- plans of tasks with tables larger than a device


def oversized_tasks() -> list[Task]:
    """Tasks with two tables larger than a device (0.04 GB): one of 4 columns, cut into TorchRec's
    row-wise blocks, one of 64 cut into column slices, or also into row-wise blocks where the task allows
    whole tables and rows only."""
    rng = np.random.default_rng(5)
    out = []
    for k in range(6):
        tables = random_tables(rng, f"o{k}", 8, max_log_rows=4.5)
        tables[0] = Table(f"o{k}/thin", 3_000_000, 4, 20.0, tables[0].bins)  # 45.8 MiB
        tables[1] = Table(f"o{k}/wide", 200_000, 64, 5.0, tables[1].bins)  # 48.8 MiB
        task = Task.uniform(f"over{k}", tables, 3 + k % 2, 0.04)
        out.append(task if k < 3 else replace(task, sharding=("table", "row")))
    return out


@pytest.mark.parametrize("regime_name", REGIMES)
def test_bound_below_every_sharders_plan_of_tasks_with_oversized_tables(regime_name):
    b = analytic(regime_name, BATCH)
    row_cut = column_cut = 0
    for task in oversized_tasks():
        plans = [make_sharder(name, **seeded(name, 0)).shard(task) for name in HEURISTICS]
        for plan in plans:
            validate_plan(task, plan)
        rows, columns = row_splits_of(task, plans), column_splits_in(task, plans)
        row_cut += bool(rows)
        column_cut += columns
        for regime in (measured_regime(b, task), MIXED):
            bound = lower_bound(b, task, regime, columns, rows)
            assert bound.total_ms > 0
            for name, plan in zip(HEURISTICS, plans):
                cost = b.plan_cost(task, plan).cost_ms
                assert bound.total_ms <= cost * (1 + 1e-9), (task.name, name, bound, cost)
    assert row_cut >= 4 and column_cut >= 2  # both kinds of pieces were bounded


# ---------------------------------------------------------------- the parameters and helpers


def test_row_splits_and_column_splits_are_read_off_plans():
    task = Task.uniform("p", [Table("a", 10, 8, 1.0), Table("b", 7, 4, 1.0), Table("c", 5, 8, 1.0)], 2, 1.0)
    plans = [Plan(2, (Shard("a", 0, 0, 8, 0, 3), Shard("a", 1, 0, 8, 3, 10), Shard("b", 0, 0, 4),
                      Shard("c", 0, 0, 8))),
             Plan(2, (Shard("a", 0, 0, 8, 0, 5), Shard("a", 1, 0, 8, 5, None), Shard("b", 1, 0, 4, 0, 6),
                      Shard("b", 1, 0, 4, 6, 7), Shard("c", 0, 0, 8)))]
    for plan in plans:
        validate_plan(task, plan)
    assert row_splits_of(task, plans) == {"a": 3, "b": 1}
    assert row_splits_of(task, plans[:1]) == {"a": 3}
    assert not column_splits_in(task, plans)
    assert column_splits_in(task, [Plan(2, (Shard("c", 0, 0, 4), Shard("c", 1, 4, 8)))])


def test_row_probe_sizes_bracket_every_piece_size():
    for rows, least, ratio in [(1_000_000, 1000, 1.1), (1001, 500, 1.1), (10, 2, 1.5), (4, 2, 1.1), (97, 1, 2.0)]:
        sizes = row_probe_sizes(rows, least, ratio)
        assert sizes[0] == rows - least and sizes[-1] == least
        assert all(a > b for a, b in zip(sizes, sizes[1:]))
        assert all(a / b <= max(ratio, a / (a - 1)) for a, b in zip(sizes, sizes[1:]))
    assert len(row_probe_sizes(1_000_000, 1000, 1.1)) == 74
    with pytest.raises(ValueError, match="row_probe_ratio"):
        row_probe_sizes(100, 10, 1.0)
    with pytest.raises(ValueError, match="cannot be cut into pieces of at least 60 rows"):
        row_probe_sizes(100, 60, 1.1)


def test_row_splits_parameters_are_checked_and_default_to_the_whole_table_bound():
    task = Task.uniform("hot", HOT, 2, 1.0)
    b = analytic("super_additive", BATCH)
    plain = lower_bound(b, task, MIXED)
    assert lower_bound(b, task, MIXED, row_splits={}) == plain
    # a table too small for two pieces of the given size is never cut: it counts whole
    assert lower_bound(b, task, MIXED, row_splits={"small0": 300}) == plain
    assert lower_bound(b, task, MIXED, row_splits={"hot": 40_000}) != plain
    with pytest.raises(ValueError, match=r"row_splits: table\(s\) 'nope' not in task 'hot'"):
        lower_bound(b, task, MIXED, row_splits={"nope": 10})
    with pytest.raises(ValueError, match="fewest rows of a piece must be an int >= 1"):
        lower_bound(b, task, MIXED, row_splits={"hot": 0})
    with pytest.raises(ValueError, match="row_probe_ratio"):
        lower_bound(b, task, MIXED, row_splits={"hot": 10}, row_probe_ratio=1.0)


@pytest.mark.parametrize("regime_name", REGIMES)
def test_one_device_bound_with_row_splits_is_no_more_the_fused_cost(regime_name):
    task = Task.uniform("one", HOT, 1, 1.0)
    b = analytic(regime_name, BATCH)
    fused = b.plan_cost(task, Plan.from_assignment(task, [0] * 4)).cost_ms
    assert lower_bound(b, task, MIXED).total_ms == pytest.approx(fused)
    halves_plan = Plan(1, (Shard("hot", 0, 0, 4, 0, 40_000), Shard("hot", 0, 0, 4, 40_000, 80_000),
                           *(Shard(f"small{i}", 0, 0, 4) for i in range(3))))
    cost = b.plan_cost(task, halves_plan).cost_ms
    if regime_name == "sub_additive":
        assert cost < fused  # two halves' smaller working sets miss the cache less: the one plan is no more
    for regime in (MIXED, SUB_ADDITIVE):
        assert lower_bound(b, task, regime, row_splits=halves(task)).total_ms <= cost


class RowHalvesSharder:
    """A stand-in for a sharder that cuts rows: the first table in row halves on devices 0 and 1, the rest
    whole on device 0."""

    name = "row_halves"

    def shard(self, task: Task) -> Plan:
        first, *rest = task.tables
        half = first.rows // 2
        return Plan(task.num_devices, (Shard(first.name, 0, 0, first.dim, 0, half),
                                       Shard(first.name, 1, 0, first.dim, half, first.rows),
                                       *(Shard(t.name, 0, 0, t.dim) for t in rest)))


def test_the_exhaustive_check_measures_a_sharders_plan_with_row_ranges():
    from dreamshard.evaluation.summary import exhaustive_check

    task = Task.uniform("ex/0", HOT, 2, 1.0)
    b = analytic("super_additive", BATCH)
    out = exhaustive_check(b, [task], [RowHalvesSharder()], 1, 4, 2, MIXED)
    small = Task.uniform("exhaustive/0", HOT, 2, 1.0, task.memory, "exhaustive")
    plan = RowHalvesSharder().shard(small)
    validate_plan(small, plan)
    # not the whole-table plan with the hot table on device 1: the row halves' own cost
    assert out["tasks"][0]["best_sharder_ms"] == pytest.approx(b.plan_cost(small, plan).cost_ms)
    assert out["tasks"][0]["best_sharder_ms"] < out["tasks"][0]["optimum_ms"]  # better than any whole-table plan
