"""NeuroShard's row moves (dreamshard/sharders/search.py, `SearchConfig.row_splits`) on the analytic backend.

A small NeuroShard model is fitted here as the pipeline fits one (augmented single-device data, then
the communication model). The search must cut a hot table too narrow for column slices into row
halves on both devices, never make row ranges with row_splits off (beyond pieces.py's row-wise
blocks), respect the task's sharding kinds, pins, `min_rows` and `max_row_ranges`, and give its
cost model a row piece as the table of its rows, as pieces.py does.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from dreamshard.data.dlrm import TableProfile, generate_lookups
from dreamshard.hardware.analytic import AnalyticBackend
from dreamshard.learning.features import FeatureScaler, shard_features, table_features
from dreamshard.learning.neuroshard import (
    AugmentConfig,
    NeuroShardModel,
    comm_dataset,
    compute_dataset,
    fit_comm_net,
    fit_compute_net,
)
from dreamshard.memory import MemoryModel
from dreamshard.plan import Plan, row_blocks, validate_plan
from dreamshard.sharders import make_sharder
from dreamshard.sharders.pieces import Cut, cut_task
from dreamshard.sharders.search import (
    Block,
    NeuroShardSharder,
    SearchConfig,
    _Evaluator,
    as_blocks,
    backtracking_plan,
    block_table,
    greedy_grid,
    halve_rows,
    to_plan,
)
from dreamshard.tables import Table, access_count_bins
from dreamshard.tasks import Task
from helpers import analytic

BATCH = 1024
SEARCH = dict(beams=3, depth=10, candidates=5, scale_steps=11)


def table_with_bins(name: str, rows: int, dim: int, pooling: float, alpha: float, seed: int) -> Table:
    """A table whose access-count bins come from generated lookups (Zipf exponent alpha)."""
    idx, _ = generate_lookups(TableProfile(rows, pooling, alpha), 512, seed)
    return Table(name, rows, dim, pooling, tuple(access_count_bins(np.unique(idx, return_counts=True)[1])))


def random_tables(seed: int, count: int, prefix: str) -> list[Table]:
    """Heavy-tailed tables: rows 1e2..3e5, pooling lognormal around 7 (at most 100), dims 4..128."""
    rng = np.random.default_rng(seed)
    return [table_with_bins(f"{prefix}{i:03d}", int(10 ** rng.uniform(2, 5.5)), int(rng.choice([4, 8, 16, 32, 64, 128])),
                            float(min(rng.lognormal(math.log(7.0), 1.0), 100.0)), float(rng.uniform(0.2, 1.4)),
                            seed * 1000 + i)
            for i in range(count)]


@pytest.fixture(scope="module")
def backend() -> AnalyticBackend:
    return analytic(batch_size=BATCH)


@pytest.fixture(scope="module")
def neuro(backend) -> NeuroShardModel:
    train = random_tables(1, 60, "tr")
    scaler = FeatureScaler.fit(table_features(train, MemoryModel()))
    cfg = AugmentConfig(compute_samples=150, max_tables=8, memory_cap_gb=1.0, comm_samples=400, seed=0)
    data = compute_dataset(backend, train, cfg, Task.uniform("template", train[:2], 1, 1.0))
    compute, _ = fit_compute_net(data, scaler, steps=600, lr=5e-3, batch=32, seed=0)
    comm, _ = fit_comm_net(comm_dataset(backend, [1, 2, 3, 4], train, cfg.dims, cfg), steps=400, lr=5e-3, batch=64, seed=0)
    return NeuroShardModel(compute, comm, scaler, {"backend": backend.name})


@pytest.fixture(scope="module")
def test_tasks() -> list[Task]:
    pool = random_tables(2, 60, "te")
    rng = np.random.default_rng(3)
    return [Task.uniform(f"t{k}", [pool[int(i)] for i in rng.choice(len(pool), int(rng.integers(6, 16)), replace=False)],
                         int(rng.choice([2, 4])), 1.0) for k in range(12)]


def hot_task() -> Task:
    """One hot table of 4 columns (no column cut) does most of the work; three small ones."""
    hot = table_with_bins("hot", 80_000, 4, 90.0, 0.6, 1)
    return Task.uniform("hot", [hot, *(table_with_bins(f"small{i}", 500, 4, 1.0, 1.0, 2 + i) for i in range(3))], 2, 1.0)


def search(model: NeuroShardModel, **options) -> NeuroShardSharder:
    return NeuroShardSharder(model, SearchConfig(**{**SEARCH, **options}))


_PLANNED: dict[tuple, Plan] = {}


def planned(model: NeuroShardModel, task: Task, **options) -> Plan:
    """search(model, **options).shard(task), searched once per test module: several tests read the same plans
    of the same tasks, and the search is deterministic (a fresh search gives the kept plan: the hot-table test)."""
    key = (id(model), task, tuple(sorted(options.items())))
    if key not in _PLANNED:
        _PLANNED[key] = search(model, **options).shard(task)
    return _PLANNED[key]


def row_ranges_of(plan: Plan, task: Task) -> dict[str, set[tuple[int, int]]]:
    rows = {t.name: t.rows for t in task.tables}
    out: dict[str, set[tuple[int, int]]] = {}
    for s in plan.shards:
        if s.num_rows(rows[s.table]) < rows[s.table]:
            out.setdefault(s.table, set()).add(s.rows(rows[s.table]))
    return out


# ---------------------------------------------------------------- when row moves pay


def test_a_hot_narrow_table_is_cut_into_row_halves_on_both_devices(neuro, backend):
    task = hot_task()
    off = planned(neuro, task)
    on = planned(neuro, task, row_splits=True)
    validate_plan(task, on)
    assert not row_ranges_of(off, task)  # whole: nothing else can spread its lookups
    hot = sorted((s.rows(80_000), s.device) for s in on.shards if s.table == "hot")
    assert [r for r, _ in hot] == [(0, 40_000), (40_000, 80_000)] and {d for _, d in hot} == {0, 1}
    # each half does half the lookups: observed 0.846 ms against 1.539 ms
    assert backend.plan_cost(task, on).cost_ms < 0.6 * backend.plan_cost(task, off).cost_ms
    # make_sharder passes the configuration through
    assert make_sharder("neuroshard", model=neuro, search=SearchConfig(**SEARCH, row_splits=True)).shard(task) == on


def test_without_a_row_range_limit_the_search_overcuts_the_hot_table(neuro, backend):
    """Why max_row_ranges defaults to the device count: the compute model, fitted on whole tables fused a few
    at a time, prices many small pieces on one device far too low, and the search follows it."""
    task = hot_task()
    bounded = planned(neuro, task, row_splits=True)
    unbounded = search(neuro, row_splits=True, max_row_ranges=64).shard(task)
    validate_plan(task, unbounded)
    assert len(row_ranges_of(unbounded, task)["hot"]) > 2  # observed 8 pieces
    assert backend.plan_cost(task, bounded).cost_ms < backend.plan_cost(task, unbounded).cost_ms  # observed 0.846 vs 0.862 ms


def predicted_ms(model: NeuroShardModel, task: Task, plan: Plan) -> float:
    """The search's score of a plan: max over devices of predicted compute and communication."""
    ev = _Evaluator(model, task)
    index = {t.name: i for i, t in enumerate(task.tables)}
    blocks = as_blocks(task, [(index[s.table], *s.rows(task.tables[index[s.table]].rows), s.col_start, s.col_end)
                              for s in plan.shards])
    enc = ev.encode(blocks)
    device_sums, traffic = np.zeros((task.num_devices, enc.shape[1])), np.zeros((task.num_devices, 2))
    for s, e, tr in zip(plan.shards, enc, ev.traffic(blocks)):
        device_sums[s.device] += e
        traffic[s.device] += tr
    return float(ev.score(device_sums, traffic, blocks))


def test_row_moves_never_leave_the_predicted_cost_above_the_column_search(neuro, test_tasks):
    """The row search starts from the column search's best plan; one search with both kinds of moves from
    the start ended up to 1.3 times above it (row moves crowding out column moves that paid later)."""
    lower = 0
    for task in test_tasks:
        off = predicted_ms(neuro, task, planned(neuro, task))
        on = predicted_ms(neuro, task, planned(neuro, task, row_splits=True))
        assert on <= off * (1 + 1e-6), (task.name, on, off)
        lower += on < off * 0.99
    assert lower >= 2  # and row moves do lower it at times


# ---------------------------------------------------------------- what row moves may and may not do


def test_row_splits_off_never_makes_row_ranges(neuro, test_tasks):
    for task in [*test_tasks, hot_task()]:
        plan = planned(neuro, task)
        validate_plan(task, plan)
        assert not any(s.is_row_range for s in plan.shards), task.name


def test_row_moves_keep_min_rows_and_max_row_ranges(neuro, test_tasks):
    used = 0
    for task in [*test_tasks, hot_task()]:
        plan = search(neuro, row_splits=True, min_rows=200, max_row_ranges=3).shard(task)
        validate_plan(task, plan)
        for name, ranges in row_ranges_of(plan, task).items():
            used += 1
            assert len(ranges) <= 3 and all(end - start >= 200 for start, end in ranges), (task.name, name, ranges)
    assert used >= 3  # row moves were taken, not just allowed


def test_the_tasks_sharding_kinds_limit_the_moves(neuro):
    task = hot_task()
    no_rows = search(neuro, row_splits=True).shard(replace(task, sharding=("table", "column")))
    assert not row_ranges_of(no_rows, task)
    wide = replace(task, tables=(task.tables[0].with_dim(64), *task.tables[1:]))  # columns could be cut now
    rows_only = replace(wide, sharding=("table", "row"))
    plan = search(neuro, row_splits=True).shard(rows_only)
    validate_plan(rows_only, plan)
    dims = {t.name: t.dim for t in wide.tables}
    assert all(s.width == dims[s.table] for s in plan.shards)  # no column slices
    assert row_ranges_of(plan, wide)  # the hot table still spread by rows
    plan = search(neuro).shard(replace(wide, sharding=("table",)))
    assert all(s.width == dims[s.table] and not s.is_row_range for s in plan.shards)


@pytest.mark.parametrize("row_splits", [False, True])
def test_pinned_row_wise_blocks_stay_on_their_devices(neuro, row_splits):
    """A table too large for a device and too narrow for column slices goes row-wise, block i pinned to
    device i (pieces.py); the search places the blocks there and never cuts them."""
    thin = table_with_bins("thin", 3_000_000, 4, 20.0, 0.8, 7)  # 45.8 MiB, devices of 40.96 MiB
    others = random_tables(5, 8, "o")
    task = Task.uniform("pinned", [thin, *(t for t in others if t.rows < 40_000)], 3, 0.04)
    plan = search(neuro, row_splits=row_splits, min_rows=100).shard(task)
    validate_plan(task, plan)
    blocks = sorted((s.rows(3_000_000), s.device) for s in plan.shards if s.table == "thin")
    assert blocks == [(b, d) for d, b in enumerate(row_blocks(3_000_000, 3))]
    if not row_splits:  # the only row ranges are the blocks
        assert set(row_ranges_of(plan, task)) == {"thin"}


def test_the_backing_up_placement_keeps_pins_row_pieces_and_memory(neuro):
    """Where no scale of the greedy grid places every shard, the placement that backs up takes over: it
    must put pinned blocks on their devices and row pieces within memory too."""
    thin = table_with_bins("thin", 3_000_000, 4, 20.0, 0.8, 7)
    task = Task.uniform("tight", [thin, *random_tables(6, 5, "b")], 3, 0.04)
    cut, pieces = cut_task(task, {"thin": Cut(row_wise=True)})
    ev = _Evaluator(neuro, cut)
    root = tuple(Block(i, 0, t.rows, 0, t.dim) for i, t in enumerate(cut.tables))
    widest = max(range(len(root)), key=lambda i: cut.tables[i].rows if cut.tables[i].name not in pieces else -1)
    shards = halve_rows(root, widest)
    _, assignment = backtracking_plan(ev, shards)
    plan = to_plan(cut, shards, assignment)
    validate_plan(cut, plan)  # pins and memory
    assert sum(s.is_row_range for s in plan.shards) == 2


# ---------------------------------------------------------------- what the cost model sees


def test_a_row_piece_is_given_to_the_cost_model_as_the_table_of_its_rows(neuro):
    task = hot_task()
    hot = task.tables[0]
    piece = block_table(task, Block(0, 20_000, 60_000, 0, 4))
    assert (piece.rows, piece.dim, piece.bins) == (40_000, 4, hot.bins)
    assert piece.pooling_factor == pytest.approx(90.0 * 40_000 / 80_000)
    # the same table as pieces.py makes of a row-wise block (its rule for a piece's lookups)
    cut, pieces = cut_task(task, {"hot": Cut(row_wise=True)})
    block = next(t for t in cut.tables if t.name in pieces)
    start, end = pieces[block.name][1:3]
    mine = block_table(task, Block(0, start, end, 0, 4))
    assert mine == replace(block, name=mine.name)
    assert block_table(task, Block(0, 0, 80_000, 0, 4)) == hot  # all rows: the table itself
    ev = _Evaluator(neuro, task)
    raw = shard_features(piece, 4, task.memory)
    with torch.no_grad():
        expected = neuro.compute.encode(torch.from_numpy(neuro.scaler.transform(raw[None]))).double().numpy()
    expected = ev.heads.project(expected)[0]  # as the search sums it: through the heads' first layer
    np.testing.assert_allclose(ev.encode([Block(0, 20_000, 60_000, 0, 4)])[0], expected, rtol=1e-6)
    # where its rows start does not matter; how many does
    np.testing.assert_array_equal(ev.encode([Block(0, 0, 40_000, 0, 4)]), ev.encode([Block(0, 40_000, 80_000, 0, 4)]))
    assert not np.allclose(ev.encode([Block(0, 0, 40_000, 0, 4)]), ev.encode([Block(0, 0, 80_000, 0, 4)]))


def test_the_search_rates_devices_as_the_compute_model_does(neuro, test_tasks):
    """The search sums projected encodings and finishes the heads in NumPy (decoding.CostHeads): the same
    (fwd, fwd + bwd) as the compute model on the summed encodings."""
    task = test_tasks[0]
    ev = _Evaluator(neuro, task)
    blocks = [Block(i, 0, t.rows, 0, t.dim) for i, t in enumerate(task.tables)]
    device = np.arange(len(blocks)) % 2
    raw = np.stack([shard_features(t, t.dim, task.memory) for t in task.tables])
    with torch.no_grad():
        enc = neuro.compute.encode(torch.from_numpy(neuro.scaler.transform(raw)))
        sums = torch.stack([enc[torch.from_numpy(device == d)].sum(dim=0) for d in (0, 1)])
        torch_costs = neuro.compute.device_costs(sums).numpy()
    projected = ev.encode(blocks)
    fwd, total = ev.compute_ms(np.stack([projected[device == d].sum(axis=0) for d in (0, 1)]))
    np.testing.assert_allclose(fwd, torch_costs[:, 0], rtol=1e-5)
    np.testing.assert_allclose(total, torch_costs[:, 0] + torch_costs[:, 1], rtol=1e-5)


def test_shard_sets_before_row_splits_still_read_as_all_rows(neuro):
    task = hot_task()
    legacy = ((0, 0, 4), (1, 0, 4), (2, 0, 4), (3, 0, 4))
    blocks = as_blocks(task, legacy)
    assert blocks[0] == Block(0, 0, 80_000, 0, 4) and blocks[1] == Block(1, 0, 500, 0, 4)
    ev = _Evaluator(neuro, task)
    assert greedy_grid(ev, legacy, SearchConfig(**SEARCH)) == greedy_grid(ev, blocks, SearchConfig(**SEARCH))
    with pytest.raises(ValueError, match=r"shard \(0, 0\): expected \(table, col_start, col_end\)"):
        as_blocks(task, [(0, 0)])


def test_search_config_checks_the_row_options():
    assert not SearchConfig().row_splits  # off unless asked for (module docstring: what they do)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="min_rows must be an integer >= 1"):
            SearchConfig(min_rows=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_row_ranges must be an integer >= 1"):
            SearchConfig(max_row_ranges=bad)  # type: ignore[arg-type]
    assert SearchConfig(max_row_ranges=None).max_row_ranges is None


def test_table_wise_neuroshard_keeps_tables_whole_and_is_the_grid_search_alone(neuro, test_tasks):
    """neuroshard_tw: the same model and grid search, no moves (the peer of the table-wise learned sharders)."""
    config = SearchConfig(**SEARCH, row_splits=True)
    tw, full = (make_sharder(n, model=neuro, search=config) for n in ("neuroshard_tw", "neuroshard"))
    assert tw.name == "neuroshard_tw" and full.name == "neuroshard"
    cut = 0
    for task in test_tasks:
        plan = tw.shard(task)
        validate_plan(task, plan)
        assert len(plan.shards) == len(task.tables)  # every table whole, on one device
        assert plan == search(neuro, depth=0).shard(task)
        cut += len(planned(neuro, task, row_splits=True).shards) > len(task.tables)
    assert cut > 0  # where the full search cuts tables, the table-wise one does not
    assert full.shard(test_tasks[0]) == planned(neuro, test_tasks[0], row_splits=True)  # `full` is that search
