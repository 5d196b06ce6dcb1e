"""TorchRec interop: the `torchrec` sharders, the ShardingPlan export, TorchRec's perf estimate, the CLI.

Needs torchrec (see docs/torchrec.md for the install); skipped without it. No GPU or
process group is needed: TorchRec plans on the meta device.
"""
from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

torchrec = pytest.importorskip("torchrec", reason="torchrec is not installed (see docs/torchrec.md)")

import torch  # noqa: E402
from torchrec.distributed.sharding_plan import (  # noqa: E402
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_wise,
)
from torchrec.distributed.types import ShardingPlan  # noqa: E402

from dreamshard.cli import main  # noqa: E402
from dreamshard.errors import DreamShardError, InfeasibleTaskError, InvalidPlanError  # noqa: E402
from dreamshard.interop.torchrec import (  # noqa: E402
    DEFAULT_FQN,
    meta_ebc,
    save_torchrec_plan,
    to_torchrec_plan,
    torchrec_perf_estimate,
)
from dreamshard.memory import DEFAULT_BATCH_SIZE, GB, MemoryModel  # noqa: E402
from dreamshard.plan import Plan, Shard, validate_plan  # noqa: E402
from dreamshard.sharders import SHARDERS, make_sharder  # noqa: E402
from dreamshard.sharders.torchrec_planner import TorchRecSharder, from_torchrec_plan  # noqa: E402
from dreamshard.tables import Table  # noqa: E402
from dreamshard.tasks import Device, Task, host_name  # noqa: E402
from helpers import PROJECT_ROOT, brute_force_feasible  # noqa: E402


def random_task(num_tables: int, num_devices: int, memory_gb: float = 5.0, seed: int = 0,
                memory: MemoryModel | None = None) -> Task:
    rng = random.Random(seed)
    tables = [Table(f"t{i}", rng.randint(1_000, 2_000_000), rng.choice([16, 32, 64, 128]), rng.uniform(0.5, 30.0))
              for i in range(num_tables)]
    return Task.uniform(f"random{num_tables}x{num_devices}", tables, num_devices, memory_gb, memory)


SMALL = Task.uniform("small", [Table("a", 1000, 64, 3.0), Table("b", 500, 48, 2.0), Table("c", 100, 16, 1.0),
                               Table("d", 20_000, 8, 10.0), Table("e/1", 7, 4, 0.0)], 3, 0.01)


def whole_tables(task: Task, plan: Plan) -> bool:
    dims = {t.name: t.dim for t in task.tables}
    return all(s.col_start == 0 and s.col_end == dims[s.table] for s in plan.shards) \
        and len(plan.shards) == len(task.tables)


def check_sharding_plan(sp, task: Task, plan: Plan, fqn: str = DEFAULT_FQN) -> None:
    """Every table of `task` has exactly the ranks, shard sizes and offsets of `plan`."""
    assert isinstance(sp, ShardingPlan)
    assert set(sp.plan) == {fqn}
    module_plan = sp.plan[fqn]
    assert set(module_plan) == {t.name for t in task.tables}
    for t in task.tables:
        want = sorted((s for s in plan.shards if s.table == t.name), key=lambda s: s.col_start)
        ps = module_plan[t.name]
        assert ps.compute_kernel == "fused"
        assert ps.sharding_type == ("table_wise" if len(want) == 1 else "column_wise")
        assert ps.ranks == [s.device for s in want]
        metas = ps.sharding_spec.shards
        assert [list(m.shard_offsets) for m in metas] == [[0, s.col_start] for s in want]
        assert [list(m.shard_sizes) for m in metas] == [[t.rows, s.col_end - s.col_start] for s in want]
        assert [m.placement.rank() for m in metas] == [s.device for s in want]
        assert [str(m.placement.device()) for m in metas] == [f"cuda:{s.device}" for s in want]


# ---------------------------------------------------------------- the sharder

def test_registered_and_lazy():
    assert {n for n, s in SHARDERS.items() if s.kind == "torchrec"} == {"torchrec", "torchrec_full",
                                                                      "torchrec_full_min", "torchrec_calibrated"}
    sharder = make_sharder("torchrec", batch_size=1024)
    assert sharder.name == "torchrec" and not sharder.full_search and sharder.batch_size == 1024
    with pytest.raises(ValueError, match="sharder 'torchrec': unknown option.s. model, seed; it takes batch_size"):
        make_sharder("torchrec", seed=3, model=None)  # options of other sharders are an error, not ignored
    full = make_sharder("torchrec_full")
    assert full.name == "torchrec_full" and full.full_search
    # importing the library and the CLI must not load torchrec (nor torch)
    code = ("import sys, dreamshard, dreamshard.cli, dreamshard.sharders; "
            "print(sorted(m for m in ('torch', 'torchrec') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_small_task_gives_a_valid_table_wise_plan():
    plan = make_sharder("torchrec").shard(SMALL)
    validate_plan(SMALL, plan)
    assert whole_tables(SMALL, plan)


def test_a_time_limit_is_torchrecs_own_timeout(monkeypatch):
    """time_limit reaches TorchRec's planner as its timeout_seconds (whole seconds, at least 1): after it, the
    best plan of the proposals rated so far."""
    import torchrec.distributed.planner as tp

    seen = []
    real = tp.EmbeddingShardingPlanner

    def spy(*args, **kwargs):
        seen.append(kwargs.get("timeout_seconds"))
        return real(*args, **kwargs)

    monkeypatch.setattr(tp, "EmbeddingShardingPlanner", spy)
    for limit, passed in ((None, None), (0.3, 1), (2.5, 3)):
        plan = make_sharder("torchrec_full", time_limit=limit).shard(SMALL)
        validate_plan(SMALL, plan)
        assert seen.pop() == passed
    with pytest.raises(ValueError, match="time_limit must be > 0"):
        make_sharder("torchrec", time_limit=0)


def test_torchrec_is_told_the_cluster_our_cost_prices(monkeypatch):
    """Given our links, TorchRec's planner sees their hosts (devices_per_host) and bandwidths, the devices' memory
    bandwidth, and the per-rank batch (ours is global); without them, one host of all devices, as before."""
    import torchrec.distributed.planner as tp

    from dreamshard.hardware.topology import Topology as Links

    seen = []
    real = tp.EmbeddingShardingPlanner

    def spy(*args, **kwargs):
        seen.append((kwargs["topology"], kwargs["batch_size"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(tp, "EmbeddingShardingPlanner", spy)
    task = random_task(40, 16, seed=3)
    links = Links(devices_per_host=8, intra_host_gbps=150.0, inter_host_gbps=12.5)
    for name in ("torchrec", "torchrec_full"):
        plan = make_sharder(name, batch_size=65536, links=links, hbm_gbps=2000.0).shard(task)
        validate_plan(task, plan)
        topo, batch = seen.pop()
        assert batch == 65536 // 16
        assert (topo.world_size, topo.local_world_size) == (16, 8)
        assert topo.intra_host_bw == pytest.approx(150e6) and topo.inter_host_bw == pytest.approx(12.5e6)  # bytes/ms
        assert topo.hbm_mem_bw == pytest.approx(2e9)
    make_sharder("torchrec_full", batch_size=4096).shard(task)
    topo, batch = seen.pop()
    assert (topo.local_world_size, batch) == (16, 256)
    # across hosts TorchRec is offered row blocks over one host's devices where the task allows "host", as ours
    # are; never grid_shard, which no plan of ours holds across hosts
    sharder = make_sharder("torchrec_full", links=links)
    assert "table_row_wise" not in sharder.types_for(task) and "row_wise" in sharder.types_for(task)
    assert "table_row_wise" in sharder.types_for(random_task(10, 8))
    hosts = replace(task, devices=tuple(replace(d, host=host_name(i, 8)) for i, d in enumerate(task.devices)),
                    sharding=("table", "column", "row", "host"))
    offered = sharder.types_for(hosts)
    assert "table_row_wise" in offered and "grid_shard" not in offered
    plan = sharder.shard(hosts)
    validate_plan(hosts, plan)


def test_the_plan_commands_batch_is_per_device_as_torchrec_reads_it(tmp_path, monkeypatch):
    """`dreamshard plan --batch-size B` counts B samples per device: TorchRec's planner is given B per rank, not
    B / devices (our sharders take the global batch, B x devices, and hand TorchRec its share)."""
    import torchrec.distributed.planner as tp

    seen = []
    real = tp.EmbeddingShardingPlanner

    def spy(*args, **kwargs):
        seen.append(kwargs["batch_size"])
        return real(*args, **kwargs)

    monkeypatch.setattr(tp, "EmbeddingShardingPlanner", spy)
    tables_csv = tmp_path / "tables.csv"
    pd.DataFrame({"name": ["a", "b", "c"], "rows": [1000, 500, 100], "dim": [64, 48, 16],
                  "pooling_factor": [3.0, 2.0, 1.0]}).to_csv(tables_csv, index=False)
    main(["plan", "--tables", str(tables_csv), "--devices", "4", "--memory-gb", "1", "--algo", "torchrec_full",
          "--batch-size", "1024", "-o", str(tmp_path / "plan.json")])
    assert seen == [1024]


def test_100_tables_on_8_devices():
    task = random_task(100, 8)
    plan = make_sharder("torchrec").shard(task)
    validate_plan(task, plan)
    assert whole_tables(task, plan)
    assert len({s.device for s in plan.shards}) == 8


def test_devices_of_different_sizes():
    # 4 tables of 0.25 GB (fp32); device 0 holds one of them, device 1 three
    tables = [Table(f"t{i}", 1_048_576 // 16, 1024, 5.0) for i in range(4)]
    task = Task("hetero", tuple(tables), (Device(int(0.3 * GB)), Device(int(0.8 * GB))))
    plan = make_sharder("torchrec").shard(task)
    validate_plan(task, plan)
    assert sorted(len(plan.device_shards(d)) for d in range(2)) == [1, 3]


@pytest.mark.parametrize("task", [
    Task.uniform("too_big_table", [Table("huge", 10_000_000, 64, 3.0), Table("small", 10, 4, 1.0)], 4, 2.0),
    Task.uniform("too_much_in_total", [Table(f"t{i}", 4_000_000, 64, 3.0) for i in range(5)], 4, 1.0),
])
def test_infeasible_task_raises(task):
    with pytest.raises(InfeasibleTaskError, match="TorchRec's planner found no plan"):
        make_sharder("torchrec").shard(task)


def test_plans_under_the_dreamshard_memory_model():
    """Sound on random small tasks near the memory limit: a valid plan, or InfeasibleTaskError.

    Never a plan over memory (TorchRec plans with our memory model, every precision and
    optimizer), and never a plan where none exists. TorchRec's greedy partitioner may give
    up on a feasible task (about 1% of these): that is TorchRec's answer, and allowed.
    """
    rng = random.Random(1)
    sharder = make_sharder("torchrec")
    outcomes = {"planned": 0, "infeasible": 0}
    for k in range(60):
        memory = MemoryModel(*rng.choice([("fp32", "exact_sgd"), ("fp16", "exact_sgd"),
                                          ("fp32", "exact_row_wise_adagrad"), ("fp16", "adam")]))
        tables = [Table(f"t{i}", rng.randint(1, 5000), 4 * rng.randint(1, 16), rng.uniform(0, 200))
                  for i in range(rng.randint(1, 6))]
        n = rng.randint(1, 3)
        sizes = [memory.shard_bytes(t.rows, t.dim) for t in tables]
        scale = max(max(sizes), sum(sizes) / n)
        task = Task(f"r{k}", tuple(tables), tuple(Device(int(scale * rng.uniform(0.7, 1.4))) for _ in range(n)), memory)
        try:
            plan = sharder.shard(task)
        except InfeasibleTaskError:
            outcomes["infeasible"] += 1
            continue
        validate_plan(task, plan)
        assert brute_force_feasible(task)
        outcomes["planned"] += 1
    assert outcomes["planned"] > 10 and outcomes["infeasible"] > 5


def test_full_search_restricted_to_representable_types_gives_a_valid_plan():
    # 256-wide tables may be split in 128-column slices by TorchRec's column-wise sharding
    task = Task.uniform("wide", [Table(f"w{i}", 200_000, 256, 20.0) for i in range(3)]
                        + [Table(f"n{i}", 50_000, 16, 2.0) for i in range(5)], 4, 1.0)
    plan = make_sharder("torchrec_full", sharding_types=("table_wise", "column_wise")).shard(task)
    validate_plan(task, plan)


def test_full_search_places_a_table_larger_than_a_device_row_wise():
    # one table bigger than any device: only row-wise kinds of sharding (or grid) can place it
    task = Task.uniform("rows", [Table("big", 3_000_000, 64, 5.0), Table("small", 1000, 16, 1.0)], 4, 0.5)
    plan = make_sharder("torchrec_full").shard(task)
    validate_plan(task, plan)
    assert {s.kind(3_000_000, 64) for s in plan.shards if s.table == "big"} & {"row", "row+column"}
    # restricted to whole tables and columns, TorchRec finds no plan for a 0.72 GB table of 64 columns on 0.5 GB
    restricted = replace(task, sharding=("table", "column"))
    assert make_sharder("torchrec_full").types_for(restricted) == ["table_wise", "column_wise", "table_column_wise"]
    with pytest.raises(DreamShardError):
        make_sharder("torchrec_full").shard(replace(task, sharding=("table",)))


def test_told_our_narrowest_slice_torchrec_cuts_a_table_its_default_min_partition_keeps_whole():
    """torchrec_full_min: TorchRec's min_partition set to each table's narrowest slice (Task.min_width), so a
    64-column table larger than a device, held to whole tables and columns, is cut where torchrec_full finds no plan."""
    task = replace(Task.uniform("rows", [Table("big", 3_000_000, 64, 5.0), Table("small", 1000, 16, 1.0)], 4, 0.5),
                   sharding=("table", "column"))
    with pytest.raises(DreamShardError):
        make_sharder("torchrec_full").shard(task)
    plan = make_sharder("torchrec_full_min").shard(task)
    validate_plan(task, plan)
    widths = [s.width for s in plan.shards if s.table == "big"]
    assert len(widths) >= 2 and sum(widths) == 64 and min(widths) >= task.min_width("big")


def test_conversion_of_row_wise_shards_and_refusal_of_replicas():
    task = Task.uniform("two", [Table("keep", 100, 8, 1.0), Table("rows", 1001, 16, 2.0)], 3, 1.0)
    module_plan = construct_module_sharding_plan(
        meta_ebc(task), {"keep": table_wise(rank=1, compute_kernel="fused"), "rows": row_wise(compute_kernel="fused")},
        local_size=3, world_size=3, device_type="cuda")
    plan = from_torchrec_plan(task, ShardingPlan({"": module_plan}))
    validate_plan(task, plan)  # TorchRec's layout: ceil(1001 / 3) = 334 rows per rank
    assert sorted((s.device, s.rows(1001)) for s in plan.shards if s.table == "rows") == [
        (0, (0, 334)), (1, (334, 668)), (2, (668, 1001))]
    replicated = construct_module_sharding_plan(
        meta_ebc(task), {"keep": table_wise(rank=1, compute_kernel="fused"), "rows": data_parallel()},
        local_size=3, world_size=3, device_type="cuda")
    with pytest.raises(DreamShardError, match=r"table 'rows': TorchRec chose 'data_parallel'"):
        from_torchrec_plan(task, ShardingPlan({"": replicated}))


def test_conversion_of_column_wise_shards():
    task = Task.uniform("cw", [Table("a", 1000, 256, 3.0), Table("b", 10, 8, 1.0)], 3, 1.0)
    module_plan = construct_module_sharding_plan(
        meta_ebc(task), {"a": column_wise(ranks=[2, 0], compute_kernel="fused"),
                         "b": table_wise(rank=1, compute_kernel="fused")},
        local_size=3, world_size=3, device_type="cuda")
    plan = from_torchrec_plan(task, ShardingPlan({"": module_plan}))
    assert sorted(plan.shards, key=lambda s: (s.table, s.col_start)) == [
        Shard("a", 2, 0, 128), Shard("a", 0, 128, 256), Shard("b", 1, 0, 8)]


def test_option_errors():
    with pytest.raises(ValueError, match="batch_size"):
        TorchRecSharder(batch_size=0)
    with pytest.raises(ValueError, match="full_search"):
        TorchRecSharder(sharding_types=("table_wise",))
    dotted = Task.uniform("dots", [Table("a.b", 10, 4, 1.0)], 1, 1.0)
    with pytest.raises(DreamShardError, match="'a.b'"):
        make_sharder("torchrec").shard(dotted)


# ---------------------------------------------------------------- export

SPLIT_PLAN = Plan(3, (
    Shard("a", 2, 0, 32), Shard("a", 0, 32, 64),  # equal slices, ranks out of order
    Shard("b", 1, 0, 8), Shard("b", 1, 8, 40), Shard("b", 0, 40, 48),  # unequal slices, two on one device
    Shard("c", 1, 0, 16), Shard("d", 0, 0, 8), Shard("e/1", 2, 0, 4),
))


@pytest.mark.parametrize("fqn", [DEFAULT_FQN, "", "sparse.ebc"])
def test_export_round_trip_table_wise(tmp_path, fqn):
    plan = make_sharder("lookup_greedy").shard(SMALL)
    path = tmp_path / "plan.pt"
    save_torchrec_plan(SMALL, plan, path, fqn=fqn)
    check_sharding_plan(torch.load(path, weights_only=False), SMALL, plan, fqn)
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary file left


def test_export_round_trip_column_wise(tmp_path):
    validate_plan(SMALL, SPLIT_PLAN)
    path = tmp_path / "split.pt"
    save_torchrec_plan(SMALL, SPLIT_PLAN, path)
    loaded = torch.load(path, weights_only=False)
    check_sharding_plan(loaded, SMALL, SPLIT_PLAN)
    # and back: the loaded TorchRec plan converts to the same DreamShard plan
    back = from_torchrec_plan(SMALL, loaded, DEFAULT_FQN)
    assert sorted(back.shards, key=str) == sorted(SPLIT_PLAN.shards, key=str)


def test_export_for_several_hosts():
    # 3 ranks on hosts of one GPU each: every shard on cuda:0 of its rank's host
    sp = to_torchrec_plan(SMALL, SPLIT_PLAN, local_size=1)
    for t in SMALL.tables:
        ps = sp.plan[DEFAULT_FQN][t.name]
        assert [m.placement.rank() for m in ps.sharding_spec.shards] == ps.ranks
        assert {str(m.placement.device()) for m in ps.sharding_spec.shards} == {"cuda:0"}
    with pytest.raises(ValueError, match="local_size"):
        to_torchrec_plan(SMALL, SPLIT_PLAN, local_size=4)


def test_export_of_the_torchrec_sharders_own_plan_round_trips():
    task = random_task(30, 4, seed=2)
    planned = TorchRecSharder().torchrec_plan(task)
    plan = from_torchrec_plan(task, planned)
    exported = to_torchrec_plan(task, plan, fqn="")
    for name, ps in planned.plan[""].items():
        assert exported.plan[""][name].ranks == ps.ranks
        assert exported.plan[""][name].sharding_spec == ps.sharding_spec


def test_export_refuses_an_invalid_plan(tmp_path):
    missing = Plan(3, tuple(s for s in SPLIT_PLAN.shards if s.table != "c"))
    with pytest.raises(InvalidPlanError, match="'c'"):
        save_torchrec_plan(SMALL, missing, tmp_path / "bad.pt")
    assert not (tmp_path / "bad.pt").exists()


ROW_PLAN = Plan(3, tuple(s for s in SPLIT_PLAN.shards if s.table != "d")
                + (Shard("d", 0, 0, 8, 0, 6667), Shard("d", 1, 0, 8, 6667, 13_334), Shard("d", 2, 0, 8, 13_334, 20_000)))


def test_export_round_trip_row_wise(tmp_path):
    # d: 20,000 rows in TorchRec's layout over 3 ranks: blocks of ceil(20000 / 3) = 6,667 rows, block i on rank i
    path = tmp_path / "rows.pt"
    save_torchrec_plan(SMALL, ROW_PLAN, path)
    loaded = torch.load(path, weights_only=False)
    ps = loaded.plan[DEFAULT_FQN]["d"]
    assert ps.sharding_type == "row_wise" and ps.ranks == [0, 1, 2]
    assert [list(m.shard_offsets) for m in ps.sharding_spec.shards] == [[0, 0], [6667, 0], [13334, 0]]
    back = from_torchrec_plan(SMALL, loaded, DEFAULT_FQN)
    assert sorted(back.shards, key=str) == sorted(ROW_PLAN.shards, key=str)


def test_export_refuses_row_ranges_torchrec_cannot_train(tmp_path):
    # valid plan, but TorchRec routes id i to rank i // 6667: blocks elsewhere would be misread in training
    swapped = Plan(3, tuple(s for s in SPLIT_PLAN.shards if s.table != "d")
                   + (Shard("d", 1, 0, 8, 0, 6667), Shard("d", 0, 0, 8, 6667, 13_334), Shard("d", 2, 0, 8, 13_334, 20_000)))
    uneven = Plan(3, tuple(s for s in SPLIT_PLAN.shards if s.table != "d")
                  + (Shard("d", 0, 0, 8, 0, 5000), Shard("d", 1, 0, 8, 5000, 20_000)))
    for plan in (swapped, uneven):
        validate_plan(SMALL, plan)
        with pytest.raises(DreamShardError, match=r"table 'd': its row ranges .* not TorchRec's row-wise layout"):
            save_torchrec_plan(SMALL, plan, tmp_path / "rows.pt")
        assert not (tmp_path / "rows.pt").exists()


# ---------------------------------------------------------------- TorchRec's perf model

def test_torchrec_perf_estimate():
    task = random_task(40, 4, seed=3)
    own = make_sharder("torchrec").shard(task)
    est = torchrec_perf_estimate(task, own)
    assert est.cost_ms > 0 and len(est.rank_ms) == 4
    assert est.cost_ms == pytest.approx(max(est.rank_ms))
    for total, parts in zip(est.rank_ms, est.rank_breakdown_ms):
        assert total == pytest.approx(sum(parts.values()))
    # everything on one device: TorchRec rates it worse than its own balanced plan
    one = Plan.from_assignment(task, [0] * len(task.tables))
    task_one_device_fits = Task.uniform(task.name, task.tables, 4, 100.0)
    assert torchrec_perf_estimate(task_one_device_fits, one).cost_ms > est.cost_ms
    split = torchrec_perf_estimate(SMALL, SPLIT_PLAN)
    assert split.cost_ms > 0 and all(r > 0 for r in split.rank_ms)
    rows = torchrec_perf_estimate(SMALL, ROW_PLAN)
    assert rows.cost_ms > 0 and all(r > 0 for r in rows.rank_ms)
    # as a CostEstimator: the same rating, split per rank into compute and exchanges, never a measurement
    from dreamshard.interop.torchrec import TorchRecEstimator

    cost = TorchRecEstimator().plan_cost(task, own)
    assert cost.cost_ms == pytest.approx(est.cost_ms) and not cost.measured
    assert [d.total_ms for d in cost.devices] == pytest.approx(list(est.rank_ms))
    assert [d.fwd_comm_ms for d in cost.devices] == pytest.approx([b["fwd_comms"] for b in est.rank_breakdown_ms])


@pytest.mark.parametrize("optimizer", ["exact_sgd", "exact_row_wise_adagrad", "adam"])
def test_replicas_and_caches_take_what_torchrecs_storage_estimator_counts(optimizer):
    """A plan with data-parallel tables and a UVM-cached one: per rank, our bytes are TorchRec's estimate. (Column
    slices of a table trained with row-wise Adagrad each keep their own row state, which TorchRec's estimator
    counts once for the table: there ours is the larger, as for slices in device memory.)"""
    from dreamshard.plan import device_memory_bytes
    from dreamshard.sharders.replicas import replica_shards

    tables = (Table("tiny", 50, 16, 2.0), Table("mid", 400, 16, 2.0), Table("big", 200_000, 32, 4.0),
              Table("huge", 1_000_000, 16, 1.0))
    task = Task("mixed", tables, tuple(Task.uniform("u", tables, 4, 1.0).devices),
                MemoryModel(optimizer=optimizer, batch_size=512), sharding=("table", "column", "row", "data"),
                kernels=("fused", "fused_uvm_caching"))
    plan = Plan(4, (*replica_shards(tables[0], 4), *replica_shards(tables[1], 4), Shard("big", 1, 0, 32),
                    Shard("huge", 2, 0, 16, cache=0.2)))
    validate_plan(task, plan)
    assert torchrec_perf_estimate(task, plan, 512).rank_hbm_bytes == tuple(device_memory_bytes(task, plan))
    sliced = Plan(4, (*plan.shards[:-1], Shard("huge", 2, 0, 8, cache=0.2), Shard("huge", 3, 8, 16, cache=0.2)))
    theirs, ours = torchrec_perf_estimate(task, sliced, 512).rank_hbm_bytes, device_memory_bytes(task, sliced)
    assert all(t <= o for t, o in zip(theirs, ours))
    assert (list(theirs) == ours) == (optimizer != "exact_row_wise_adagrad")


def test_perf_estimate_equals_the_planners_own_rating():
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.perf_models import NoopPerfModel
    from torchrec.distributed.planner.storage_reservations import (
        FixedPercentageStorageReservation,
    )

    from dreamshard.interop import torchrec as tx

    task = random_task(50, 8, seed=5)
    topo = tx.topology(task)
    constraints = tx.table_constraints(task, {t.name: ["table_wise"] for t in task.tables})
    for batch in (DEFAULT_BATCH_SIZE, 2048):
        planner = EmbeddingShardingPlanner(topology=topo, batch_size=batch, constraints=constraints, debug=False,
                                           stats=[], enumerator=tx.enumerator(task, topo, constraints, batch),
                                           storage_reservation=FixedPercentageStorageReservation(0.0))
        plan = from_torchrec_plan(task, planner.plan(meta_ebc(task), [EmbeddingBagCollectionSharder()]))
        default = batch == DEFAULT_BATCH_SIZE  # the sharder's and the estimate's default: TorchRec's own
        sharder = make_sharder("torchrec") if default else make_sharder("torchrec", batch_size=batch)
        assert plan == sharder.shard(task)  # deterministic, and what the sharder does
        rating = NoopPerfModel(topo).rate(planner._best_plan)
        ours = torchrec_perf_estimate(task, plan) if default else torchrec_perf_estimate(task, plan, batch)
        assert ours.cost_ms == pytest.approx(rating, rel=1e-9)


# ---------------------------------------------------------------- training with the exported plan

# the training script of docs/torchrec.md, verbatim: run here on CPU ranks (gloo) with a CPU plan
TRAIN_SCRIPT = '''\
"""Train an EmbeddingBagCollection sharded by a DreamShard plan (one process per GPU).

    dreamshard plan --tables tables.csv --devices 8 --memory-gb 40 --algo lookup_greedy \\
        --format torchrec -o plan.pt
    torchrun --nproc_per_node=8 train_sharded.py plan.pt tables.csv
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dreamshard.tables import read_tables_file


class Model(torch.nn.Module):
    def __init__(self, configs, device):
        super().__init__()
        # the plan is keyed by this module's name: "ebc" (dreamshard's default fqn)
        self.ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        self.top = torch.nn.Linear(sum(c.embedding_dim for c in configs), 1, device=device)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return self.top(self.ebc(features).values())


def main(plan_path: str, tables_path: str, batch_size: int = 512, steps: int = 10) -> None:
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    plan = torch.load(plan_path, weights_only=False)  # a torchrec ShardingPlan (pickled, so weights_only=False)
    ranks = {r for sharding in plan.plan["ebc"].values() for r in sharding.ranks}
    assert max(ranks) < dist.get_world_size(), f"plan uses ranks up to {max(ranks)}, world size is {dist.get_world_size()}"

    # the same tables, names, dims and rows the plan was made for (fp32 weights: `dreamshard plan`'s default)
    tables = read_tables_file(tables_path)
    configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name])
               for t in tables]
    model = Model(configs, device)
    # the plan's "fused" kernel updates the embeddings inside the backward pass (FBGEMM TBE)
    apply_optimizer_in_backward(torch.optim.SGD, model.ebc.parameters(), {"lr": 0.01})
    model = DistributedModelParallel(model, device=device, plan=plan, sharders=[EmbeddingBagCollectionSharder()])
    dense_optimizer = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                            lambda params: torch.optim.SGD(params, lr=0.01))

    generator = torch.Generator().manual_seed(rank)
    for _ in range(steps):  # random ids, about 3 per sample and table: replace with your data loader
        lengths = torch.randint(0, 7, (len(tables), batch_size), generator=generator)
        values = torch.cat([torch.randint(0, t.rows, (int(n),), generator=generator)
                            for t, n in zip(tables, lengths.sum(dim=1))])
        features = KeyedJaggedTensor.from_lengths_sync(keys=[t.name for t in tables], values=values.to(device),
                                                       lengths=lengths.flatten().to(device))
        loss = model(features).pow(2).mean()
        loss.backward()
        dense_optimizer.step()
        dense_optimizer.zero_grad()

    # which column slices this rank holds: (table, col_start, col_end)
    held = [(name.split(".")[-2], int(s.metadata.shard_offsets[1]),
             int(s.metadata.shard_offsets[1] + s.metadata.shard_sizes[1]))
            for name, tensor in model.state_dict().items() if name.startswith("ebc.")
            for s in tensor.local_shards()]
    print(json.dumps({"rank": rank, "loss": float(loss), "shards": sorted(held)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
'''


@pytest.mark.slow  # 6-20 s on 2 cores: torchrun starts two processes that each import torchrec
def test_training_script_shards_the_model_as_planned(tmp_path):
    """DistributedModelParallel accepts the exported plan: uneven column slices, two on one rank, trains."""
    tables_csv = tmp_path / "tables.csv"
    pd.DataFrame({"name": ["a", "b", "c"], "rows": [1000, 500, 100], "dim": [64, 48, 16],
                  "pooling_factor": [3.0, 2.0, 1.0]}).to_csv(tables_csv, index=False)
    from dreamshard.tables import read_tables_file
    task = Task.uniform("tables", read_tables_file(tables_csv), 2, 1.0)
    plan = Plan(2, (Shard("a", 1, 0, 32), Shard("a", 0, 32, 64), Shard("b", 1, 0, 8), Shard("b", 1, 8, 40),
                    Shard("b", 0, 40, 48), Shard("c", 1, 0, 16)))
    save_torchrec_plan(task, plan, tmp_path / "plan.pt", device_type="cpu")
    (tmp_path / "train_sharded.py").write_text(TRAIN_SCRIPT)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "train_sharded.py", "plan.pt", "tables.csv"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    import json
    # both ranks print to one pipe: their lines may run together, so decode each report where it starts
    decoder = json.JSONDecoder()
    starts = [i for i in range(len(res.stdout)) if res.stdout.startswith('{"rank"', i)]
    reports = {r["rank"]: r for r in (decoder.raw_decode(res.stdout, i)[0] for i in starts)}
    assert set(reports) == {0, 1}
    for rank, report in reports.items():
        want = sorted([s.table, s.col_start, s.col_end] for s in plan.shards if s.device == rank)
        assert report["shards"] == want
        assert report["loss"] == report["loss"]  # not NaN


# ---------------------------------------------------------------- CLI

@pytest.fixture
def tables_csv(tmp_path) -> Path:
    path = tmp_path / "tables.csv"
    pd.DataFrame({"name": [f"emb_{i}" for i in range(12)],
                  "rows": [200_000, 100, 5_000, 70_000, 1_000, 30_000, 100, 250, 9_999, 120_000, 40, 3_000],
                  "dim": [128, 4, 16, 32, 64, 8, 128, 12, 48, 16, 4, 96],
                  "pooling_factor": [1.0, 0.2, 15.5, 3.0, 40.0, 7.25, 1.0, 100.0, 2.5, 0.0, 9.0, 12.0]}
                 ).to_csv(path, index=False)
    return path


def test_cli_writes_a_loadable_torchrec_plan(tmp_path, tables_csv, capsys):
    out = tmp_path / "plan.pt"
    args = ["plan", "--tables", str(tables_csv), "--devices", "4", "--memory-gb", "0.15", "--algo", "torchrec",
            "--format", "torchrec", "-o", str(out)]  # whole tables: the largest fits after the 15% reservation
    assert main(args) == 0
    assert "torchrec: 12 tables on 4 devices" in capsys.readouterr().out
    # a fresh interpreter loads it with plain torch.load (torchrec is imported by unpickling)
    code = ("import sys, torch; p = torch.load(sys.argv[1], weights_only=False); m = p.plan['ebc']; "
            "print(type(p).__name__, len(m), sorted({r for ps in m.values() for r in ps.ranks}))")
    res = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, check=True)
    assert res.stdout.split()[:2] == ["ShardingPlan", "12"]
    # the JSON format of the same sharder still works, and agrees with the exported plan
    out_json = tmp_path / "plan.json"
    assert main(args[:-4] + ["-o", str(out_json)]) == 0
    plan = Plan.load_json(out_json)
    from dreamshard.tables import read_tables_file
    task = Task.uniform("tables", read_tables_file(tables_csv), 4, 0.15, MemoryModel(batch_size=512, reservation=0.15))
    check_sharding_plan(torch.load(out, weights_only=False), task, plan)


def test_cli_reports_infeasible_in_one_line(tmp_path, tables_csv, capsys):
    out = tmp_path / "plan.pt"
    args = ["plan", "--tables", str(tables_csv), "--devices", "2", "--memory-gb", "0.05", "--algo", "torchrec",
            "--format", "torchrec", "-o", str(out)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("dreamshard: error: ") and "TorchRec's planner found no plan" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()



def test_the_estimate_block_of_the_docs_runs_as_written(tmp_path):
    """docs/torchrec.md's first Python block (TorchRec's estimate of a plan), run as a user would paste it."""
    text = (PROJECT_ROOT / "docs" / "torchrec.md").read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "torchrec_perf_estimate" in block
    script = tmp_path / "estimate.py"
    script.write_text(block)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cost, hbm = proc.stdout.strip().splitlines()[-2:]
    assert float(cost) > 0 and all(int(x) > 0 for x in hbm.strip("()").split(","))


def test_cli_placement_cpu_writes_a_plan_for_cpu_ranks(tmp_path, tables_csv, capsys):
    out = tmp_path / "plan.pt"
    args = ["plan", "--tables", str(tables_csv), "--devices", "2", "--memory-gb", "0.5", "--algo", "lookup_greedy",
            "--format", "torchrec", "-o", str(out)]
    assert main([*args, "--placement", "cpu"]) == 0
    module_plan = torch.load(out, weights_only=False).plan["ebc"]
    placements = {str(p.placement) for ps in module_plan.values() for p in ps.sharding_spec.shards}
    assert placements and all(p.endswith("/cpu") for p in placements), placements
    assert main(args) == 0  # default: GPUs
    placements = {str(p.placement) for ps in torch.load(out, weights_only=False).plan["ebc"].values()
                  for p in ps.sharding_spec.shards}
    assert all("/cuda:" in p for p in placements), placements
    json_out = tmp_path / "plan.json"
    assert main([*args[:-4], "-o", str(json_out), "--placement", "cpu"]) == 1
    assert "--placement: only with --format torchrec" in capsys.readouterr().err


def test_the_planner_script_of_the_docs_runs_as_written_on_two_cpu_ranks(tmp_path):
    """docs/torchrec.md's DreamShardPlanner block: planned inside the job, DMP, one step, on 2 gloo ranks."""
    text = (PROJECT_ROOT / "docs" / "torchrec.md").read_text()
    block = next(b.split("```", 1)[0] for b in text.split("```python\n")[1:] if "DreamShardPlanner(" in b.split("```")[0])
    (tmp_path / "plan_in_script.py").write_text(block)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "plan_in_script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    import re

    # both ranks print to one pipe: their lines may run together
    assert sorted(re.findall(r"\{'rank': (\d),", res.stdout)) == ["0", "1"]


def test_the_training_script_run_here_is_the_one_in_the_docs():
    text = (PROJECT_ROOT / "docs" / "torchrec.md").read_text()
    block = next(b.split("```", 1)[0] for b in text.split("```python\n")[1:] if "train_sharded.py" in b.split("```")[0])
    assert block == TRAIN_SCRIPT


def test_planner_copies_are_deepcopys_and_torchrec_plans_the_same_with_them(monkeypatch):
    """interop.torchrec.planner_copies: TorchRec's records copy field by field within the block, as deepcopy would
    (equal, not the same objects, a record met twice copied once), the classes are as before after it, and TorchRec's
    full search plans the same tasks (cuts, row blocks, a grid over one host, two hosts) with and without it."""
    import contextlib
    import copy

    from torchrec.distributed.planner import types as tt

    from dreamshard.hardware.topology import Topology as Links
    from dreamshard.interop import torchrec as tx

    storage, perf = tt.Storage(10, 2), tt.Perf(1.0, 2.0, 3.0, 4.0)
    records = [tt.Shard([8, 4], [0, 4], storage, perf, 3), tt.Shard([8, 4], [8, 0], storage, None),
               tt.DeviceHardware(1, storage, perf)]
    with tx.planner_copies(), tx.planner_copies():  # nested: the outer block's copiers stay until it ends
        copied = copy.deepcopy(records)
        assert "__deepcopy__" in vars(tt.Shard)
    assert all("__deepcopy__" not in vars(c) for c in (tt.Perf, tt.Storage, tt.DeviceHardware, tt.Shard))
    assert copied == records and copied == copy.deepcopy(records)
    assert copied[0] is not records[0] and copied[0].size is not records[0].size
    assert copied[0].storage is copied[1].storage is copied[2].storage is not storage
    assert copied[0].perf is copied[2].perf is not perf

    links = Links(devices_per_host=4, intra_host_gbps=150.0, inter_host_gbps=12.5)
    tasks = [replace(random_task(14, 8, memory_gb=0.6, seed=5), sharding=("table", "column", "row")),
             replace(random_task(12, 8, memory_gb=0.6, seed=6), sharding=("table", "column", "row", "host"))]
    tasks[1] = replace(tasks[1], devices=tuple(replace(d, host=host_name(i, 4)) for i, d in enumerate(tasks[1].devices)))
    sharders = [make_sharder("torchrec_full_min"), make_sharder("torchrec_full_min", links=links)]
    fast = [s.shard(t) for s, t in zip(sharders, tasks)]
    monkeypatch.setattr(tx, "planner_copies", contextlib.nullcontext)
    assert fast == [s.shard(t) for s, t in zip(sharders, tasks)]
    assert all(len(p.shards) > len(t.tables) for p, t in zip(fast, tasks))  # TorchRec cut tables


ENUMERATION_ORDER_SCRIPT = """
import json
from dataclasses import replace
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from dreamshard.interop import torchrec as tx
from dreamshard.sharders import make_sharder
from dreamshard.tables import Table
from dreamshard.tasks import Task

task = replace(Task.uniform("order", [Table("a", 4000, 64, 3.0), Table("b", 900, 16, 1.0)], 4, 1.0),
               sharding=("table", "column", "row"))
sharder = make_sharder("torchrec_full")
types = sharder.types_for(task)
constraints = tx.table_constraints(task, {t.name: types for t in task.tables})


def enumerated():
    enum = tx.enumerator(task, sharder._topology(task, to_plan=True), constraints, tx.torchrec_batch(task, None))
    options = enum.enumerate(tx.meta_ebc(task), [EmbeddingBagCollectionSharder()])
    return {t.name: list(dict.fromkeys(o.sharding_type for o in options if o.name == t.name)) for t in task.tables}


offered = EmbeddingBagCollectionSharder().sharding_types("cuda")
with tx.stock_enumeration():
    stock = enumerated()
print(json.dumps({"offered": [x for x in offered if x in types], "through_sets": list(set(types) & set(offered)),
                  "enumerated": enumerated(), "stock": stock}))
"""


def test_torchrecs_planner_enumerates_in_the_sharders_order_whatever_the_hash_seed():
    """Stock TorchRec intersects a table's sharding types with its constraints through sets, so the order it
    enumerates them in (and with it its tie-breaks and plans) changes with PYTHONHASHSEED; interop.torchrec's
    enumerator keeps the EBC sharder's order. Run under a hash seed whose set order differs from that order."""
    import json
    import os

    from dreamshard.interop.torchrec import TABLE_WISE

    env = {**os.environ, "PYTHONHASHSEED": "1", "PYTHONPATH": str(PROJECT_ROOT)}
    proc = subprocess.run([sys.executable, "-c", ENUMERATION_ORDER_SCRIPT], env=env, cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(seen["offered"]) >= 4 and seen["offered"][0] == TABLE_WISE
    assert seen["through_sets"] != seen["offered"], "this hash seed keeps the sharder's order: pick another"
    assert seen["enumerated"] == {"a": seen["offered"], "b": seen["offered"]}
    assert seen["stock"] == {"a": seen["through_sets"], "b": seen["through_sets"]}  # what a TorchRec user's does
