"""Clusters as they are: devices of different memory, speed and host; placement constraints; their files."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sharders_property import MODEL, NEUROSHARD_MODEL, model_for

from dreamshard.cli import main
from dreamshard.data.cluster import (
    Constraints,
    constraints_from_json,
    read_constraints_file,
    read_devices_file,
    read_table_constraints,
)
from dreamshard.errors import DataFormatError, DreamShardError, InfeasibleTaskError, InvalidPlanError
from dreamshard.evaluation.bounds import lower_bound
from dreamshard.hardware.comm import Topology, transfer_ms
from dreamshard.memory import GB, MemoryModel
from dreamshard.placement import check_satisfiable
from dreamshard.plan import Plan, Shard, device_memory_bytes, validate_plan
from dreamshard.sharders import HEURISTICS, LEARNED, make_sharder
from dreamshard.tables import Table
from dreamshard.tasks import Device, Task
from helpers import analytic, seeded

OURS = HEURISTICS + LEARNED


def ours(name: str, seed: int = 0):
    options = {"model": model_for(name)} if name in LEARNED else {}
    return make_sharder(name, **options, **seeded(name, seed))


def table(name: str, rows: int = 1000, dim: int = 16, pooling: float = 10.0) -> Table:
    return Table(name, rows, dim, pooling, tuple(float(k == 2) for k in range(17)))


def task_of(tables, caps_mb, speeds=None, **constraints) -> Task:
    speeds = speeds or [1.0] * len(caps_mb)
    devices = tuple(Device(int(c * 2**20), speed=s) for c, s in zip(caps_mb, speeds))
    return Task("t", tuple(tables), devices, MemoryModel(), **constraints)


# ---------------------------------------------------------------- property: heterogeneous, constrained


@st.composite
def constrained_tasks(draw) -> Task:
    """A task of different devices (memory, speed) with constraints that a witness placement satisfies."""
    n = draw(st.integers(2, 8))
    num_devices = draw(st.integers(2, 4))
    tables = [Table(f"t{i}", rows=draw(st.integers(10, 4000)), dim=4 * draw(st.integers(1, 16)),
                    pooling_factor=draw(st.floats(0, 100, allow_nan=False)),
                    bins=tuple(float(k == draw(st.integers(0, 16))) for k in range(17))) for i in range(n)]
    memory = MemoryModel()
    witness = [draw(st.integers(0, num_devices - 1)) for _ in range(n)]
    used = [0] * num_devices
    for t, d in zip(tables, witness):
        used[d] += memory.shard_bytes(t.rows, t.dim)
    # each device holds its witness load times 1..1.5 (tight: placement must search), at least 1 KB
    caps = [max(1024, int(u * draw(st.floats(1.0, 1.5)))) for u in used]
    speeds = [draw(st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0])) for _ in range(num_devices)]
    devices = tuple(Device(c, kind="fast" if s > 1 else "slow", speed=s) for c, s in zip(caps, speeds))
    pins, avoid, whole = [], [], []
    for i, t in enumerate(tables):
        what = draw(st.sampled_from(["none", "none", "pin", "avoid", "whole"]))
        if what == "pin":
            pins.append((t.name, witness[i]))
        elif what == "avoid":
            others = [d for d in range(num_devices) if d != witness[i]]
            avoid.append((t.name, tuple(sorted(draw(st.sets(st.sampled_from(others), min_size=1))))))
        elif what == "whole":
            whole.append(t.name)
    groups = []
    free = {t.name for t in tables} - {t for t, _ in pins}
    for d in range(num_devices):
        members = [t.name for t, w in zip(tables, witness) if w == d and t.name in free]
        if len(members) >= 2 and draw(st.booleans()):
            groups.append(tuple(members[:draw(st.integers(2, len(members)))]))
    return Task("hetero", tuple(tables), devices, memory, pins=tuple(pins), avoid=tuple(avoid), groups=tuple(groups),
                whole=tuple(whole))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=constrained_tasks(), seed=st.integers(0, 2**16))
def test_every_sharder_respects_each_devices_memory_and_the_constraints(task, seed):
    for name in OURS:
        plan = ours(name, seed).shard(task)
        validate_plan(task, plan)  # memory per device, pins, avoid lists, groups, whole tables
        for used, device in zip(device_memory_bytes(task, plan), task.devices):
            assert used <= device.memory_bytes


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=constrained_tasks())
def test_torchrec_keeps_each_ranks_memory_or_says_it_found_no_plan(task):
    # TorchRec's planner takes per-rank memory (no pins, avoid lists or groups: it refuses those, tested below)
    pytest.importorskip("torchrec")
    free = Task(task.name, task.tables, task.devices, task.memory, whole=task.whole)
    for name in ("torchrec", "torchrec_full"):
        try:
            plan = make_sharder(name).shard(free)
        except InfeasibleTaskError:  # its partitioner is greedy: it may give up on tight, feasible tasks
            continue
        validate_plan(free, plan)


def test_the_constrained_strategy_makes_every_kind_of_constraint():
    seen: set[str] = set()

    @settings(max_examples=100, deadline=None, database=None, derandomize=True)
    @given(task=constrained_tasks())
    def collect(task):
        seen.update(k for k, v in (("pin", task.pins), ("avoid", task.avoid), ("group", task.groups),
                                   ("whole", task.whole)) if v)
        if len({d.speed for d in task.devices}) > 1:
            seen.add("speeds")
        if len({d.memory_bytes for d in task.devices}) > 1:
            seen.add("memories")

    collect()
    assert seen == {"pin", "avoid", "group", "whole", "speeds", "memories"}


def test_greedy_gives_a_faster_device_more_work():
    tables = [table(f"t{i}", pooling=10.0 + i) for i in range(12)]
    task = task_of(tables, [100, 100, 100], speeds=[3.0, 1.0, 1.0])
    plan = make_sharder("lookup_greedy").shard(task)
    work = [sum(t.dim * t.pooling_factor for t in tables if any(s.table == t.name and s.device == d
                                                                 for s in plan.shards)) for d in range(3)]
    assert work[0] > 2 * max(work[1:])


def test_the_learned_sharders_price_compute_at_each_devices_speed():
    import torch

    from dreamshard.learning.cost_model import CostNetConfig, DeviceLinks
    from dreamshard.sharders.search import _Evaluator

    tables = [table(f"t{i}", rows=2000, pooling=20.0 + i) for i in range(4)]
    task = task_of(tables, [100, 100, 100], speeds=[4.0, 1.0, 0.5])
    ev = _Evaluator(NEUROSHARD_MODEL, task)
    sums = np.repeat(ev.encode([(0, 0, 16), (1, 0, 16)]).sum(axis=0)[None], 3, axis=0)
    fwd, total = ev.device_compute_ms(sums)
    ref_fwd, ref_total = ev.compute_ms(sums)
    assert np.allclose(fwd, ref_fwd / [4.0, 1.0, 0.5]) and np.allclose(total, ref_total / [4.0, 1.0, 0.5])
    embed = torch.randn(3, CostNetConfig().embed, generator=torch.Generator().manual_seed(0))
    ref = MODEL.cost_net.device_costs(embed)
    scaled = MODEL.cost_net.device_costs(embed, None, DeviceLinks.of(MODEL.cost_net.config, [4.0, 1.0, 0.5]))
    assert torch.allclose(scaled[:, :2], ref[:, :2] / torch.tensor([[4.0], [1.0], [0.5]]))
    assert torch.allclose(scaled[:, 2], ref[:, 2])  # communication does not scale with compute speed


# ---------------------------------------------------------------- constraints: honoured, conflicts named


def test_each_constraint_is_honoured():
    tables = [table(f"t{i}", pooling=float(10 + i)) for i in range(6)]
    task = task_of(tables, [1, 1, 1], pins=(("t0", 2),), avoid=(("t5", (0, 1)),), groups=(("t1", "t2", "t3"),),
                   whole=("t4",))
    for name in OURS:
        plan = ours(name).shard(task)
        validate_plan(task, plan)
        where = {s.table: s.device for s in plan.shards}
        assert where["t0"] == 2 and where["t5"] == 2
        assert where["t1"] == where["t2"] == where["t3"]


def test_a_whole_table_is_never_cut_even_where_cutting_would_fit():
    big = table("big", rows=100_000, dim=64)  # 25.6 MB: fits no 20 MB device whole
    task = task_of([big, table("small")], [20, 20])
    assert len([s for s in make_sharder("size_greedy").shard(task).shards if s.table == "big"]) > 1
    with pytest.raises(InfeasibleTaskError, match=r"'big' \(whole\) needs 0.024 GB on one device"):
        make_sharder("size_greedy").shard(task_of([big, table("small")], [20, 20], whole=("big",)))


def test_validate_plan_names_each_broken_constraint():
    tables = [table("a"), table("b")]
    apart = Plan(2, (Shard("a", 0, 0, 16), Shard("b", 1, 0, 16)))
    with pytest.raises(InvalidPlanError, match=r"group \['a', 'b'\] must share one device"):
        validate_plan(task_of(tables, [1, 1], groups=(("a", "b"),)), apart)
    with pytest.raises(InvalidPlanError, match=r"'b' avoids devices \[1\]"):
        validate_plan(task_of(tables, [1, 1], avoid=(("b", (1,)),)), apart)
    with pytest.raises(InvalidPlanError, match=r"'a' is pinned to device 1"):
        validate_plan(task_of(tables, [1, 1], pins=(("a", 1),)), apart)
    halves = Plan(2, (Shard("a", 0, 0, 8), Shard("a", 1, 8, 16), Shard("b", 1, 0, 16)))
    with pytest.raises(InvalidPlanError, match=r"'a' must stay whole"):
        validate_plan(task_of(tables, [1, 1], whole=("a",)), halves)


@pytest.mark.parametrize("constraints, words", [
    (dict(pins=(("a", 1),), avoid=(("a", (1,)),)), r"'a': pin to device 1 conflicts with its avoid \[1\]"),
    (dict(avoid=(("a", (0, 1)),)), r"'a' avoids every device"),
    (dict(pins=(("a", 0), ("b", 1)), groups=(("a", "b"),)), r"group \['a', 'b'\]: members are pinned to different"),
    (dict(avoid=(("a", (0,)), ("b", (1,))), groups=(("a", "b"),)),
     r"group \['a', 'b'\]: no device is allowed for all of its tables: 'a' \(avoid \[0\]\), 'b' \(avoid \[1\]\)"),
    (dict(groups=(("a", "b", "c"),)),
     r"group \['a', 'b', 'c'\] needs 0.001 GB on one device, but the largest device it may use \(device 0\) holds"),
    (dict(pins=(("a", 0), ("b", 0), ("c", 0))), r"device 0: table 'a' \(pinned\), table 'b' \(pinned\), table 'c'"),
    (dict(whole=("c",), avoid=(("c", (1,)),)), None),  # satisfiable: c fits device 0
])
def test_unsatisfiable_constraints_are_named(constraints, words):
    # a, b: 64 KB each; c: 1 MB; two devices of 1.05 MB
    tables = [table("a", rows=1000), table("b", rows=1000), table("c", rows=16_000)]
    task = Task("t", tuple(tables), (Device(int(1.05 * 2**20)), Device(int(1.05 * 2**20))), MemoryModel(),
                **constraints)
    if words is None:
        check_satisfiable(task)
        for name in OURS:
            validate_plan(task, ours(name).shard(task))
        return
    with pytest.raises(InfeasibleTaskError, match=words):
        check_satisfiable(task)
    for name in OURS:  # every sharder of ours refuses with the same message
        with pytest.raises(InfeasibleTaskError, match=words):
            ours(name).shard(task)


def test_placement_that_constraints_make_impossible_says_which_constraints():
    # each device fits two of the three tables; the group needs all three on one device
    tables = [table(f"t{i}", rows=1000) for i in range(3)]
    task = Task("t", tuple(tables), (Device(140_000), Device(140_000)), MemoryModel(), groups=(("t0", "t1", "t2"),))
    with pytest.raises(InfeasibleTaskError, match=r"group \['t0', 't1', 't2'\] needs"):
        make_sharder("size_greedy").shard(task)
    # jointly infeasible (each constraint satisfiable alone): the error names the table's constraints
    tables = [table(f"t{i}", rows=1000) for i in range(4)]
    task = Task("t", tuple(tables), (Device(140_000), Device(140_000)), MemoryModel(),
                groups=(("t0", "t1"),), avoid=(("t0", (1,)), ("t2", (1,))))
    with pytest.raises(InfeasibleTaskError, match=r"under its constraints.*(avoids devices \[1\]|in group)"):
        make_sharder("size_greedy").shard(task)


def test_task_rejects_malformed_constraints():
    tables = (table("a"), table("b"))
    devices = (Device(2**20), Device(2**20))
    with pytest.raises(ValueError, match="unknown table 'z'"):
        Task("t", tables, devices, groups=(("a", "z"),))
    with pytest.raises(ValueError, match="avoids device 5"):
        Task("t", tables, devices, avoid=(("a", (5,)),))
    with pytest.raises(ValueError, match="'a' is in two groups"):
        Task("t", tables + (table("c"),), devices, groups=(("a", "b"), ("a", "c")))
    with pytest.raises(ValueError, match="at least two tables"):
        Task("t", tables, devices, groups=(("a",),))
    with pytest.raises(ValueError, match="speed must be a positive"):
        Device(2**20, speed=0.0)


# ---------------------------------------------------------------- speed in costs and bounds; hosts


def test_analytic_cost_divides_compute_by_speed():
    tables = [table(f"t{i}") for i in range(4)]
    plan = Plan.from_assignment(task_of(tables, [10, 10]), [0, 0, 1, 1])
    backend = analytic()
    alike = backend.plan_cost(task_of(tables, [10, 10]), plan)
    fast = backend.plan_cost(task_of(tables, [10, 10], speeds=[2.0, 1.0]), plan)
    assert fast.devices[0].fwd_ms == pytest.approx(alike.devices[0].fwd_ms / 2)
    assert fast.devices[0].bwd_ms == pytest.approx(alike.devices[0].bwd_ms / 2)
    assert fast.devices[1].bwd_ms == pytest.approx(alike.devices[1].bwd_ms)
    assert not fast.measured


@pytest.mark.parametrize("regime", ["super_additive", "sub_additive"])
@pytest.mark.parametrize("seed", range(6))
def test_lower_bound_holds_on_devices_of_different_speed(regime, seed):
    rng = np.random.default_rng(seed)
    tables = [Table(f"t{i}", int(rng.integers(100, 200_000)), int(4 * rng.integers(1, 33)),
                    float(rng.lognormal(2, 1)), tuple(float(k == rng.integers(0, 17)) for k in range(17)))
              for i in range(6)]
    speeds = [float(s) for s in rng.choice([0.5, 1.0, 2.0, 4.0], size=3)]
    hosts = ["h0", "h0", "h1"] if seed % 2 else [""] * 3
    task = Task("hetero", tuple(tables), tuple(Device(10 * GB, speed=s, host=h) for s, h in zip(speeds, hosts)))
    topology = Topology(devices_per_host=2)
    backend = analytic(regime, topology=topology)
    best = min(backend.plan_cost(task, Plan.from_assignment(task, a)).cost_ms
               for a in itertools.product(range(3), repeat=len(tables)))
    bound = lower_bound(backend, task, regime)
    assert bound.total_ms <= best * (1 + 1e-9), (speeds, bound, best)
    assert bound.total_ms > 0.2 * best  # and not vacuous


def test_hosts_named_by_devices_choose_the_links():
    topology = Topology(devices_per_host=2, intra_host_gbps=100.0, inter_host_gbps=10.0)
    dims = [64, 64, 64, 64]
    consecutive = transfer_ms(dims, 4096, topology)
    named = transfer_ms(dims, 4096, topology, hosts=[0, 0, 1, 1])
    one_host = transfer_ms(dims, 4096, topology, hosts=[0, 0, 0, 0])
    assert np.allclose(consecutive, named)
    assert (one_host < named).all()
    task = Task("t", (table("a"),), tuple(Device(2**20, host=h) for h in ("x", "y", "x")))
    assert task.host_ids() == (0, 1, 0)
    with pytest.raises(ValueError, match="name all or none"):
        Task("t", (table("a"),), (Device(2**20, host="x"), Device(2**20))).host_ids()


def test_fbgemm_refuses_devices_of_different_speed():
    from dreamshard.data.lookups import GeneratedLookups
    from dreamshard.hardware import make_backend

    task = task_of([table("a"), table("b")], [10, 10], speeds=[2.0, 1.0])
    backend = make_backend("fbgemm", GeneratedLookups(seed=0), iterations=1, warmup=0)
    with pytest.raises(DreamShardError, match="cannot measure devices of different speeds"):
        backend.plan_cost(task, Plan.from_assignment(task, [0, 1]))


def test_torchrec_refuses_what_it_cannot_honour_and_keeps_whole_tables_whole():
    pytest.importorskip("torchrec")
    tables = [table(f"t{i}", rows=20_000, dim=64) for i in range(4)]  # 5.1 MB each
    with pytest.raises(DreamShardError, match=r"cannot honour pin \(t0\); group"):
        make_sharder("torchrec_full").shard(task_of(tables, [12, 12], pins=(("t0", 1),), groups=(("t1", "t2"),)))
    # per-rank memory: rank 0 holds one table, rank 1 three
    task = task_of(tables, [6, 16], whole=("t0", "t1", "t2", "t3"))
    plan = make_sharder("torchrec_full").shard(task)
    validate_plan(task, plan)
    assert sorted(sum(s.device == d for s in plan.shards) for d in range(2)) == [1, 3]


# ---------------------------------------------------------------- files


def test_devices_file_csv_and_json(tmp_path):
    csv = tmp_path / "devices.csv"
    csv.write_text("memory_gb,kind,speed,host\n80,h100,2.0,a\n40,a100,1,a\n40,a100,,b\n")
    devices = read_devices_file(csv)
    assert [d.memory_bytes for d in devices] == [80 * GB, 40 * GB, 40 * GB]
    assert [(d.kind, d.speed, d.host) for d in devices] == [("h100", 2.0, "a"), ("a100", 1.0, "a"), ("a100", 1.0, "b")]
    js = tmp_path / "devices.json"
    js.write_text(json.dumps({"devices": [{"memory_gb": 16}, {"memory_gb": 32, "speed": 1.5}]}))
    assert [(d.memory_bytes, d.speed) for d in read_devices_file(js)] == [(16 * GB, 1.0), (32 * GB, 1.5)]


@pytest.mark.parametrize("text, words", [
    ("kind\nh100\n", r"device 0: field 'memory_gb': expected a number"),
    ("memory_gb,speed\n16,0\n", r"device 0: field 'speed': expected a positive number"),
    ("memory_gb,speed\n16,fast\n", r"device 0: field 'speed': expected a number, got 'fast'"),
    ("memory_gb,host\n16,a\n16,\n", r"device 1: field 'host' is empty"),
    ("memory_gb,colour\n16,red\n", r"unknown column 'colour'; expected memory_gb, kind, speed, host"),
    ("memory_gb\n-1\n", r"device 0: field 'memory_gb': expected a number in \(0"),
])
def test_bad_devices_file_names_file_device_and_field(tmp_path, text, words):
    path = tmp_path / "devices.csv"
    path.write_text(text)
    with pytest.raises(DataFormatError, match=rf"{path}: {words}"):
        read_devices_file(path)


def test_constraints_from_tables_file_and_constraints_file(tmp_path):
    tables = tmp_path / "tables.csv"
    tables.write_text("name,rows,dim,pooling_factor,group,pin,avoid,whole\n"
                      "a,100,8,1,g,,,\nb,100,8,1,g,,,\nc,100,8,1,,1,,\nd,100,8,1,,,0;2,true\n")
    c = read_table_constraints(tables)
    assert c == Constraints({"c": 1}, {"d": (0, 2)}, (("a", "b"),), ("d",))
    path = tmp_path / "constraints.json"
    path.write_text(json.dumps({"pin": {"c": 1, "e": 0}, "whole": ["a"]}))
    merged = c.merged(read_constraints_file(path), str(path))
    assert merged.pin == {"c": 1, "e": 0} and merged.whole == ("d", "a")
    with pytest.raises(DataFormatError, match=r"table 'c': pin 2 conflicts with pin 1"):
        c.merged(constraints_from_json({"pin": {"c": 2}}, "x.json"), "x.json")
    for obj, words in [({"pins": {}}, r"unknown key 'pins'; did you mean 'pin'"),
                       ({"pin": {"a": "0"}}, r"pin.a: expected a device"),
                       ({"avoid": {"a": 1}}, r"avoid.a: expected a list"), ({"group": ["a", "b"]}, "group: expected")]:
        with pytest.raises(DataFormatError, match=words):
            constraints_from_json(obj, "c.json")


def test_cli_plans_a_heterogeneous_constrained_cluster_and_measure_rebuilds_it(tmp_path, capsys):
    tables = tmp_path / "tables.csv"
    rows = [f"t{i},{1000 * (i + 1)},16,{5 + i}" for i in range(8)]
    tables.write_text("name,rows,dim,pooling_factor,group\n" + "\n".join(
        r + (",g" if i in (1, 2) else ",") for i, r in enumerate(rows)) + "\n")
    devices = tmp_path / "devices.json"
    devices.write_text(json.dumps([{"memory_gb": 0.01, "kind": "h100", "speed": 2.0},
                                   {"memory_gb": 0.002, "kind": "a100"}]))
    constraints = tmp_path / "constraints.json"
    constraints.write_text(json.dumps({"avoid": {"t7": [0]}, "pin": {"t0": 1}}))
    plan_path = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(tables), "--devices-file", str(devices), "--constraints", str(constraints),
                 "--algo", "size_lookup_greedy", "-o", str(plan_path)]) == 0
    printed = capsys.readouterr().out
    assert "2 devices (1 x 0.01 GB h100 speed 2, 1 x 0.002 GB a100)" in printed
    meta = json.loads(plan_path.read_text())
    assert meta["devices"][0] == {"memory_gb": 0.01, "kind": "h100", "speed": 2.0}
    assert meta["constraints"] == {"group": [["t1", "t2"]], "pin": {"t0": 1}, "avoid": {"t7": [0]}}
    where = {s["table"]: s["device"] for s in meta["shards"]}
    assert where["t0"] == 1 and where["t7"] == 1 and where["t1"] == where["t2"]
    assert main(["measure", "--tables", str(tables), "--plan", str(plan_path), "--backend", "analytic",
                 "--regime", "super_additive", "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)
    assert len(measured["devices"]) == 2 and measured["measured"] is False
    # a hand-edited plan that breaks a recorded constraint is refused
    meta["shards"] = [dict(s, device=0) if s["table"] == "t7" else s for s in meta["shards"]]
    plan_path.write_text(json.dumps(meta))
    assert main(["measure", "--tables", str(tables), "--plan", str(plan_path), "--backend", "analytic",
                 "--regime", "super_additive"]) == 1
    assert "'t7' avoids devices [0]" in capsys.readouterr().err


def test_cli_device_options_are_one_or_the_other(tmp_path, capsys):
    tables = tmp_path / "tables.csv"
    tables.write_text("name,rows,dim,pooling_factor\na,100,8,1\n")
    devices = tmp_path / "devices.csv"
    devices.write_text("memory_gb\n1\n")
    out = str(tmp_path / "p.json")
    assert main(["plan", "--tables", str(tables), "--algo", "size_greedy", "-o", out]) == 1
    assert "--devices-file" in capsys.readouterr().err
    assert main(["plan", "--tables", str(tables), "--devices", "2", "--memory-gb", "1", "--devices-file",
                 str(devices), "--algo", "size_greedy", "-o", out]) == 1
    assert "one or the other" in capsys.readouterr().err


def test_torchrec_export_takes_gpus_per_host_from_the_named_hosts():
    pytest.importorskip("torchrec")
    from dreamshard.interop.torchrec import local_size_of, to_torchrec_module_plan

    tables = (table("a"), table("b"), table("c"), table("d"))
    task = Task("t", tables, tuple(Device(2**20, host=h) for h in ("x", "x", "y", "y")))
    assert local_size_of(task) == 2
    module_plan = to_torchrec_module_plan(task, Plan.from_assignment(task, [0, 1, 2, 3]))
    assert [str(module_plan[t].sharding_spec.shards[0].placement) for t in "abcd"] == [
        "rank:0/cuda:0", "rank:1/cuda:1", "rank:2/cuda:0", "rank:3/cuda:1"]
    assert local_size_of(Task("t", tables, tuple(Device(2**20) for _ in range(4)))) == 4
    with pytest.raises(DreamShardError, match="consecutive block of ranks"):
        local_size_of(Task("t", tables, tuple(Device(2**20, host=h) for h in ("x", "y", "x", "y"))))
