"""Planning scales with the task: no step quadratic in tables or devices (benchmarks/planning_scale.py times it)."""
from __future__ import annotations

import cProfile
import math
import pstats
import time
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

from dreamshard.cli import main
from dreamshard.hardware.comm import Topology, seconds_per_byte, transfer_ms
from dreamshard.memory import MemoryModel
from dreamshard.plan import validate_plan
from dreamshard.sharders import make_sharder
from dreamshard.tables import Table
from dreamshard.tasks import Task

HEURISTICS = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy", "random")


def tables_of(n: int, seed: int = 0) -> list[Table]:
    rng = np.random.default_rng(seed)
    rows = np.exp(rng.uniform(np.log(100), np.log(1e5), n)).astype(int)
    return [Table(f"t{i}", int(r), int(rng.choice([16, 32, 64, 128])), float(rng.uniform(1, 40)))
            for i, r in enumerate(rows)]


def calls_to_plan(task: Task, algo: str = "size_lookup_greedy") -> int:
    """Python function calls made planning `task`: a measure of work that a loaded machine does not change."""
    profile = cProfile.Profile()
    plan = profile.runcall(make_sharder(algo).shard, task)
    validate_plan(task, plan)
    return pstats.Stats(profile).total_calls  # type: ignore[attr-defined]


def padded(tables: list[Table], num_devices: int, fill: float, cut: bool = True) -> Task:
    """The tables on `num_devices` devices that they fill to `fill`; with `cut`, two tables larger than a device
    besides, cut into pieces, else whole tables only (--sharding table)."""
    memory = MemoryModel(batch_size=512, reservation=0.15)
    probe = Task.uniform("probe", tables, num_devices, 1000.0, memory=memory)
    gb = sum(probe.table_bytes(i) for i in range(len(tables))) / num_devices / 0.85 / fill / 2**30
    if cut:
        tables = tables + [Table(f"big{i}", int(1.1 * gb * 2**30 / 512), 128, 1.0) for i in range(2)]
    task = Task.uniform("scale", tables, num_devices, gb, memory=memory)
    return task if cut else replace(task, sharding=("table",))


@pytest.mark.parametrize("algo", ["size_lookup_greedy", "random"])
def test_planning_work_is_linear_in_tables_and_devices(algo):
    # the work of planning n and 4n tables (two more cut into pieces): 4x, not 16x; on 16 and 256 devices: about
    # the same, not 16x (a loop over the devices for each table, as first_cut's largest capacity was)
    n = 400
    small = calls_to_plan(padded(tables_of(n), 16, 0.3), algo)
    large = calls_to_plan(padded(tables_of(4 * n), 16, 0.3), algo)
    assert large < 5 * small, (small, large)
    wide = calls_to_plan(padded(tables_of(n), 256, 0.3), algo)
    assert wide < 1.5 * small, (small, wide)


def test_cutting_finer_checks_the_packing_logarithmically_often(monkeypatch):
    # tables of 0.55 of a device, 1.6 per device: each device holds one whole and the rest are cut finer and finer,
    # hundreds of cuts. One packing check (every piece placed) per cut was quadratic; after SINGLE_CUT_PASSES
    # single cuts, each pass cuts as many as all before it
    import dreamshard.sharders.pieces as pieces

    monkeypatch.setattr(pieces, "SINGLE_CUT_WORK", 0)  # as on a large task: small ones cut one at a time longer
    checks, cuts = [], []
    packs, pop = pieces.packs, pieces.Refinable.pop

    def counted_packs(task):
        checks[-1] += 1
        return packs(task)

    def counted_pop(self):
        cuts[-1] += 1
        return pop(self)

    monkeypatch.setattr(pieces, "packs", counted_packs)
    monkeypatch.setattr(pieces.Refinable, "pop", counted_pop)
    for devices in (32, 128):
        checks.append(0)
        cuts.append(0)
        capacity = Task.uniform("probe", [Table("a", 10, 4, 1.0)], devices, 1.0).capacity(0)
        tables = [Table(f"t{i}", int(0.55 * capacity / 512), 128, 1.0) for i in range(devices * 16 // 10)]
        task = Task.uniform("tight", tables, devices, 1.0)
        validate_plan(task, make_sharder("size_greedy").shard(task))
    assert cuts[1] > 3 * cuts[0] > 150, cuts
    for c, k in zip(cuts, checks):
        assert k <= pieces.SINGLE_CUT_PASSES + 2 * math.log2(c) + 2, (checks, cuts)


@pytest.mark.parametrize("algo", HEURISTICS)
def test_the_step_budget_grows_with_the_tables(monkeypatch, algo):
    # with budgets of 100 steps and patience 10 as the fixed defaults, 3000 tables in 1% of memory were "no
    # placement within memory found in 100 steps": the budget allows at least MAX_STEPS_PER_TABLE per table
    import dreamshard.placement as placement

    monkeypatch.setattr(placement, "DEFAULT_MAX_STEPS", 100)
    monkeypatch.setattr(placement, "DEFAULT_PATIENCE", 10)
    task = padded(tables_of(3000), 64, 0.01, cut=False)
    validate_plan(task, make_sharder(algo).shard(task))


def test_the_all_to_all_model_is_linear_in_devices():
    rng = np.random.default_rng(1)
    for trial in range(50):  # the sums over the [n, n] links, as they were taken
        n = int(rng.integers(2, 40))
        topology = Topology(devices_per_host=int(rng.integers(1, 9)))
        hosts = rng.integers(0, 4, n).tolist() if trial % 2 else None
        dims = rng.integers(0, 4096, n).astype(float)
        block = 512 / n * dims * topology.output_bytes
        spb = seconds_per_byte(topology, n, hosts)
        dense = (topology.latency_us * 1e-6 + np.maximum(spb.sum(axis=1) * block, block @ spb)) * 1e3
        np.testing.assert_allclose(transfer_ms(dims, 512, topology, hosts), dense, rtol=1e-12)
    tracemalloc.start()
    start = time.monotonic()
    transfer_ms(np.ones(100_000), 512, Topology())  # a [100000, 100000] float64 matrix was 80 GB
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 * 2**20 and time.monotonic() - start < 1.0


def run(argv, capsys) -> tuple[int, str]:
    start = time.monotonic()
    rc = main(argv)
    assert time.monotonic() - start < 1.0  # refused before any work
    return rc, capsys.readouterr().err


def test_plan_refuses_at_once_what_would_not_finish(tmp_path, capsys, monkeypatch):
    import dreamshard.cli.plan as cli_plan

    monkeypatch.setattr(cli_plan, "MAX_TABLES", 100)  # the limit of a million tables, on a hundred
    monkeypatch.setattr(cli_plan, "MAX_TABLE_DEVICES", 1000)
    tables = tmp_path / "t.csv"
    tables.write_text("name,rows,dim,pooling_factor\n" + "".join(f"t{i},100,16,1\n" for i in range(101)))
    out = tmp_path / "p.json"
    rc, err = run(["plan", "--tables", str(tables), "--devices", "2", "--memory-gb", "1", "-o", str(out)], capsys)
    assert rc == 1 and err.strip().endswith("more than 100 tables, the most this tool accepts (dreamshard.limits)")
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    tables.write_text("name,rows,dim,pooling_factor\n" + "".join(f"t{i},100,16,1\n" for i in range(60)))
    rc, err = run(["plan", "--tables", str(tables), "--devices", "20", "--memory-gb", "1", "-o", str(out)], capsys)
    assert rc == 1 and "more than 50 tables on 20 devices; tables x devices may be at most 1000" in err
    rc, err = run(["plan", "--tables", str(tables), "--devices", "8", "--memory-gb", "1", "--algo", "dreamshard",
                   "--samples", "2000", "--model", str(tmp_path / "none.pt"), "-o", str(out)], capsys)
    assert rc == 1 and "--samples: 2000 samples x 60 tables = 120000 placements is more than 100000" in err
    assert not out.exists()
    # the searches that rate whole plans, past the size they plan in minutes: a time limit, or a refusal
    monkeypatch.setattr(cli_plan, "MAX_TABLES", 2**20)
    monkeypatch.setattr(cli_plan, "MAX_TABLE_DEVICES", 2**30)
    tables.write_text("name,rows,dim,pooling_factor\n" + "".join(f"t{i},100,16,1\n" for i in range(301)))
    rc, err = run(["plan", "--tables", str(tables), "--devices", "8", "--memory-gb", "1", "--algo", "torchrec_full",
                   "-o", str(out)], capsys)
    assert rc == 1 and "301 tables on 8 devices is past the size it plans within minutes (at most 300 tables" in err
    assert "give --time-limit SECONDS" in err and len(err.strip().splitlines()) == 1 and not out.exists()
    rc, err = run(["plan", "--tables", str(tables), "--devices", "128", "--memory-gb", "1", "--algo",
                   "torchrec_model", "-o", str(out)], capsys)  # few enough tables, but on many devices
    assert rc == 1 and "301 tables on 128 devices is past" in err and "tables x devices 25600" in err
    for bad, said in (("0", "expected seconds in (0, 86400], got 0"), ("nan", "got nan")):
        rc, err = run(["plan", "--tables", str(tables), "--devices", "8", "--memory-gb", "1", "--algo", "torchrec",
                       "--time-limit", bad, "-o", str(out)], capsys)
        assert rc == 1 and said in err
    rc, err = run(["plan", "--tables", str(tables), "--devices", "8", "--memory-gb", "1", "--time-limit", "5",
                   "-o", str(out)], capsys)
    assert rc == 1 and "--time-limit: sharder 'size_lookup_greedy' takes no time limit" in err and not out.exists()


def test_too_many_pieces_is_an_error_before_placing_them(monkeypatch):
    import dreamshard.sharders.pieces as pieces
    from dreamshard.errors import DreamShardError, InfeasibleTaskError

    first_cut = pieces.first_cut
    monkeypatch.setattr(pieces, "MAX_PIECES", 50)
    capacity = Task.uniform("probe", [Table("a", 10, 4, 1.0)], 32, 1.0).capacity(0)
    tables = [Table(f"t{i}", int(1.5 * capacity / 512), 128, 1.0) for i in range(4)]  # each cut row-wise: 32 pieces
    task = replace(Task.uniform("many", tables, 32, 1.0), sharding=("table", "row"))
    cut = []
    monkeypatch.setattr(pieces, "first_cut", lambda t, *a: cut.append(t.name) or first_cut(t, *a))
    with pytest.raises(DreamShardError, match=r"'many': 4 tables cut into at least 64 pieces, more than 50, the "
                                              "most") as caught:
        make_sharder("size_greedy").shard(task)
    assert not isinstance(caught.value, InfeasibleTaskError)
    assert cut == ["t0", "t1"]  # refused as soon as the count passes the limit: the other tables are not cut


def test_the_cut_search_refuses_before_building_what_the_machine_cannot_hold(monkeypatch):
    """dreamshard_cut scores every piece of every cut (row-wise: a block per device): past the memory available,
    one clear error before any piece is built, not an out-of-memory kill."""
    import torch

    import dreamshard.limits as limits
    import dreamshard.sharders.cuts as cuts
    from dreamshard.errors import DreamShardError
    from dreamshard.learning.cost_model import CostNetConfig
    from dreamshard.learning.features import NUM_FEATURES, FeatureScaler
    from dreamshard.learning.policy import LearnedModel, PolicyNetConfig

    gen = torch.Generator().manual_seed(0)
    scaler = FeatureScaler.fit(np.abs(np.random.default_rng(0).normal(size=(64, NUM_FEATURES))) * 100)
    model = LearnedModel(CostNetConfig().build(gen), PolicyNetConfig().build(gen), scaler, {})
    task = padded(tables_of(40), 16, 0.5)
    task = replace(task, tables=tuple(replace(t, bins=tuple([1.0] + [0.0] * 16)) for t in task.tables))
    built = []
    monkeypatch.setattr(cuts._Universe, "build", classmethod(lambda cls, *a: built.append(a) or 1 / 0))
    monkeypatch.setattr(limits, "available_memory_bytes", lambda: 40 * 16 * limits.BYTES_PER_CUT_PIECE)
    with pytest.raises(DreamShardError, match=r"dreamshard_cut: scoring \d+ pieces .* would need about .* GiB of "
                                              r"memory, but .* available; plan fewer tables or devices"):
        make_sharder("dreamshard_cut", model=model).shard(task)
    assert not built
