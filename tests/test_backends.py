"""Cost backends and what is built on them: the analytic model, the all-to-all model, lower
bounds, the `dreamshard measure` command and the lookup sources the kernels read.

Everything runs on the deterministic `analytic` backend and on small hand-made or
generated tables; no kernel runs.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dreamshard.bounds import (
    MIXED,
    SUB_ADDITIVE,
    SUPER_ADDITIVE,
    additivity_ratio,
    lower_bound,
    regime_of,
    whole_shards,
)
from dreamshard.cli import main
from dreamshard.dlrm_data import (
    SyntheticConfig,
    TableProfile,
    generate_lookups,
    sample_table_profiles,
    table_seed,
    table_statistics,
)
from dreamshard.errors import DataFormatError
from dreamshard.evaluate import exhaustive_optimum
from dreamshard.hardware import make_backend
from dreamshard.hardware.analytic import AnalyticBackend, AnalyticConfig, cold_fraction
from dreamshard.hardware.base import ComputeCost
from dreamshard.hardware.comm import Topology, assemble_plan_cost, communication_ms, transfer_ms
from dreamshard.lookups import DEFAULT_ZIPF_ALPHA, GeneratedLookups, RecordedLookups, resize_batch
from dreamshard.memory import MemoryModel
from dreamshard.plan import Plan, Shard, validate_plan
from dreamshard.requests import TableRequests
from dreamshard.sampling import TaskFamily, sample_tasks, split_table_pools
from dreamshard.sharders import HEURISTICS, make_sharder
from dreamshard.tables import BIN_COLUMNS, Table, access_count_bins
from dreamshard.tasks import Task

# ---------------------------------------------------------------- small hand-made tables

# Large enough working sets (touched rows x dim x 4 B, several MiB each against the 8 MiB
# cache) that the super-additive regime's cache pressure outweighs the launch cost fusion saves.
BIG = [
    Table("big0", 100_000, 64, 20.0),
    Table("big1", 50_000, 128, 10.0),
    Table("big2", 200_000, 32, 30.0),
    Table("big3", 80_000, 64, 5.0),
]
# Tiny tables: the cache is no issue, the per-operator launch dominates.
SMALL = [
    Table("s0", 100, 4, 1.0),
    Table("s1", 500, 8, 2.0),
    Table("s2", 1_000, 16, 0.5),
]


def backend(regime: str = "super_additive", batch_size: int = 2048, topology: Topology | None = None) -> AnalyticBackend:
    return AnalyticBackend(AnalyticConfig(regime=regime, batch_size=batch_size, topology=topology or Topology()))


@pytest.fixture
def big_task() -> Task:
    return Task.uniform("big", BIG, 2, 1.0)


@pytest.fixture
def small_task() -> Task:
    return Task.uniform("small", SMALL, 2, 1.0)


# ---------------------------------------------------------------- analytic backend


@pytest.mark.parametrize("regime", ["super_additive", "sub_additive"])
def test_analytic_is_deterministic_positive_and_labelled(big_task, regime):
    b = backend(regime)
    plan = make_sharder("size_greedy").shard(big_task)
    first, second = b.plan_cost(big_task, plan), b.plan_cost(big_task, plan)
    assert first == second
    assert backend(regime).plan_cost(big_task, plan) == first  # a fresh backend: no hidden state
    assert first.backend == "analytic" and b.name == "analytic"
    assert first.measured is False and b.measured is False
    assert "analytic" in first.device_name and "analytic" in b.device_name()
    assert regime in b.device_name()
    assert first.comm == "model"
    assert len(first.devices) == 2
    for d in first.devices:
        assert d.fwd_ms > 0 and d.bwd_ms > 0 and d.fwd_comm_ms > 0 and d.bwd_comm_ms > 0
    assert first.cost_ms == max(d.fwd_ms + d.bwd_ms + d.fwd_comm_ms + d.bwd_comm_ms for d in first.devices)
    for s in whole_shards(big_task):
        c = b.compute_cost(big_task, [s])
        assert c.fwd_ms > 0 and c.bwd_ms > 0
        assert c == b.compute_cost(big_task, [s])


def test_analytic_empty_device_costs_nothing(big_task):
    for regime in ("super_additive", "sub_additive"):
        assert backend(regime).compute_cost(big_task, []) == ComputeCost(0.0, 0.0)
    assert backend().compute_cost(big_task, []).total_ms == 0.0


def test_analytic_single_table_matches_the_documented_formula():
    # 1000 rows, dim 8, pooling 2, no bins -> cold fraction 0.5; batch 100:
    # lookups 200, touched rows min(1000, 200 x 0.5) = 100, working set 100 x 8 x 4 B = 3200 B
    t = Table("a", 1_000, 8, 2.0)
    task = Task.uniform("one", [t], 1, 1.0)
    assert cold_fraction(t) == 0.5
    cost = backend("super_additive", batch_size=100).compute_cost(task, whole_shards(task))
    miss = 1 + 0.6 * 3200 / (8 * 2**20)
    work_us = (200 * 8 * 1.0 * miss + 100 * 8 * 0.5) / 1000
    update_us = 100 * 8 * 2.0 / 1000
    assert cost.fwd_ms == pytest.approx((50 + work_us) / 1000, rel=1e-12)
    assert cost.bwd_ms == pytest.approx((50 + 1.5 * work_us + update_us) / 1000, rel=1e-12)


def test_cold_fraction_from_bins():
    every_row_once = (1.0,) + (0.0,) * 16
    assert cold_fraction(Table("once", 100, 4, 1.0, every_row_once)) == 1.0
    half_at_4 = (0.5, 0.0, 0.5) + (0.0,) * 14  # mean count 0.5 x 1 + 0.5 x 4 = 2.5
    assert cold_fraction(Table("h", 100, 4, 1.0, half_at_4)) == pytest.approx(1 / 2.5)


def test_fusion_is_super_additive_in_the_super_additive_regime(big_task):
    b = backend("super_additive")
    shards = whole_shards(big_task)
    fused = b.compute_cost(big_task, shards).total_ms
    single = sum(b.compute_cost(big_task, [s]).total_ms for s in shards)
    assert fused > single
    assert additivity_ratio(b, big_task) == pytest.approx(fused / single)
    assert additivity_ratio(b, big_task) > 1.0


@pytest.mark.parametrize("tables", [BIG, SMALL], ids=["big", "small"])
def test_fusion_is_sub_additive_in_the_sub_additive_regime(tables):
    task = Task.uniform("t", tables, 2, 1.0)
    b = backend("sub_additive")
    shards = whole_shards(task)
    fused = b.compute_cost(task, shards).total_ms
    single = sum(b.compute_cost(task, [s]).total_ms for s in shards)
    assert fused < single
    # the saving is exactly the launches of the operators not run: (n - 1) x (fwd + bwd launch)
    assert single - fused == pytest.approx((len(shards) - 1) * 2 * 50 / 1000)
    assert additivity_ratio(b, task) < 1.0


def test_analytic_config_rejects_bad_values():
    with pytest.raises(ValueError, match="regime: expected one of super_additive, sub_additive, got 'tpu'$"):
        AnalyticConfig(regime="tpu")
    with pytest.raises(ValueError, match="named by what fusion does, not by hardware"):
        AnalyticConfig(regime="cpu")
    with pytest.raises(TypeError, match="regime"):
        AnalyticConfig()  # no default: which regime real kernels are in depends on the processor
    with pytest.raises(ValueError, match="batch_size"):
        AnalyticConfig(regime="sub_additive", batch_size=0)


def test_make_backend_builds_the_analytic_backend():
    topo = Topology(devices_per_host=2)
    b = make_backend("analytic", GeneratedLookups(), topo, batch_size=512, regime="sub_additive")
    assert isinstance(b, AnalyticBackend)
    assert b.config.batch_size == 512 and b.config.regime == "sub_additive" and b.config.topology == topo
    with pytest.raises(ValueError, match="unknown cost backend"):
        make_backend("abacus", GeneratedLookups())


# ---------------------------------------------------------------- communication model


def test_transfer_two_devices_on_one_host():
    # B = 1000 over 2 devices: blocks of 500 samples; 4 B per element; 100 GB/s; 10 us latency
    topo = Topology(devices_per_host=8, intra_host_gbps=100.0, inter_host_gbps=1.0, latency_us=10.0, output_bytes=4)
    # device 0 sends 500 x 64 x 4 = 128,000 B (1.28 us) and receives 500 x 32 x 4 = 64,000 B (0.64 us);
    # device 1 the reverse: both take latency + 1.28 us = 11.28 us
    np.testing.assert_allclose(transfer_ms([64, 32], 1000, topo), [0.01128, 0.01128], rtol=1e-12)


def test_transfer_four_devices_on_two_hosts():
    # hosts {0, 1} and {2, 3}; intra 100 GB/s, inter 10 GB/s; 5 us latency; 2 B per element
    topo = Topology(devices_per_host=2, intra_host_gbps=100.0, inter_host_gbps=10.0, latency_us=5.0, output_bytes=2)
    # B = 800 over 4 devices: a block is 200 samples x dim x 2 B = 400 x dim B -> 6400, 12800, 19200, 25600
    # d0: send 6400/100e9 + 2 x 6400/10e9 = 1.344 us; recv 12800/100e9 + (19200 + 25600)/10e9 = 4.608 us
    # d1: send 12800/100e9 + 2 x 12800/10e9 = 2.688 us; recv 6400/100e9 + (19200 + 25600)/10e9 = 4.544 us
    # d2: send 19200/100e9 + 2 x 19200/10e9 = 4.032 us; recv 25600/100e9 + (6400 + 12800)/10e9 = 2.176 us
    # d3: send 25600/100e9 + 2 x 25600/10e9 = 5.376 us; recv 19200/100e9 + (6400 + 12800)/10e9 = 2.112 us
    expected = np.array([5 + 4.608, 5 + 4.544, 5 + 4.032, 5 + 5.376]) / 1000
    transfer = transfer_ms([16, 32, 48, 64], 800, topo)
    np.testing.assert_allclose(transfer, expected, rtol=1e-12)

    fwd = [1.0, 2.5, 0.5, 2.0]  # device 1 is the slowest: the others wait for it
    fwd_comm, bwd_comm = communication_ms(fwd, [16, 32, 48, 64], 800, topo)
    np.testing.assert_allclose(fwd_comm, np.array([1.5, 0.0, 2.0, 0.5]) + expected, rtol=1e-12)
    np.testing.assert_allclose(bwd_comm, expected, rtol=1e-12)


def test_one_device_has_no_communication():
    topo = Topology()
    np.testing.assert_array_equal(transfer_ms([128], 4096, topo), [0.0])
    fwd_comm, bwd_comm = communication_ms([3.0], [128], 4096, topo)
    np.testing.assert_array_equal(fwd_comm, [0.0])
    np.testing.assert_array_equal(bwd_comm, [0.0])


def test_communication_grows_with_dims_and_batch():
    topo = Topology()
    base = transfer_ms([32, 32], 1024, topo)
    assert (transfer_ms([64, 64], 1024, topo) > base).all()
    assert (transfer_ms([32, 32], 2048, topo) > base).all()
    # a device alone on its host pays the slow link
    assert transfer_ms([32, 32], 1024, Topology(devices_per_host=1))[0] > base[0]


@pytest.mark.parametrize("kwargs", [dict(devices_per_host=0), dict(intra_host_gbps=0.0), dict(inter_host_gbps=-1.0),
                                    dict(latency_us=-1.0), dict(output_bytes=0)])
def test_topology_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match="topology"):
        Topology(**kwargs)


def test_assemble_plan_cost_adds_the_all_to_all():
    topo = Topology(devices_per_host=8, intra_host_gbps=100.0, latency_us=10.0, output_bytes=4)
    tables = [Table("a", 1000, 16, 1.0), Table("b", 1000, 32, 1.0), Table("c", 1000, 8, 1.0)]
    task = Task.uniform("asm", tables, 2, 1.0)
    # table b split by columns: [0, 16) on device 0, [16, 32) on device 1 -> dim sums 16 + 16 = 32 and 16 + 8 = 24
    plan = Plan(2, (Shard("a", 0, 0, 16), Shard("b", 0, 0, 16), Shard("b", 1, 16, 32), Shard("c", 1, 0, 8)))
    validate_plan(task, plan)
    compute = [ComputeCost(2.0, 3.0), ComputeCost(1.0, 1.5)]
    cost = assemble_plan_cost(backend(), plan, compute, 1000, topo)
    # blocks 500 x 32 x 4 = 64,000 B and 500 x 24 x 4 = 48,000 B; each device: 10 us + 0.64 us
    transfer = 0.01064
    assert cost.devices[0].fwd_ms == 2.0 and cost.devices[0].bwd_ms == 3.0
    assert cost.devices[1].fwd_ms == 1.0 and cost.devices[1].bwd_ms == 1.5
    assert cost.devices[0].fwd_comm_ms == pytest.approx(transfer, rel=1e-12)
    assert cost.devices[1].fwd_comm_ms == pytest.approx(1.0 + transfer, rel=1e-12)  # waits 1 ms for device 0
    assert cost.devices[0].bwd_comm_ms == pytest.approx(transfer, rel=1e-12)
    assert cost.devices[1].bwd_comm_ms == pytest.approx(transfer, rel=1e-12)
    assert cost.cost_ms == pytest.approx(5.0 + 2 * transfer, rel=1e-12)
    assert (cost.backend, cost.measured, cost.comm) == ("analytic", False, "model")
    assert cost.device_name == backend().device_name()


def test_analytic_plan_cost_is_compute_plus_modelled_comm(big_task):
    topo = Topology(devices_per_host=1)
    b = backend("super_additive", 1024, topo)
    plan = Plan.from_assignment(big_task, [0, 1, 1, 0])
    cost = b.plan_cost(big_task, plan)
    compute = [b.compute_cost(big_task, plan.device_shards(d)) for d in range(2)]
    fwd_comm, bwd_comm = b.communication_cost([c.fwd_ms for c in compute], [64 + 64, 128 + 32])
    for d in range(2):
        assert cost.devices[d].fwd_ms == compute[d].fwd_ms and cost.devices[d].bwd_ms == compute[d].bwd_ms
        assert cost.devices[d].fwd_comm_ms == pytest.approx(fwd_comm[d])
        assert cost.devices[d].bwd_comm_ms == pytest.approx(bwd_comm[d])


# ---------------------------------------------------------------- lower bounds

DIMS = [4, 8, 16, 32, 64]


def synthetic_stats(num_tables: int, seed: int, batch: int = 512, max_rows: int = 50_000) -> pd.DataFrame:
    """A data/tables.parquet-like frame of generated tables (statistics of real generated lookups)."""
    cfg = SyntheticConfig(num_tables=num_tables, batch_size=batch, max_rows=max_rows, seed=seed)
    rows = []
    for i, p in enumerate(sample_table_profiles(cfg)):
        idx, lengths = generate_lookups(p, batch, table_seed(seed, f"t{i}"))
        s = table_statistics(idx, lengths)
        rows.append({"table_id": i, "name": f"gen{seed}/t{i:03d}", "rows": s.rows,
                     "pooling_factor": s.pooling_factor, **dict(zip(BIN_COLUMNS, s.bins))})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def sampled_tasks() -> list[Task]:
    stats = synthetic_stats(40, seed=5)
    pool, _ = split_table_pools(stats["table_id"].tolist(), 0.25, 0)
    rng = np.random.default_rng(1)
    tasks = []
    for fam in (TaskFamily("b-10-2", 10, 2, 0.02, 0, 0), TaskFamily("b-12-4", 12, 4, 0.02, 0, 0),
                TaskFamily("b-20-3", 20, 3, 0.05, 0, 0)):
        tasks += sample_tasks(stats, pool, fam, 3, "train", DIMS, MemoryModel(), rng)
    return tasks


BOUND_BACKENDS = {
    "super_additive": dict(regime="super_additive", batch_size=2048),
    "sub_additive": dict(regime="sub_additive", batch_size=2048),
    "super_additive-2-per-host": dict(regime="super_additive", batch_size=1024, topology=Topology(devices_per_host=2)),
    "sub_additive-2-per-host": dict(regime="sub_additive", batch_size=4096, topology=Topology(devices_per_host=2)),
}


@pytest.mark.parametrize("name", sorted(BOUND_BACKENDS))
def test_lower_bound_is_below_every_sharders_plan(sampled_tasks, name):
    b = backend(**BOUND_BACKENDS[name])
    regime = regime_of([additivity_ratio(b, t) for t in sampled_tasks])
    if b.config.regime == "sub_additive":
        assert regime == SUB_ADDITIVE
    else:
        assert regime in (SUPER_ADDITIVE, MIXED)
    sharders = [make_sharder(h, seed=3) for h in HEURISTICS]
    for task in sampled_tasks:
        bound = lower_bound(b, task, regime, b.config.batch_size, b.config.topology)
        assert bound.total_ms > 0
        assert bound.total_ms == pytest.approx(max(bound.compute_mean_ms + 2 * bound.transfer_mean_ms,
                                                   bound.max_table_ms))
        assert bound.transfer_mean_ms > 0
        for sharder in sharders:
            plan = sharder.shard(task)
            validate_plan(task, plan)
            cost = b.plan_cost(task, plan).cost_ms
            assert bound.total_ms <= cost * (1 + 1e-9), (task.name, sharder.name, bound, cost)


@pytest.mark.parametrize("regime_name", ["super_additive", "sub_additive"])
@pytest.mark.parametrize("num_tables", [6, 8])
def test_lower_bound_is_below_the_exhaustive_optimum(regime_name, num_tables):
    stats = synthetic_stats(12, seed=11, max_rows=20_000)
    rng = np.random.default_rng(num_tables)
    fam = TaskFamily("ex", num_tables, 2, 0.01, 0, 0)
    task = sample_tasks(stats, stats["table_id"].tolist(), fam, 1, "test", DIMS, MemoryModel(), rng)[0]
    b = backend(regime_name, batch_size=2048)
    regime = regime_of([additivity_ratio(b, task)])
    result = exhaustive_optimum(b, task, b.config.batch_size, b.config.topology, regime)
    # the optimum is a real plan, costed exactly as the backend costs it
    validate_plan(task, result.optimum_plan)
    assert result.optimum.cost_ms == pytest.approx(b.plan_cost(task, result.optimum_plan).cost_ms)
    assert result.optimum.cost_ms == min(result.costs.values())
    assert len(result.costs) <= 2 ** (num_tables - 1)  # identical devices: each split counted once
    assert result.bound == lower_bound(b, task, regime, b.config.batch_size, b.config.topology)
    assert result.bound.total_ms <= result.optimum.cost_ms * (1 + 1e-9)
    for h in HEURISTICS:
        plan = make_sharder(h).shard(task)
        cost = b.plan_cost(task, plan).cost_ms
        assert result.cost_of(plan) == pytest.approx(cost)
        assert result.optimum.cost_ms <= cost * (1 + 1e-9)


def test_regime_of_lists_of_ratios():
    assert regime_of([1.0, 1.2, 3.0]) == SUPER_ADDITIVE
    assert regime_of([0.5, 0.99]) == SUB_ADDITIVE
    assert regime_of([0.9, 1.1]) == MIXED
    assert regime_of([1.0]) == SUPER_ADDITIVE  # exactly additive counts as super-additive
    assert regime_of([0.999999]) == SUB_ADDITIVE


def test_single_device_bound_has_no_transfer():
    task = Task.uniform("one", BIG, 1, 1.0)
    b = backend("sub_additive")
    bound = lower_bound(b, task, SUB_ADDITIVE, 2048, Topology())
    fused = b.compute_cost(task, whole_shards(task)).total_ms
    assert bound.transfer_mean_ms == 0.0
    assert bound.total_ms == pytest.approx(fused)  # one device: the bound is the plan's cost
    assert bound.total_ms == pytest.approx(b.plan_cost(task, Plan.from_assignment(task, [0] * 4)).cost_ms)


# ---------------------------------------------------------------- `dreamshard measure`

CLI_TABLES = pd.DataFrame({
    "name": [f"emb_{i}" for i in range(8)],
    "rows": [20_000, 100, 5_000, 70_000, 1_000, 30_000, 250, 9_999],
    "dim": [32, 4, 16, 32, 64, 8, 12, 48],
    "pooling_factor": [1.0, 0.2, 15.5, 3.0, 40.0, 7.25, 100.0, 2.5],
})


@pytest.fixture
def planned(tmp_path, capsys) -> tuple[Path, Path]:
    tables = tmp_path / "tables.csv"
    CLI_TABLES.to_csv(tables, index=False)
    plan = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(tables), "--devices", "3", "--memory-gb", "0.05",
                 "--algo", "lookup_greedy", "-o", str(plan)]) == 0
    capsys.readouterr()
    return tables, plan


def measure(tables: Path, plan: Path, *extra: str) -> list[str]:
    return ["measure", "--tables", str(tables), "--plan", str(plan), "--backend", "analytic",
            "--regime", "super_additive", *extra]


def one_line_error(argv, capsys) -> str:
    rc = main(argv)
    captured = capsys.readouterr()
    assert rc == 1
    assert "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("dreamshard: error: ")
    assert captured.out == ""
    return lines[0]


def test_measure_json_with_the_analytic_backend(planned, capsys):
    tables, plan = planned
    assert main(measure(tables, plan, "--json", "--batch-size", "1024")) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"cost_ms", "backend", "device", "devices"} <= set(out)
    assert out["backend"] == "analytic"
    assert "analytic" in out["device"]
    assert out["measured"] is False
    assert out["batch_size"] == 1024
    assert len(out["devices"]) == 3
    for d in out["devices"]:
        assert set(d) == {"fwd_ms", "bwd_ms", "fwd_comm_ms", "bwd_comm_ms"}
        assert all(v >= 0 for v in d.values())
    assert out["cost_ms"] == pytest.approx(max(sum(d.values()) for d in out["devices"]))
    # the same number as the library gives for this task and plan
    task = Task.uniform("tables", [Table(r.name, r.rows, r.dim, r.pooling_factor) for r in CLI_TABLES.itertuples()],
                        3, 0.05)
    expected = backend("super_additive", 1024).plan_cost(task, Plan.load_json(plan))
    assert out["cost_ms"] == pytest.approx(expected.cost_ms)


def test_measure_analytic_needs_a_regime(planned, capsys):
    tables, plan = planned
    argv = measure(tables, plan)
    del argv[argv.index("--regime"): argv.index("--regime") + 2]
    assert "--regime super_additive or sub_additive" in one_line_error(argv, capsys)


def test_measure_table_output(planned, capsys):
    tables, plan = planned
    assert main(measure(tables, plan)) == 0
    out = capsys.readouterr().out
    assert "analytic" in out and "modelled, not measured" in out
    assert "cost (slowest device)" in out
    assert len([ln for ln in out.splitlines() if ln.split() and ln.split()[0].isdigit()]) == 3


def test_measure_missing_plan_file(planned, capsys):
    tables, plan = planned
    line = one_line_error(measure(tables, plan.parent / "absent.json"), capsys)
    assert "absent.json" in line and "no such file" in line


def test_measure_plan_not_json(planned, capsys):
    tables, plan = planned
    plan.write_text("{ this is not json")
    line = one_line_error(measure(tables, plan), capsys)
    assert "plan.json" in line and "not valid JSON" in line


@pytest.mark.parametrize("content, words", [
    ("[1, 2, 3]", ["expected a JSON object"]),
    ('{"num_devices": 0, "shards": []}', ["num_devices"]),
    ('{"num_devices": 2, "shards": [{"table": "emb_0", "device": "zero", "col_start": 0, "col_end": 32}]}',
     ["shards[0].device"]),
])
def test_measure_malformed_plan_objects(planned, capsys, content, words):
    tables, plan = planned
    plan.write_text(content)
    line = one_line_error(measure(tables, plan), capsys)
    for w in words:
        assert w in line


def test_measure_plan_with_an_unknown_table(planned, capsys):
    tables, plan = planned
    obj = json.loads(plan.read_text())
    obj["shards"][0]["table"] = "no_such_table"
    plan.write_text(json.dumps(obj))
    line = one_line_error(measure(tables, plan), capsys)
    assert "unknown table" in line and "no_such_table" in line


def test_measure_plan_missing_a_table(planned, capsys):
    tables, plan = planned
    obj = json.loads(plan.read_text())
    dropped = obj["shards"].pop(2)["table"]
    plan.write_text(json.dumps(obj))
    line = one_line_error(measure(tables, plan), capsys)
    assert dropped in line and "not placed" in line


def test_measure_plan_without_memory(planned, capsys):
    tables, plan = planned
    obj = json.loads(plan.read_text())
    del obj["memory_gb"]
    plan.write_text(json.dumps(obj))
    assert "--memory-gb" in one_line_error(measure(tables, plan), capsys)
    assert main(measure(tables, plan, "--memory-gb", "0.05")) == 0


def test_measure_plan_over_memory(planned, capsys):
    tables, plan = planned
    line = one_line_error(measure(tables, plan, "--memory-gb", "0.001"), capsys)
    assert "capacity" in line


@pytest.mark.parametrize("write, words", [
    (lambda p: CLI_TABLES.drop(columns=["rows"]).to_csv(p, index=False), ["missing column", "rows"]),
    (lambda p: p.write_text("name,rows,dim,pooling_factor\n"), ["no tables"]),
    (lambda p: CLI_TABLES.assign(dim=[6] + [4] * 7).to_csv(p, index=False), ["emb_0", "multiple of 4"]),
    (lambda p: None, ["no such file"]),
])
def test_measure_bad_tables_file(planned, capsys, tmp_path, write, words):
    _, plan = planned
    bad = tmp_path / "bad_tables.csv"
    write(bad)
    line = one_line_error(measure(bad, plan), capsys)
    assert "bad_tables.csv" in line
    for w in words:
        assert w in line


# ---------------------------------------------------------------- lookups


def stat_table(name: str, rows: int, pooling: float, alpha: float, batch: int = 1024, seed: int = 0,
               dim: int = 8) -> Table:
    """A table whose bins are those of lookups generated with Zipf exponent `alpha`."""
    idx, _ = generate_lookups(TableProfile(rows, pooling, alpha), batch, seed)
    _, counts = np.unique(idx, return_counts=True)
    return Table(name, rows, dim, pooling, tuple(access_count_bins(counts)))


def test_generated_lookups_are_seeded_and_well_formed():
    t = stat_table("g", 5_000, 6.0, 0.9)
    a = GeneratedLookups(seed=3).lookups(t, 300)
    b = GeneratedLookups(seed=3).lookups(t, 300)
    c = GeneratedLookups(seed=4).lookups(t, 300)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    assert not (len(a.indices) == len(c.indices) and np.array_equal(a.indices, c.indices))
    for req, batch in ((a, 300), (GeneratedLookups().lookups(t, 17), 17)):
        assert req.batch_size == batch
        assert int(req.lengths.sum()) == len(req.indices)
        assert (req.indices >= 0).all() and (req.indices < t.rows).all()
        assert req.indices.dtype == np.int64
    assert a.lengths.mean() == pytest.approx(6.0, rel=0.2)


def test_generated_lookups_depend_on_the_table_name_not_on_order():
    t1, t2 = stat_table("first", 2_000, 4.0, 0.6), stat_table("second", 2_000, 4.0, 0.6)
    src = GeneratedLookups(seed=1)
    x1 = src.lookups(t1, 100)
    src.lookups(t2, 100)
    y1 = GeneratedLookups(seed=1)
    y1.lookups(t2, 100)
    np.testing.assert_array_equal(y1.lookups(t1, 100).indices, x1.indices)


@pytest.mark.parametrize("alpha", [0.4, 1.2])
@pytest.mark.parametrize("rows, pooling", [(5_000, 5.0), (20_000, 10.0)])
def test_fitted_zipf_exponent_recovers_the_generating_one(alpha, rows, pooling):
    batch = 512
    t = stat_table(f"z{alpha}-{rows}", rows, pooling, alpha, batch=batch, seed=7)
    fitted = GeneratedLookups().zipf_alpha(t, batch)
    assert abs(fitted - alpha) <= 0.2, fitted


def test_zipf_exponent_without_bins_is_the_default():
    assert GeneratedLookups().zipf_alpha(Table("nobins", 1000, 8, 3.0), 256) == DEFAULT_ZIPF_ALPHA
    req = GeneratedLookups().lookups(Table("nobins", 1000, 8, 3.0), 64)
    assert req.batch_size == 64 and (req.indices < 1000).all()


def test_resize_batch_cycles_and_truncates():
    # sample 0 reads [1, 2], sample 1 nothing, sample 2 reads [5, 6, 7]
    req = TableRequests(np.array([1, 2, 5, 6, 7], dtype=np.int64), np.array([2, 0, 3], dtype=np.int64))
    bigger = resize_batch(req, 7)
    np.testing.assert_array_equal(bigger.lengths, [2, 0, 3, 2, 0, 3, 2])
    np.testing.assert_array_equal(bigger.indices, [1, 2, 5, 6, 7, 1, 2, 5, 6, 7, 1, 2])
    smaller = resize_batch(req, 2)
    np.testing.assert_array_equal(smaller.lengths, [2, 0])
    np.testing.assert_array_equal(smaller.indices, [1, 2])
    same = resize_batch(req, 3)
    np.testing.assert_array_equal(same.indices, req.indices)
    np.testing.assert_array_equal(same.lengths, req.lengths)
    empty_lookups = resize_batch(TableRequests(np.zeros(0, np.int64), np.zeros(2, np.int64)), 5)
    assert empty_lookups.batch_size == 5 and len(empty_lookups.indices) == 0
    with pytest.raises(ValueError, match="empty batch"):
        resize_batch(TableRequests(np.zeros(0, np.int64), np.zeros(0, np.int64)), 4)


def test_recorded_lookups_resize_by_table_name():
    req = TableRequests(np.array([3, 1, 4, 1, 5], dtype=np.int64), np.array([1, 1, 3], dtype=np.int64))
    src = RecordedLookups({"rec": req})
    t = Table("rec", 10, 4, 1.0)
    out = src.lookups(t, 5)
    np.testing.assert_array_equal(out.lengths, [1, 1, 3, 1, 1])
    np.testing.assert_array_equal(out.indices, [3, 1, 4, 1, 5, 3, 1])
    assert int(out.lengths.sum()) == len(out.indices)
    np.testing.assert_array_equal(src.lookups(t, 1).indices, [3])
    with pytest.raises(DataFormatError, match="'other'"):
        src.lookups(Table("other", 10, 4, 1.0), 5)
