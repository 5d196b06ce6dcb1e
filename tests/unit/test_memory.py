"""Memory as TorchRec allocates it: weights, optimizer state, input/output buffers, reservation.

The oracle is TorchRec's own `EmbeddingStorageEstimator` (through `torchrec_perf_estimate`): for every plan our
sharders make, our count of each rank is never below TorchRec's, and equals it where both count the same state,
for pooled tables (an EmbeddingBagCollection's) and sequence tables (an EmbeddingCollection's) alike.
"""
from __future__ import annotations

import json
import random

import pytest

from dreamshard.cli import main
from dreamshard.errors import InfeasibleTaskError
from dreamshard.memory import GB, MemoryModel
from dreamshard.plan import Plan, Shard, device_memory_breakdown, device_memory_bytes, validate_plan
from dreamshard.sharders import make_sharder
from dreamshard.tables import Table
from dreamshard.tasks import Task


def test_buffers_follow_torchrecs_rule_per_kind_of_shard():
    m = MemoryModel("fp32", "exact_sgd", batch_size=100)
    # a whole table or a column slice: the ids of all 4 devices' samples (int64), one pooled row per sample each
    assert m.io_bytes(3.0, 1, 16, 4, row_block=False) == 3 * 100 * 4 * 8 + 100 * 4 * 16 * 4
    # a row block: the batch's ids once, a partial sum per sample of every device
    assert m.io_bytes(3.0, 1, 16, 4, row_block=True) == 3 * 100 * 8 + 100 * 4 * 16 * 4
    # fewer than one lookup per sample: as many outputs as lookups; two features: two outputs per sample
    assert m.io_bytes(0.5, 1, 16, 1, row_block=False) == 50 * 8 + 50 * 16 * 4
    assert m.io_bytes(3.0, 2, 16, 1, row_block=False) == 300 * 8 + 200 * 16 * 4
    assert MemoryModel("fp16", batch_size=100).io_bytes(3.0, 1, 16, 1, False) == 300 * 8 + 100 * 16 * 2
    assert MemoryModel().io_bytes(3.0, 1, 16, 4, False) == 0  # batch 0: not counted (the pipeline's tasks)
    # a sequence table (an EmbeddingCollection's): a row per id received, not pooled
    assert m.io_bytes(3.0, 1, 16, 4, row_block=False, sequence=True) == 3 * 100 * 4 * 8 + 3 * 100 * 4 * 16 * 4
    assert m.io_bytes(3.0, 1, 16, 4, row_block=True, sequence=True) == 3 * 100 * 8 + 3 * 100 * 16 * 4


def test_reservation_shrinks_what_a_device_holds_and_validation_uses_it():
    t = Table("t", 1000, 64, 1.0)  # 256 000 bytes of fp32 weights
    tight = Task("x", (t,), Task.uniform("y", [t], 1, 300_000 / GB).devices)
    plan = Plan(1, (Shard("t", 0, 0, 64),))
    validate_plan(tight, plan)
    reserved = Task("x", (t,), tight.devices, MemoryModel(reservation=0.2))
    assert reserved.capacity(0) == int(tight.devices[0].memory_bytes * 0.8)
    with pytest.raises(Exception, match="reservation"):
        validate_plan(reserved, plan)
    with pytest.raises(InfeasibleTaskError):
        make_sharder("size_greedy").shard(Task("x", (t,), (tight.devices[0],) * 1, MemoryModel(reservation=0.2,
                                                                                            batch_size=512)))


def test_breakdown_adds_up_to_the_shards_bytes():
    tables = (Table("a", 5000, 32, 4.0), Table("b", 100, 8, 0.5), Table("c", 2000, 16, 2.0, features=2))
    task = Task.uniform("x", tables, 2, 0.01, MemoryModel("fp32", "adam", batch_size=64, reservation=0.1))
    plan = make_sharder("size_greedy").shard(task)
    parts = device_memory_breakdown(task, plan)
    assert [p.used for p in parts] == device_memory_bytes(task, plan)
    assert sum(p.weights for p in parts) == sum(t.rows * t.dim * 4 for t in tables)
    assert sum(p.optimizer for p in parts) == sum(t.rows * t.dim * 8 for t in tables)
    assert all(p.buffers > 0 and p.headroom == p.capacity - p.used for p in parts)


def _random_task(seed: int, memory: MemoryModel) -> Task:
    rng = random.Random(seed)
    tables = [Table(f"t{i}", rng.choice([100, 5_000, 200_000, 3_000_000]), rng.choice([8, 16, 64, 128]),
                    rng.choice([0.3, 1.0, 4.0, 30.0]), sequence=seed >= 3 and i % 2 == 0) for i in range(10)]
    return Task.uniform(f"r{seed}", tables, rng.choice([2, 4]), rng.choice([2.0, 8.0]), memory)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("optimizer", ["exact_sgd", "exact_row_wise_adagrad", "exact_adagrad", "adam"])
def test_no_plan_of_ours_exceeds_what_torchrec_estimates(precision, optimizer):
    pytest.importorskip("torchrec", reason="torchrec is not installed")
    from dreamshard.interop.torchrec import torchrec_perf_estimate

    checked = 0
    for seed in range(6):
        batch = (512, 65536)[seed % 2]
        task = _random_task(seed, MemoryModel(precision, optimizer, batch_size=batch, reservation=0.15))
        for algo in ("size_lookup_greedy", "lookup_greedy", "random"):
            try:
                plan = make_sharder(algo).shard(task)
            except InfeasibleTaskError:
                continue
            ours = device_memory_bytes(task, plan)
            theirs = torchrec_perf_estimate(task, plan, batch).rank_hbm_bytes
            assert all(o >= t for o, t in zip(ours, theirs)), (seed, algo, ours, theirs)
            assert all(t <= task.capacity(d) for d, t in enumerate(theirs))  # fits TorchRec's usable HBM
            if precision == "fp32" and optimizer != "exact_row_wise_adagrad":
                assert ours == list(theirs)  # the same state, counted alike
            checked += 1
    assert checked >= 6


def test_plan_command_counts_buffers_and_reservation(tmp_path, capsys):
    tables = tmp_path / "tables.csv"
    tables.write_text("name,rows,dim,pooling_factor\nbig,1000000,64,2.0\nsmall,1000,16,1.0\n")
    out = tmp_path / "plan.json"
    # 0.238 GB (GiB) of weights; 0.27 GB devices fit it whole without buffers or reservation ...
    args = ["plan", "--tables", str(tables), "--devices", "2", "--memory-gb", "0.27", "--algo", "size_greedy",
            "-o", str(out)]
    assert main([*args, "--reservation", "0", "--batch-size", "1"]) == 0
    assert {s["table"] for s in json.loads(out.read_text())["shards"] if s.get("col_start", 0) > 0} == set()
    # ... but not after TorchRec's 15% reservation: the table is cut
    assert main(args) == 0
    printed = capsys.readouterr().out
    obj = json.loads(out.read_text())
    assert any(s["table"] == "big" and s["col_end"] - s["col_start"] < 64 for s in obj["shards"])
    assert obj["batch_size"] == 512 and obj["reservation"] == 0.15
    assert "buffers at batch 512 per device, 15% of each device reserved" in printed
    assert "headroom" in printed and "optimizer" in printed
    # at batch 65536 with adam: 3x the weights, over the devices
    assert main([*args, "--batch-size", "65536", "--optimizer", "adam"]) == 1
    assert "tables need" in capsys.readouterr().err
    for bad in (["--batch-size", "0"], ["--reservation", "1"], ["--reservation", "-0.1"]):
        assert main([*args, *bad]) == 1
        assert bad[0] in capsys.readouterr().err
