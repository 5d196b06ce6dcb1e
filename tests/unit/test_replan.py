"""Re-planning that moves little (dreamshard.sharders.replan, `dreamshard plan --previous`): moved bytes exact, the move
limit respected, never worse than keeping everything, the full re-plan's cost when the budget allows it."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dreamshard.cli import main
from dreamshard.errors import DreamShardError
from dreamshard.hardware.analytic import AnalyticBackend, AnalyticConfig
from dreamshard.memory import GB, MemoryModel
from dreamshard.plan import Plan, Shard, validate_plan
from dreamshard.sharders import make_sharder
from dreamshard.sharders.replan import PiecesTask, coalesce, moved_bytes, replan, surviving_shards
from dreamshard.tables import Table
from dreamshard.tasks import Device, Task

BACKEND = AnalyticBackend(AnalyticConfig(regime="super_additive", batch_size=2048))
INF = float("inf")


def cost(task: Task, plan: Plan) -> float:
    return BACKEND.plan_cost(task, plan).cost_ms


def random_tables(rng: np.random.Generator, n: int, prefix: str = "t") -> list[Table]:
    # pooling factors that keep the largest table from dominating the cost, so that moves matter
    return [Table(f"{prefix}{i}", int(10 ** rng.uniform(2, 5.5)), int(rng.choice([4, 8, 16, 32, 64, 128])),
                  float(rng.lognormal(1.0, 0.6))) for i in range(n)]


def total_bytes(task: Task) -> int:
    return sum(task.table_bytes(i) for i in range(len(task.tables)))


def changed(task: Task, rng: np.random.Generator, add_device: bool, remove: int = 2) -> Task:
    """The task with `remove` tables dropped, 10% new tables, and a device more when `add_device`."""
    kept = [t for i, t in enumerate(task.tables) if i not in set(rng.choice(len(task.tables), remove, replace=False))]
    new = random_tables(rng, max(1, len(task.tables) // 10), prefix="new")
    devices = task.devices + ((task.devices[0],) if add_device else ())
    return replace(task, tables=tuple(kept + new), devices=devices)


# ---------------------------------------------------------------- moved_bytes on hand-made cases

T = Table("t", 100, 16, 2.0)
U = Table("u", 50, 8, 1.0)
TASK = Task.uniform("hand", [T, U], 3, 1.0)
SLICE = 100 * 8 * 4  # 100 rows x 8 columns x fp32


def plan(*shards: Shard, n: int = 3) -> Plan:
    return Plan(n, shards)


def test_moved_bytes_of_a_column_slice_partly_kept():
    previous = plan(Shard("t", 0, 0, 8), Shard("t", 1, 8, 16), Shard("u", 2, 0, 8))
    # t whole on device 0: its slice [8, 16) left device 1
    assert moved_bytes(TASK, previous, plan(Shard("t", 0, 0, 16), Shard("u", 2, 0, 8))) == SLICE
    # cut at 4 instead of 8: columns [4, 8) of the slice on device 0 went to device 1; [8, 16) stayed
    now = plan(Shard("t", 0, 0, 4), Shard("t", 1, 4, 16), Shard("u", 2, 0, 8))
    assert moved_bytes(TASK, previous, now) == 100 * 4 * 4
    # the same cells in two shards on one device: nothing moved
    assert moved_bytes(TASK, previous, plan(Shard("t", 0, 0, 4), Shard("t", 0, 4, 8), Shard("t", 1, 8, 16),
                                            Shard("u", 2, 0, 8))) == 0


def test_moved_bytes_of_a_table_moved_whole_and_of_row_ranges():
    previous = plan(Shard("t", 0, 0, 16), Shard("u", 1, 0, 8))
    assert moved_bytes(TASK, previous, plan(Shard("t", 2, 0, 16), Shard("u", 1, 0, 8))) == 100 * 16 * 4
    assert moved_bytes(TASK, previous, plan(Shard("t", 2, 0, 16), Shard("u", 0, 0, 8))) == 100 * 16 * 4 + 50 * 8 * 4
    # rows [0, 40) stay on device 0, rows [40, 100) go to device 1
    rows = plan(Shard("t", 0, 0, 16, 0, 40), Shard("t", 1, 0, 16, 40, 100), Shard("u", 1, 0, 8))
    assert moved_bytes(TASK, previous, rows) == 60 * 16 * 4
    # and back: rows [0, 40) stay on device 0, rows [40, 100) leave device 1
    assert moved_bytes(TASK, rows, previous) == 60 * 16 * 4
    assert moved_bytes(TASK, rows, plan(Shard("t", 1, 0, 16), Shard("u", 1, 0, 8))) == 40 * 16 * 4


def test_moved_bytes_counts_optimizer_state_and_skips_new_removed_and_changed_tables():
    adagrad = replace(TASK, memory=MemoryModel("fp32", "exact_row_wise_adagrad"))  # + one fp32 per row
    previous = plan(Shard("t", 0, 0, 16), Shard("u", 1, 0, 8), Shard("gone", 2, 0, 4))
    assert moved_bytes(adagrad, previous, plan(Shard("t", 2, 0, 16), Shard("u", 1, 0, 8))) == 100 * (16 * 4 + 4)
    # u's dim changed (8 -> 16): its old shard does not tile it, a changed table, not counted
    wider = Task.uniform("hand", [T, replace(U, dim=16)], 3, 1.0)
    assert moved_bytes(wider, previous, plan(Shard("t", 0, 0, 16), Shard("u", 2, 0, 16))) == 0
    # rows changed: the shard of all rows cannot tell, the recorded shapes can
    grown = Task.uniform("hand", [replace(T, rows=200), U], 3, 1.0)
    moved = plan(Shard("t", 1, 0, 16), Shard("u", 1, 0, 8))
    assert moved_bytes(grown, previous, moved) == 200 * 16 * 4
    assert moved_bytes(grown, previous, moved, previous_shapes={"t": (100, 16), "u": (50, 8)}) == 0
    assert surviving_shards(grown, previous, {"t": (100, 16), "u": (50, 8)}).keys() == {"u"}


def test_coalesce_joins_adjacent_blocks_on_one_device():
    p = plan(Shard("t", 0, 8, 16), Shard("t", 0, 0, 8), Shard("u", 1, 0, 8, 0, 20), Shard("u", 1, 0, 8, 20, 50))
    assert coalesce(TASK, p) == plan(Shard("t", 0, 0, 16), Shard("u", 1, 0, 8))


def test_fewer_devices_is_an_error_naming_both_counts():
    previous = plan(Shard("t", 3, 0, 16), Shard("u", 1, 0, 8), n=4)
    with pytest.raises(DreamShardError, match="previous plan is for 4 devices, but the task has 3"):
        replan(TASK, previous, make_sharder("size_greedy"), INF, BACKEND)


# ---------------------------------------------------------------- replan


def some_task(seed: int, n: int = 30, devices: int = 4, memory_gb: float = 0.5) -> Task:
    return Task.uniform(f"replan-{seed}", random_tables(np.random.default_rng(seed), n), devices, memory_gb)


@pytest.mark.parametrize("algo", ["size_lookup_greedy", "lookup_greedy", "random"])
def test_no_changes_move_nothing_and_keep_the_plan(algo):
    sharder = make_sharder(algo)
    task = some_task(1)
    previous = sharder.shard(task)
    for limit in (0, 0.01 * total_bytes(task), INF):
        r = replan(task, previous, sharder, limit, BACKEND)
        assert r.moved_bytes == 0 and r.full_moved_bytes == 0
        assert r.plan == previous
        assert r.cost_ms == pytest.approx(cost(task, previous))


@pytest.mark.parametrize("algo", ["size_lookup_greedy", "random"])
def test_limit_zero_on_a_changed_task_moves_nothing(algo):
    sharder = make_sharder(algo)
    task = some_task(2)
    previous = sharder.shard(task)
    new = changed(task, np.random.default_rng(2), add_device=True)
    r = replan(new, previous, sharder, 0, BACKEND)
    validate_plan(new, r.plan)
    assert r.moved_bytes == 0 == moved_bytes(new, previous, r.plan)
    assert r.full_moved_bytes > 0  # the full re-plan would move shards
    assert r.cost_ms <= r.kept_cost_ms


def test_move_limit_kept_and_cost_never_worse_than_keeping_over_random_tasks():
    """Seeded changes (10% new tables, two removed, sometimes a device added) at several limits."""
    improved = 0
    for seed in range(8):
        rng = np.random.default_rng(100 + seed)
        algo = ["size_lookup_greedy", "lookup_greedy", "size_greedy", "random"][seed % 4]
        sharder = make_sharder(algo)
        task = some_task(100 + seed, n=int(rng.integers(12, 36)), devices=int(rng.integers(2, 6)))
        previous = sharder.shard(task)
        new = changed(task, rng, add_device=bool(seed % 2))
        for fraction in (0.0, 0.02, 0.1, 0.3, INF):
            limit = fraction * total_bytes(new)
            r = replan(new, previous, sharder, limit, BACKEND)
            validate_plan(new, r.plan)
            validate_plan(new, r.full_plan)
            assert r.moved_bytes == moved_bytes(new, previous, r.plan) <= limit
            assert r.full_moved_bytes == moved_bytes(new, previous, r.full_plan)
            assert r.cost_ms == pytest.approx(cost(new, r.plan))
            assert r.cost_ms <= r.kept_cost_ms + 1e-9  # never worse than keeping everything
            assert r.kept_moved_bytes == 0  # nothing forces a move in these tasks
            if fraction == INF:
                assert r.cost_ms <= r.full_cost_ms + 1e-9  # the full re-plan's cost or better
            improved += r.cost_ms < r.kept_cost_ms * 0.99
    assert improved, "no limit ever helped: the search never accepts a move"


def test_a_small_budget_buys_much_of_the_full_re_plan():
    # from 4 devices to 8: keeping everything leaves the new devices to the new tables
    sharder = make_sharder("size_lookup_greedy")
    task = some_task(7, n=40, devices=4, memory_gb=1.0)
    previous = sharder.shard(task)
    new = changed(task, np.random.default_rng(7), add_device=False, remove=2)
    new = replace(new, devices=new.devices * 2)
    r = replan(new, previous, sharder, 0.1 * total_bytes(new), BACKEND)
    assert r.moved_bytes <= 0.1 * total_bytes(new) < r.full_moved_bytes
    assert r.kept_cost_ms > 1.2 * r.full_cost_ms
    assert r.cost_ms < r.kept_cost_ms and r.accepted >= 1 and r.source == "search"
    assert (r.kept_cost_ms - r.cost_ms) > 0.5 * (r.kept_cost_ms - r.full_cost_ms)


def test_pins_that_conflict_with_constraints_move_and_count():
    sharder = make_sharder("size_lookup_greedy")
    task = some_task(3, n=12, devices=4)
    previous = sharder.shard(task)
    on = {s.table: s.device for s in previous.shards}
    a, b, c = (t.name for t in task.tables[:3])
    # a now avoids the device it is on; b and c must share one device; a new table joins
    new = replace(task, tables=task.tables + (Table("fresh", 1000, 16, 3.0),),
                  avoid=((a, (on[a],)),), groups=((b, c),))
    pieces = PiecesTask(new, surviving_shards(new, previous))
    assert a not in pieces.pins
    assert (on[b] == on[c]) == ((b, c) in pieces.units or (c, b) in pieces.units)
    for limit in (0.5 * total_bytes(new), INF):
        r = replan(new, previous, sharder, limit, BACKEND)
        validate_plan(new, r.plan)
        assert r.kept_moved_bytes >= new.table_bytes(0)  # a had to move
        assert r.moved_bytes == moved_bytes(new, previous, r.plan) <= limit
    with pytest.raises(DreamShardError, match="keeping the previous plan's shards in place needs moving"):
        replan(new, previous, sharder, 0, BACKEND)


def test_tables_cut_by_the_previous_plan_are_kept_as_pinned_pieces():
    # a table larger than a device: the previous plan cut it into column slices; they stay where they are
    big = Table("big", 1_000_000, 64, 5.0)  # 0.238 GB at fp32
    task = Task.uniform("cut", [big] + random_tables(np.random.default_rng(4), 10), 4, 0.15)
    sharder = make_sharder("size_lookup_greedy")
    previous = sharder.shard(task)
    assert sum(s.table == "big" for s in previous.shards) > 1
    new = replace(task, tables=task.tables + tuple(random_tables(np.random.default_rng(5), 2, "new")))
    pieces = PiecesTask(new, surviving_shards(new, previous))
    assert sum(p[0] == "big" for p in pieces.pieces.values()) == sum(s.table == "big" for s in previous.shards)
    r = replan(new, previous, sharder, 0, BACKEND)
    validate_plan(new, r.plan)
    assert r.moved_bytes == 0
    assert {s for s in r.plan.shards if s.table == "big"} == {s for s in previous.shards if s.table == "big"}


def test_cuts_the_task_no_longer_allows_are_undone_in_place():
    # the previous plan cut `big` into column slices; now only whole tables are allowed, on larger devices:
    # big is kept whole where most of its bytes were, and the other slices move there
    big = Table("big", 1_000_000, 64, 5.0)  # 0.238 GB at fp32
    task = Task.uniform("cut", [big] + random_tables(np.random.default_rng(4), 10), 4, 0.15)
    sharder = make_sharder("size_lookup_greedy")
    previous = sharder.shard(task)
    slices = [s for s in previous.shards if s.table == "big"]
    assert len(slices) > 1 and all(s.kind(big.rows, big.dim) == "column" for s in slices)
    new = replace(Task.uniform("cut", task.tables, 4, 0.5), sharding=("table",))
    pieces = PiecesTask(new, surviving_shards(new, previous))
    assert "big" in pieces.pins and not pieces.pieces
    r = replan(new, previous, sharder, INF, BACKEND)
    validate_plan(new, r.plan)
    (whole,) = [s for s in r.plan.shards if s.table == "big"]
    assert r.moved_bytes >= min(sum(new.memory.shard_bytes(big.rows, s.width) for s in slices if s.device != d)
                                for d in range(4))


def test_a_sharder_that_ignores_pins_fails_clearly():
    class Unpinned:
        name = "unpinned"

        def shard(self, task: Task) -> Plan:
            return make_sharder("size_lookup_greedy").shard(replace(task, pins=()))

    task = some_task(5, n=16)
    previous = make_sharder("size_greedy").shard(task)
    new = changed(task, np.random.default_rng(5), add_device=True)
    with pytest.raises(DreamShardError, match="does not honour the pins"):
        replan(new, previous, Unpinned(), 0.1 * total_bytes(new), BACKEND)
    with pytest.raises(DreamShardError, match="TorchRec's planner, which cannot keep a shard"):
        replan(new, previous, make_sharder("torchrec"), INF, BACKEND)


# ---------------------------------------------------------------- command line

TABLES = pd.DataFrame({
    "name": [f"emb_{i}" for i in range(16)],
    "rows": [20_000, 100, 5_000, 7_000, 1_000, 30_000, 100, 250, 9_999, 12_000, 40, 3_000, 8_000, 600, 15_000, 2_500],
    "dim": [128, 4, 16, 32, 64, 8, 128, 12, 48, 16, 4, 96, 64, 32, 16, 128],
    "pooling_factor": [3.0, 0.2, 15.5, 3.0, 40.0, 7.25, 1.0, 10.0, 2.5, 1.0, 9.0, 12.0, 6.0, 20.0, 4.0, 8.0],
})
ADDED = pd.DataFrame({"name": ["new_0", "new_1"], "rows": [40_000, 3_000], "dim": [64, 32],
                      "pooling_factor": [25.0, 12.0]})
ANALYTIC = ["--backend", "analytic", "--regime", "super_additive"]


def plan_argv(tables: Path, out: Path, devices: int = 4, *extra: str) -> list[str]:
    return ["plan", "--tables", str(tables), "--devices", str(devices), "--memory-gb", "0.05", "--algo",
            "size_lookup_greedy", "-o", str(out), *extra]


@pytest.fixture
def planned(tmp_path) -> tuple[Path, Path]:
    """The tables file and a plan of it; then the tables file grows by two tables."""
    tables = tmp_path / "tables.csv"
    TABLES.to_csv(tables, index=False)
    previous = tmp_path / "old_plan.json"
    assert main(plan_argv(tables, previous)) == 0
    pd.concat([TABLES, ADDED]).to_csv(tables, index=False)
    return tables, previous


def test_cli_replans_within_the_limit(tmp_path, planned, capsys):
    tables, previous = planned
    capsys.readouterr()
    out = tmp_path / "plan.json"
    argv = plan_argv(tables, out, 5, "--previous", str(previous), "--max-moved-gb", "0.002", *ANALYTIC)
    assert "give --allow-new-tables" in failing(argv, capsys)  # two tables added: said, not assumed
    assert main([*argv, "--allow-new-tables"]) == 0
    stdout = capsys.readouterr().out
    assert "tables since the previous plan: added 2 ('new_0', 'new_1')" in stdout
    line = re.search(r"moved (\S+ \S*B) of 2.05 MiB allowed; cost (\S+) ms \(full re-plan (\S+) ms moving (\S+ \S*B); "
                     r"keeping everything (\S+) ms\), analytic modelled", stdout)
    assert line, stdout
    meta = json.loads(out.read_text())
    rec = meta["replan"]
    assert set(rec) == {"previous", "max_moved_gb", "moved_gb", "full_moved_gb", "cost_ms", "full_cost_ms",
                        "kept_cost_ms", "backend", "measured", "added", "removed", "resized"}
    assert rec["added"] == ["new_0", "new_1"] and rec["removed"] == rec["resized"] == []
    assert rec["previous"] == str(previous) and rec["max_moved_gb"] == 0.002
    assert rec["backend"] == "analytic" and rec["measured"] is False
    assert rec["moved_gb"] <= 0.002 and rec["cost_ms"] <= rec["kept_cost_ms"]
    assert in_bytes(line.group(1)) == pytest.approx(rec["moved_gb"] * GB, rel=5e-3, abs=0.5)
    assert float(line.group(2)) == pytest.approx(rec["cost_ms"], abs=1e-3)
    assert meta["table_shapes"]["new_0"] == [40_000, 64]
    assert meta["num_devices"] == 5
    task = Task.uniform("check", [Table(r.name, r.rows, r.dim, r.pooling_factor)
                                  for r in pd.read_csv(tables).itertuples()], 5, 0.05)
    new_plan = Plan.from_dict(meta)
    validate_plan(task, new_plan)
    old_plan = Plan.load_json(previous)
    assert moved_bytes(task, old_plan, new_plan) / GB == pytest.approx(rec["moved_gb"])
    # zero allowed: nothing moves
    assert main(plan_argv(tables, out, 4, "--previous", str(previous), "--max-moved-gb", "0", *ANALYTIC,
                          "--allow-new-tables")) == 0
    assert json.loads(out.read_text())["replan"]["moved_gb"] == 0
    assert "moved 0 B of 0 B allowed" in capsys.readouterr().out


def in_bytes(text: str) -> float:
    """A size as the re-plan line prints it ("412 B", "2.05 MiB"), in bytes."""
    number, unit = text.split()
    return float(number) * 1024 ** ["B", "KiB", "MiB", "GiB", "TiB", "PiB"].index(unit)


def failing(argv: list[str], capsys) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dreamshard: error: "), err
    return err[0]


def test_cli_errors(tmp_path, planned, capsys):
    tables, previous = planned
    capsys.readouterr()
    out = tmp_path / "plan.json"
    assert "only with --previous" in failing(plan_argv(tables, out, 4, "--max-moved-gb", "1"), capsys)
    # --regime alone chooses the estimate's regime; --backend decides what is worth moving: only in a re-plan
    assert "--backend: only with --previous" in failing(plan_argv(tables, out, 4, *ANALYTIC), capsys)
    err = failing(plan_argv(tables, out, 3, "--previous", str(previous), "--max-moved-gb", "1", *ANALYTIC), capsys)
    assert "the plan is for 4 devices, but 3 are given" in err and str(previous) in err
    assert "needs --regime" in failing(plan_argv(tables, out, 4, "--previous", str(previous), "--max-moved-gb", "1",
                                                 "--backend", "analytic"), capsys)
    assert "needs --max-moved-gb" in failing(plan_argv(tables, out, 4, "--previous", str(previous), *ANALYTIC), capsys)
    assert ">= 0" in failing(plan_argv(tables, out, 4, "--previous", str(previous), "--max-moved-gb=-1", *ANALYTIC),
                             capsys)
    assert "needs --backend" in failing(plan_argv(tables, out, 4, "--previous", str(previous), "--max-moved-gb", "1"),
                                        capsys)
    assert not out.exists()


def test_devices_added_by_devices_file(tmp_path, planned, capsys):
    tables, previous = planned
    devices = tmp_path / "devices.json"
    devices.write_text(json.dumps([{"memory_gb": 0.05}] * 4 + [{"memory_gb": 0.1, "kind": "big"}]))
    out = tmp_path / "plan.json"
    argv = ["plan", "--tables", str(tables), "--devices-file", str(devices), "--algo", "lookup_greedy", "-o", str(out),
            "--previous", str(previous), "--max-moved-gb", "0.01", *ANALYTIC, "--allow-new-tables"]
    assert main(argv) == 0
    meta = json.loads(out.read_text())
    assert meta["num_devices"] == 5 and meta["replan"]["moved_gb"] <= 0.01
    assert [Device(int(d["memory_gb"] * GB)).memory_bytes for d in meta["devices"]][-1] == int(0.1 * GB)
