"""Cost collection: which plans are measured, the crash-safe journal, resuming, and the collect stage.

Tiny real data: the tiny project's tasks (24 synthetic tables; the `tiny_project` fixture, level `tasks`),
measured with the deterministic analytic backend. Interruptions are injected by a small
backend wrapper that raises after k plan measurements.
"""
from __future__ import annotations

import copy
import hashlib
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dreamshard.errors import DataFormatError
from dreamshard.evaluation.collect import (
    CostJournal,
    collect,
    measure_chunk,
    measure_rows,
    perturb,
    plan_id,
    plans_to_measure,
)
from dreamshard.hardware.analytic import AnalyticBackend
from dreamshard.hardware.base import ComputeCost, measure_rounds
from dreamshard.learning.cost_model import measurement_noise
from dreamshard.plan import Plan, Shard, validate_plan
from dreamshard.sharders import HEURISTICS, make_sharder
from helpers import TINY_EXTRA as EXTRA
from helpers import analytic as analytic_backend
from helpers import seeded
from stages import collect as collect_stage


@pytest.fixture(scope="module")
def data(tiny_project):
    level = tiny_project("tasks")
    return level.root, level.params, level.tasks("train")


@pytest.fixture
def analytic() -> AnalyticBackend:
    return analytic_backend(batch_size=512)


class FailingBackend:
    """Delegates to a backend; its compute_cost raises once `fail_after` device operators were measured (fault
    injection). A plan measurement is one compute_cost per device of the plan not yet read in its round
    (measure_rounds)."""

    def __init__(self, inner, fail_after: int) -> None:
        self.inner, self.fail_after, self.calls = inner, fail_after, 0
        self.name, self.measured = inner.name, inner.measured

    def device_name(self):
        return self.inner.device_name()

    def versions(self):
        return self.inner.versions()

    def compute_cost(self, task, shards):
        if self.calls >= self.fail_after:
            raise RuntimeError(f"injected crash after {self.calls} device operators")
        self.calls += 1
        return self.inner.compute_cost(task, shards)

    def communication_cost(self, fwd_ms, traffic):
        return self.inner.communication_cost(fwd_ms, traffic)

    def plan_cost_from(self, task, plan, compute):
        return self.inner.plan_cost_from(task, plan, compute)


def counting_backend(inner):
    """A FailingBackend that never fails: counts device operators measured."""
    return FailingBackend(inner, fail_after=10**9)


def operators(items, ids, chunk: int = 10**9) -> int:
    """Device operators of one measurement of each plan of `ids`, in order, `chunk` plans at a time: within a chunk,
    a device shard set that plans of one task share is measured once, and an empty device not at all."""
    by_id = {it.plan_id: it for it in items}
    total = 0
    for start in range(0, len(ids), chunk):
        seen = set()
        for i in ids[start:start + chunk]:
            it = by_id[i]
            for d in range(it.plan.num_devices):
                shards = it.plan.device_shards(d)
                if shards:
                    seen.add((id(it.task), tuple(sorted((s.table, s.col_start, s.col_end, s.row_start, s.row_end or -1)
                                                        for s in shards))))
        total += len(seen)
    return total


# ---------------------------------------------------------------- which plans


def test_plans_to_measure_are_valid_and_mix_sharders_with_perturbed_plans(data):
    _, _, tasks = data
    items = plans_to_measure(tasks, 40, 0.5, seed=3, fingerprint="fp")
    assert len(items) == 40
    for it in items:
        validate_plan(it.task, it.plan)
        assert it.plan_id == plan_id(it.task, it.plan, "fp")
        assert it.source.split("+")[0] in HEURISTICS
    sources = Counter(it.source for it in items)
    assert {s.split("+")[0] for s in sources} == set(HEURISTICS)
    perturbed = sum(n for s, n in sources.items() if s.endswith("+perturbed"))
    assert 10 <= perturbed <= 30, sources  # about half of 40
    assert {it.task.name for it in items} == {t.name for t in tasks}  # every training task gets plans
    # an unperturbed item is exactly its sharder's plan
    for k, it in enumerate(items):
        if not it.source.endswith("+perturbed"):
            assert it.plan == make_sharder(it.source, **seeded(it.source, 3 + k)).shard(it.task)


def test_plans_to_measure_is_seeded_and_ids_depend_on_the_fingerprint(data):
    _, _, tasks = data
    a = plans_to_measure(tasks, 15, 0.5, seed=1, fingerprint="fp")
    b = plans_to_measure(tasks, 15, 0.5, seed=1, fingerprint="fp")
    assert [(x.plan_id, x.source, x.plan) for x in a] == [(x.plan_id, x.source, x.plan) for x in b]
    other = plans_to_measure(tasks, 15, 0.5, seed=1, fingerprint="other backend")
    assert not {x.plan_id for x in a} & {x.plan_id for x in other}
    none = plans_to_measure(tasks, 15, 0.0, seed=1, fingerprint="fp")
    assert not any(x.source.endswith("+perturbed") for x in none)
    every = plans_to_measure(tasks, 15, 1.0, seed=1, fingerprint="fp")
    assert all(x.source.endswith("+perturbed") for x in every)
    with pytest.raises(ValueError, match="no tasks"):
        plans_to_measure([], 5, 0.5, 0, "fp")


def test_perturb_moves_tables_only_where_they_fit(data):
    _, _, tasks = data
    rng = np.random.default_rng(0)
    moved = 0
    for task in tasks:
        plan = make_sharder("size_greedy").shard(task)
        for _ in range(10):
            new = perturb(task, plan, rng, max_moves=3)
            validate_plan(task, new)  # memory respected, every table once
            before = {s.table: s.device for s in plan.shards}
            after = {s.table: s.device for s in new.shards}
            changed = sum(before[t] != after[t] for t in before)
            assert changed <= 3
            moved += changed > 0
    assert moved > 0


def test_perturb_leaves_a_table_in_pieces_as_it_is(data):
    """A heuristic cuts a table no device holds whole (with_pieces): moving its pieces as one table put it whole on
    one device, beyond its memory (a crash of the collect stage). Its pieces stay; the whole tables still move."""
    _, _, tasks = data
    task = tasks[0]
    plan = make_sharder("size_greedy").shard(task)
    cut = max(task.tables, key=lambda t: t.dim)
    half = cut.dim // 2
    pieces = (Shard(cut.name, 0, 0, half), Shard(cut.name, 1, half, cut.dim))
    plan = Plan(plan.num_devices, tuple(s for s in plan.shards if s.table != cut.name) + pieces)
    rng = np.random.default_rng(1)
    moved = 0
    for _ in range(30):
        new = perturb(task, plan, rng, max_moves=len(task.tables))
        validate_plan(task, new)
        assert [s for s in new.shards if s.table == cut.name] == list(pieces)
        moved += new != plan
    assert moved > 0


# ---------------------------------------------------------------- journal, crash, resume


def _unique(items):
    return list(dict.fromkeys(it.plan_id for it in items))


def test_collect_writes_chunks(data, analytic, tmp_path):
    _, _, tasks = data
    items = plans_to_measure(tasks, 12, 0.5, seed=0, fingerprint="fp")
    ids = _unique(items)
    journal = CostJournal(tmp_path / "journal")
    assert journal.done_ids() == set()
    ticks = []
    collect(analytic, items, journal, chunk_size=5, extra=EXTRA, on_plan=lambda: ticks.append(1))
    chunks = -(-len(ids) // 5)
    assert len(list(journal.folder.glob("plans-*.parquet"))) == chunks
    assert len(list(journal.folder.glob("devices-*.parquet"))) == chunks
    assert not list(journal.folder.glob(".*.tmp"))  # atomic writes leave no temporaries
    assert len(ticks) == len(ids)
    assert journal.done_ids() == set(ids)
    plans = journal.read("plans", ids)
    devices = journal.read("devices", ids)
    assert plans["plan_id"].tolist() == ids
    assert set(plans["backend"]) == {"analytic"} and not plans["measured"].any()
    assert (plans["batch_size"] == 512).all() and (plans["seed"] == 0).all()
    by_id = {it.plan_id: it for it in items}
    assert len(devices) == sum(by_id[i].plan.num_devices for i in ids)
    totals = devices.assign(total=devices[["fwd_ms", "bwd_ms", "fwd_comm_ms", "bwd_comm_ms"]].sum(axis=1))
    np.testing.assert_allclose(totals.groupby("plan_id", sort=False)["total"].max().loc[ids], plans["cost_ms"],
                               rtol=1e-12)
    for row in devices.itertuples():
        shards = by_id[row.plan_id].plan.device_shards(row.device)
        assert list(row.tables) == [s.table for s in shards]
    # the plan rows hold the plans themselves
    for row in plans.itertuples():
        plan = Plan.from_dict({"num_devices": int(row.num_devices), "shards": json.loads(row.shards)})
        assert plan == by_id[row.plan_id].plan
    # a second run measures nothing
    counter = counting_backend(analytic)
    collect(counter, items, journal, chunk_size=5, extra=EXTRA)
    assert counter.calls == 0


@pytest.mark.parametrize("fail_after", [0, 4, 7, 11])
def test_resume_after_a_crash_loses_and_repeats_nothing(data, analytic, tmp_path, fail_after):
    _, _, tasks = data
    items = plans_to_measure(tasks, 16, 0.5, seed=2, fingerprint="fp")
    ids = _unique(items)
    assert len(ids) > fail_after
    chunk = 4

    reference = CostJournal(tmp_path / "reference")
    collect(analytic, items, reference, chunk, EXTRA)

    journal = CostJournal(tmp_path / "journal")
    failing = FailingBackend(analytic, operators(items, ids[:fail_after], chunk))  # fails as plan fail_after starts
    with pytest.raises(RuntimeError, match="injected crash"):
        collect(failing, items, journal, chunk, EXTRA)
    completed = fail_after // chunk  # chunks written before the crash; the crashed chunk is not
    assert len(list(journal.folder.glob("plans-*.parquet"))) == completed
    done = journal.done_ids()
    assert done == set(ids[: completed * chunk])

    counter = counting_backend(analytic)
    collect(counter, items, journal, chunk, EXTRA)
    assert counter.calls == operators(items, [i for i in ids if i not in done], chunk)  # only the missing plans are measured

    plans, ref_plans = journal.read("plans", ids), reference.read("plans", ids)
    assert plans["plan_id"].tolist() == ids and plans["plan_id"].is_unique
    pd.testing.assert_frame_equal(plans, ref_plans)
    pd.testing.assert_frame_equal(journal.read("devices", ids), reference.read("devices", ids))
    assert len(list(journal.folder.glob("devices-*.parquet"))) == len(list(journal.folder.glob("plans-*.parquet")))


def test_crash_between_the_devices_and_the_plans_part_is_redone(data, analytic, tmp_path):
    _, _, tasks = data
    items = plans_to_measure(tasks, 10, 0.5, seed=5, fingerprint="fp")
    ids = _unique(items)
    journal = CostJournal(tmp_path / "journal")
    collect(analytic, items, journal, 4, EXTRA)
    reference_devices = journal.read("devices", ids)
    # the last chunk's plans part never got written: its devices part alone does not count as done
    last = max(journal.folder.glob("plans-*.parquet"), key=lambda p: p.stat().st_mtime_ns)
    lost = set(pd.read_parquet(last)["plan_id"])
    last.unlink()
    assert journal.done_ids() == set(ids) - lost
    counter = counting_backend(analytic)
    collect(counter, items, journal, 4, EXTRA)
    assert counter.calls == operators(items, [i for i in ids if i in lost], 4)
    assert journal.read("plans", ids)["plan_id"].tolist() == ids
    pd.testing.assert_frame_equal(journal.read("devices", ids), reference_devices)


def test_read_of_an_empty_journal(tmp_path):
    journal = CostJournal(tmp_path / "nothing")
    assert journal.done_ids() == set()
    assert journal.read("plans", ["a", "b"]).empty


# ---------------------------------------------------------------- the collect stage


def test_collect_stage_end_to_end(data, tmp_path):
    _, params, tasks = data
    params = copy.deepcopy(params)
    params["paths"]["costs"] = str(tmp_path / "costs")  # the tiny project is read-only
    collect_stage.run(params)
    out = Path(params["paths"]["costs"])
    assert sorted(p.name for p in out.iterdir()) == ["devices.parquet", "plans.parquet"]  # journal removed
    plans = pd.read_parquet(out / "plans.parquet")
    devices = pd.read_parquet(out / "devices.parquet")
    assert plans["plan_id"].is_unique
    assert 1 <= len(plans) <= params["collect"]["num_plans"]
    assert set(plans["task_id"]) <= {t.name for t in tasks}
    assert set(plans["backend"]) == {"analytic"} and not plans["measured"].any()
    assert set(plans["device_name"]) == {"analytic model (super_additive regime)"}
    assert (plans["batch_size"] == 512).all() and (plans["seed"] == 0).all()
    # one device row per device of each plan, in plan order
    per_plan = devices.groupby("plan_id", sort=False).size()
    assert per_plan.index.tolist() == plans["plan_id"].tolist()
    assert per_plan.tolist() == plans["num_devices"].tolist()
    for _, group in devices.groupby("plan_id", sort=False):
        assert group["device"].tolist() == list(range(len(group)))
    totals = devices[["fwd_ms", "bwd_ms", "fwd_comm_ms", "bwd_comm_ms"]].sum(axis=1).groupby(devices["plan_id"]).max()
    np.testing.assert_allclose(totals.loc[plans["plan_id"]].to_numpy(), plans["cost_ms"].to_numpy(), rtol=1e-12)
    # every plan is a valid plan of its task
    by_name = {t.name: t for t in tasks}
    for row in plans.itertuples():
        plan = Plan.from_dict({"num_devices": int(row.num_devices), "shards": json.loads(row.shards)})
        validate_plan(by_name[row.task_id], plan)

    # a rerun measures the same plans again (the journal is gone) and gives the same files
    collect_stage.run(params)
    pd.testing.assert_frame_equal(pd.read_parquet(out / "plans.parquet"), plans)
    pd.testing.assert_frame_equal(pd.read_parquet(out / "devices.parquet"), devices)


def test_collect_stage_rejects_bad_params(data):
    from dreamshard.project.params import ParamsError

    _, params, _ = data
    bad = copy.deepcopy(params)
    bad["collect"]["chunk_size"] = 0
    with pytest.raises(ParamsError, match="collect.chunk_size"):
        collect_stage.run(bad)
    bad = copy.deepcopy(params)
    bad["backend"]["name"] = "abacus"
    with pytest.raises(ParamsError, match="backend.name"):
        collect_stage.run(bad)


class DriftingBackend(FailingBackend):
    """A machine whose speed changes from one operator to the next: the k-th operator costs factors[k] x the
    analytic cost (cycling). Records the task of every operator it measures."""

    def __init__(self, inner, factors) -> None:
        super().__init__(inner, fail_after=10**9)
        self.factors, self.tasks = factors, []

    def compute_cost(self, task, shards):
        cost = super().compute_cost(task, shards)
        self.tasks.append(task.name)
        f = self.factors[(self.calls - 1) % len(self.factors)]
        return ComputeCost(cost.fwd_ms * f, cost.bwd_ms * f)


def test_rounds_measure_a_chunk_in_turns_and_keep_every_round_and_the_medians(data, analytic, tmp_path):
    _, _, tasks = data
    items = plans_to_measure(tasks, 3, 0.0, seed=0, fingerprint="fp")
    ids = _unique(items)
    assert len(ids) == 3 and len({it.task.name for it in items}) == 3
    drifting = DriftingBackend(analytic, [1.0, 1.7, 0.6, 1.2, 0.9])
    plans, devices = measure_chunk(drifting, items, EXTRA, rounds=3)
    assert drifting.calls == 3 * operators(items, ids)  # every plan three times
    # in turns: A B C, then B C A, then C A B
    turns = [name for k, name in enumerate(drifting.tasks) if k == 0 or drifting.tasks[k - 1] != name]
    a, b, c = (it.task.name for it in items)
    assert turns == [a, b, c, b, c, a, c, a, b]
    steady = {p["plan_id"]: p for p in measure_chunk(analytic, items, EXTRA)[0]}
    for row in devices:
        assert len(row["fwd_ms_rounds"]) == len(row["bwd_ms_rounds"]) == 3
        assert row["fwd_ms"] == pytest.approx(float(np.median(row["fwd_ms_rounds"])))
        assert row["bwd_ms"] == pytest.approx(float(np.median(row["bwd_ms_rounds"])))
    for row in plans:
        assert row["rounds"] == 3 and len(set(row["cost_ms_rounds"])) > 1  # the drift is kept, not averaged away
        assert min(row["cost_ms_rounds"]) <= row["cost_ms"] <= max(row["cost_ms_rounds"])
        assert steady[row["plan_id"]]["cost_ms_rounds"] == [steady[row["plan_id"]]["cost_ms"]]
    # the plan's cost is the max over its devices of their medians (plus communication), as collect journals it
    frame = pd.DataFrame(devices)
    totals = frame[["fwd_ms", "bwd_ms", "fwd_comm_ms", "bwd_comm_ms"]].sum(axis=1).groupby(frame["plan_id"]).max()
    np.testing.assert_allclose([totals[p["plan_id"]] for p in plans], [p["cost_ms"] for p in plans], rtol=1e-12)
    # the floor under a cost model's error against these rows: one round against the medians
    noise = measurement_noise(pd.DataFrame(plans), frame)
    assert noise is not None and noise["rounds"] == 3 and noise["plans"] == 3
    assert noise["single_round_compute_mape"] > 0.1 and -1 <= noise["single_round_plan_kendall_tau"] <= 1
    steady_rows = measure_chunk(analytic, items, EXTRA)
    assert measurement_noise(pd.DataFrame(steady_rows[0]), pd.DataFrame(steady_rows[1])) is None
    with pytest.raises(ValueError, match="rounds"):
        measure_chunk(analytic, items, EXTRA, rounds=0)


# ---------------------------------------------------------------- plans with cuts (collect.cut_fraction)


def test_plans_with_cuts_are_valid_and_priced_piece_by_piece(data, analytic):
    """A share of the plans cut tables of their busiest device: column slices on distinct devices, or TorchRec's
    row-wise blocks (block i on device i). The cost data price a row block as the table it is on its own
    (Table.block: its rows, its share of the lookups), in rows from the collect stage as in measured plans."""
    from dreamshard.evaluation.collect import cut_tables
    from dreamshard.learning.cost_model import cost_data_from_plans, cost_data_from_rows
    from dreamshard.plan import row_blocks

    _, _, tasks = data
    items = plans_to_measure(tasks, 40, 0.5, seed=3, fingerprint="fp", cut_fraction=1.0)
    assert all(it.source.endswith("+cut") for it in items)
    kinds = Counter()
    for it in items:
        validate_plan(it.task, it.plan)
        tables = {t.name: t for t in it.task.tables}
        for name in {s.table for s in it.plan.shards}:
            shards = [s for s in it.plan.shards if s.table == name]
            if len(shards) == 1:
                continue
            if shards[0].is_row_range:
                kinds["row"] += 1
                blocks = row_blocks(tables[name].rows, it.task.num_devices)
                assert sorted((s.device, s.row_start, s.row_end) for s in shards) == \
                    [(d, a, b) for d, (a, b) in enumerate(blocks)]
            else:
                kinds["column"] += 1
                assert len({s.device for s in shards}) == len(shards)
    assert kinds["row"] and kinds["column"], kinds
    none = plans_to_measure(tasks, 10, 0.5, seed=3, fingerprint="fp", cut_fraction=0.0)
    assert not any("+cut" in it.source for it in none)
    # ids tell row ranges apart
    task = items[0].task
    t = task.tables[0]
    halves = [Plan(task.num_devices, tuple([Shard(t.name, 0, 0, t.dim, 0, cut), Shard(t.name, 1, 0, t.dim, cut, t.rows)]
                                           + [Shard(u.name, 0, 0, u.dim) for u in task.tables[1:]]))
              for cut in (t.rows // 2, t.rows // 2 + 1)]
    assert plan_id(task, halves[0], "fp") != plan_id(task, halves[1], "fp")
    # and caches and replicas: every field of a shard (Plan.key()), where the plain plan keeps the id it had
    whole = Plan(task.num_devices, tuple(Shard(u.name, 0, 0, u.dim) for u in task.tables))
    variants = [whole] + [Plan(task.num_devices, (replace(whole.shards[0], **change), *whole.shards[1:]))
                          for change in ({"cache": 0.2}, {"cache": 0.0}, {"replica": True})]
    assert len({plan_id(task, p, "fp") for p in variants}) == len({p.key() for p in variants}) == 4
    legacy = [(s.table, s.device, s.col_start, s.col_end) for s in sorted(whole.shards, key=lambda s: s.table)]
    assert plan_id(task, whole, "fp") == hashlib.sha1(json.dumps(
        [task.name, [(t.name, t.dim) for t in task.tables], sorted(legacy), "fp"]).encode()).hexdigest()[:16]
    rng = np.random.default_rng(0)
    for it in items:
        assert cut_tables(it.task, it.plan, rng) is not None  # cutting a cut plan again stays valid (validated inside)

    measured = [(it.task, it.plan, analytic.plan_cost(it.task, it.plan)) for it in items[:12]]
    from_plans = cost_data_from_plans(measured)
    rows = [measure_rows(analytic, it, {}, readings)
            for it, readings in zip(items[:12], measure_rounds(analytic, [it.task for it in items[:12]],
                                                                [it.plan for it in items[:12]], 1, list))]
    plans_frame = pd.DataFrame([r[0] for r in rows])
    devices_frame = pd.DataFrame([d for r in rows for d in r[1]])
    from_rows = cost_data_from_rows(plans_frame, devices_frame, tasks)
    np.testing.assert_allclose(from_rows.shard_raw, from_plans.shard_raw)
    with pytest.raises(DataFormatError, match="no column row_starts, row_ends: collected by another version"):
        cost_data_from_rows(plans_frame, devices_frame.drop(columns=["row_starts", "row_ends"]), tasks)
    blocks = [(it.task, s) for it in items[:12] for s in it.plan.shards if s.is_row_range]
    assert blocks
    task, s = blocks[0]
    table = next(t for t in task.tables if t.name == s.table)
    assert any(np.allclose(row[:3], [s.width, s.row_end - s.row_start,
                                     table.pooling_factor * (s.row_end - s.row_start) / table.rows])
               for row in from_plans.shard_raw)


def test_row_heavy_plans_cut_many_tables_row_wise_in_torchrecs_layout(data):
    """collect.row_fraction: plans with a quarter to all of their whole tables in TorchRec's row-wise blocks (as
    TorchRec's full planner cuts most tables), so that the cost models see devices holding many row blocks."""
    from dreamshard.plan import row_blocks

    _, _, tasks = data
    items = plans_to_measure(tasks, 20, 0.5, seed=3, fingerprint="fp", cut_fraction=1.0, row_fraction=1.0)
    assert all(it.source.endswith("+rows") for it in items)  # row-heavy plans take the place of the cut ones
    shares = []
    for it in items:
        validate_plan(it.task, it.plan)
        tables = {t.name: t for t in it.task.tables}
        row_wise = {s.table for s in it.plan.shards if s.is_row_range}
        for name in row_wise:
            shards = [s for s in it.plan.shards if s.table == name]
            assert sorted((s.device, s.row_start, s.row_end) for s in shards) == \
                [(d, a, b) for d, (a, b) in enumerate(row_blocks(tables[name].rows, it.task.num_devices))]
        shares.append(len(row_wise) / len(tables))
    assert max(shares) >= 0.5 and min(shares) > 0, shares
    assert not any("+rows" in it.source for it in plans_to_measure(tasks, 10, 0.5, seed=3, fingerprint="fp"))
