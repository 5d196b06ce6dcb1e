"""Data-parallel tables (issue 34 item 3): replicas in plans, their memory and cost, the rule that picks them, and
every sharder of ours planning through it."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dreamshard.errors import InvalidPlanError
from dreamshard.hardware.comm import Topology, allreduce_ms
from dreamshard.memory import GB, MemoryModel
from dreamshard.plan import Plan, Shard, device_memory_bytes, validate_plan
from dreamshard.sharders import HEURISTICS, LEARNED, make_sharder
from dreamshard.sharders.replicas import data_parallel_tables, replica_shards
from dreamshard.tables import Table
from dreamshard.tasks import ALL_SHARDING_KINDS, Device, Task
from helpers import analytic

# rows: 50 and 400 fit the rule at 4 devices x 64 samples (1 feature: 256 lookups a step... 50 <= 256), 400 does not
TABLES = (Table("tiny", 50, 16, 2.0), Table("mid", 400, 16, 2.0), Table("big", 200_000, 32, 4.0),
          Table("huge", 1_000_000, 16, 1.0))


def dp_task(kinds=ALL_SHARDING_KINDS, batch_size=64, **extra) -> Task:
    return Task("dp", TABLES, tuple(Device(GB) for _ in range(4)), MemoryModel(batch_size=batch_size),
                sharding=kinds, **extra)


def test_the_rule_replicates_what_moves_fewer_bytes_than_its_outputs():
    task = dp_task()
    assert [t.name for t in data_parallel_tables(task)] == ["tiny"]  # 50 rows <= 1 x 256 lookups; 400 > 256
    assert [t.name for t in data_parallel_tables(dp_task(batch_size=128))] == ["tiny", "mid"]
    assert data_parallel_tables(dp_task(kinds=("table", "column", "row"))) == []  # not asked for
    assert data_parallel_tables(dp_task(batch_size=0)) == []  # no batch: no traffic to compare
    # constrained tables and sequence tables stay model-parallel
    assert data_parallel_tables(dp_task(model_parallel=("tiny",))) == []
    assert data_parallel_tables(dp_task(whole=("tiny",))) == []
    assert data_parallel_tables(dp_task(avoid=(("tiny", (1,)),))) == []
    seq = replace(dp_task(), tables=(replace(TABLES[0], sequence=True), *TABLES[1:]))
    assert data_parallel_tables(seq) == []


def test_a_replica_on_every_device_is_valid_and_nothing_else_is():
    task = dp_task()
    rest = [Shard("mid", 0, 0, 16), Shard("big", 1, 0, 32), Shard("huge", 2, 0, 16)]
    plan = Plan(4, (*rest, *replica_shards(TABLES[0], 4)))
    validate_plan(task, plan)
    assert Plan.from_dict(plan.to_dict()) == plan and plan.to_dict()["shards"][-1]["replica"] is True
    with pytest.raises(InvalidPlanError, match="allows sharding kinds table, column, row only"):
        validate_plan(replace(task, sharding=("table", "column", "row")), plan)
    with pytest.raises(InvalidPlanError, match="one replica on each of the 4 devices, got replicas on devices"):
        validate_plan(task, Plan(4, (*rest, *replica_shards(TABLES[0], 4)[:3])))
    with pytest.raises(InvalidPlanError, match="every shard of it is a whole replica"):
        validate_plan(task, Plan(4, (*rest, *replica_shards(TABLES[0], 4), Shard("tiny", 0, 0, 16))))
    with pytest.raises(InvalidPlanError, match="pin it, group it or keep it off devices"):
        validate_plan(replace(task, avoid=(("tiny", (3,)),)), plan)


def test_a_replica_holds_the_whole_table_and_buffers_its_own_samples():
    """Weights and optimizer state of the whole table on every device; its buffers hold one device's samples (TorchRec's
    data-parallel input and output sizes), a quarter of what the table-wise copy buffers for 4 devices."""
    task = dp_task()
    t = TABLES[0]
    replica, whole = task.shard_bytes(t, replica=True), task.shard_bytes(t)
    weights = 50 * 16 * 4
    assert replica - weights == (2 * 64 * 8) + (1 * 64 * 16 * 4)  # ids (int64) and pooled outputs, one device's
    assert whole - weights == 4 * (replica - weights)
    plan = Plan(4, (Shard("mid", 0, 0, 16), Shard("big", 1, 0, 32), Shard("huge", 2, 0, 16),
                    *replica_shards(t, 4)))
    alone = Plan(4, (Shard("mid", 0, 0, 16), Shard("big", 1, 0, 32), Shard("huge", 2, 0, 16)))
    with_t = replace(task, tables=TABLES)
    used, without = device_memory_bytes(with_t, plan), device_memory_bytes(replace(task, tables=TABLES[1:]), alone)
    assert [u - w for u, w in zip(used, without)] == [replica] * 4


def test_replicas_send_no_outputs_and_all_reduce_their_gradient():
    backend = analytic(batch_size=2048)
    task = dp_task()
    rest = (Shard("mid", 0, 0, 16), Shard("big", 1, 0, 32), Shard("huge", 2, 0, 16))
    replicated = backend.plan_cost(task, Plan(4, (*rest, *replica_shards(TABLES[0], 4))))
    on_three = backend.plan_cost(task, Plan(4, (*rest, Shard("tiny", 3, 0, 16))))
    gradient = 50 * 16 * 4
    assert allreduce_ms(gradient, 4, Topology()) == pytest.approx((10e-6 + 1.5 * gradient / 150e9) * 1e3)
    # device 3 held only "tiny": replicated, it sends no outputs (dim sum 0), and every device all-reduces
    from dreamshard.hardware.comm import transfer_ms

    sent = transfer_ms([16, 32, 16, 0], 2048, Topology())
    assert [d.bwd_comm_ms for d in replicated.devices] == pytest.approx(list(sent + allreduce_ms(gradient, 4,
                                                                                                 Topology())))
    assert [d.bwd_comm_ms for d in on_three.devices] == pytest.approx(list(transfer_ms([16, 32, 16, 16], 2048,
                                                                                       Topology())))
    # each replica looks up a quarter of the batch: device 3's compute falls
    assert replicated.devices[3].fwd_ms < on_three.devices[3].fwd_ms
    # nor ids: a replica looks its own samples up, no input dist
    from dreamshard.hardware.comm import plan_traffic

    assert plan_traffic(Plan(4, (*rest, *replica_shards(TABLES[0], 4))), task)[3].tolist() == [0.0, 0.0]
    assert plan_traffic(Plan(4, (*rest, Shard("tiny", 3, 0, 16))), task)[3, 1] > 0


def any_sharder(name: str, depth: int):
    from test_pieces import any_sharder

    return any_sharder(name, depth)


@pytest.mark.parametrize("name", HEURISTICS + LEARNED)
def test_every_sharder_of_ours_plans_the_rules_replicas(name):
    rng = np.random.default_rng(1)
    bins = tuple(float(x) for x in rng.dirichlet(np.ones(17))) if name in LEARNED else None
    tables = tuple(replace(t, bins=bins) for t in TABLES)
    task = replace(dp_task(), tables=tables)
    plan = any_sharder(name, depth=2).shard(task)
    validate_plan(task, plan)
    assert sorted(s.device for s in plan.shards if s.replica and s.table == "tiny") == [0, 1, 2, 3]
    assert not any(s.replica for s in plan.shards if s.table != "tiny")


def test_replicas_are_dropped_when_their_copies_leave_too_little():
    """A copy on every device takes memory that a full device lacks, where one copy fits beside a smaller table: the
    sharder plans every table model-parallel rather than fail."""
    tables = (Table("tiny", 50, 16, 2.0), Table("a", 10_000, 16, 1.0), Table("b", 20_000, 16, 1.0))
    memory = MemoryModel(batch_size=64)
    need = {t.name: Task("t", tables, (Device(GB),) * 2, memory).shard_bytes(t) for t in tables}
    # b fills a device alone; a and tiny share the other (a and b must stay whole)
    task = Task("t", tables, (Device(need["b"]),) * 2, memory, sharding=ALL_SHARDING_KINDS, whole=("a", "b"))
    assert need["a"] + need["tiny"] <= need["b"]
    assert [t.name for t in data_parallel_tables(task)] == ["tiny"]  # the rule picks it ...
    plan = make_sharder("size_greedy").shard(task)  # ... and its copy beside b does not fit
    validate_plan(task, plan)
    assert not any(s.replica for s in plan.shards)
    roomy = replace(task, devices=(Device(need["b"] + need["tiny"]),) * 2)
    assert any(s.replica for s in make_sharder("size_greedy").shard(roomy).shards)


def test_fbgemm_measures_replicas_with_the_dense_kernel_at_the_devices_share_of_the_batch():
    torch = pytest.importorskip("torch")
    pytest.importorskip("fbgemm_gpu")
    from dreamshard.data.lookups import GeneratedLookups
    from dreamshard.hardware.fbgemm import FbgemmBackend, FbgemmConfig, operator_groups

    task = dp_task()
    backend = FbgemmBackend(GeneratedLookups(seed=0), FbgemmConfig(batch_size=64, warmup=0, iterations=2))
    mixed = [Shard("mid", 0, 0, 16), *replica_shards(TABLES[0], 4)[:1]]
    groups = operator_groups(task, mixed)
    assert [[s.replica for s in g] for g in groups] == [[False], [True]]
    op = backend.build_operator(task, groups[1])
    assert op.offsets.numel() == 64 // 4 + 1  # one device's share of the batch
    out = op.op(op.indices, op.offsets)
    out.backward(op.grad)
    # the dense kernel's gradient: each looked-up row gets the output gradients of the samples that read it
    weights = op.op.weights.detach().view(50, 16)
    want = torch.zeros(50, 16)
    for b in range(16):
        for i in op.indices[op.offsets[b]:op.offsets[b + 1]]:
            want[i] += op.grad[b]
    assert torch.allclose(op.op.weights.grad.view(50, 16), want, atol=1e-6)
    assert torch.allclose(out, torch.stack([weights[op.indices[op.offsets[b]:op.offsets[b + 1]]].sum(0)
                                            for b in range(16)]), atol=1e-6)
    torch.set_num_threads(1)
    cost = backend.compute_cost(task, mixed)
    assert cost.fwd_ms > 0 and cost.bwd_ms > 0
