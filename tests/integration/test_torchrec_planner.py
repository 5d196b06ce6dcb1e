"""DreamShardPlanner: a drop-in TorchRec ShardingPlanner, on its own and inside DistributedModelParallel.

Needs torchrec (docs/torchrec.md); skipped without it. The DMP test runs two CPU ranks (gloo).
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

torchrec = pytest.importorskip("torchrec", reason="torchrec is not installed (see docs/torchrec.md)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.planner import ParameterConstraints, Topology  # noqa: E402
from torchrec.distributed.planner.storage_reservations import (  # noqa: E402
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
)
from torchrec.distributed.planner.types import PlannerError, PlannerErrorType  # noqa: E402
from torchrec.distributed.types import ShardingPlan  # noqa: E402

from dreamshard.errors import DreamShardError  # noqa: E402
from dreamshard.plan import device_memory_bytes, row_blocks  # noqa: E402
from dreamshard.planner import DreamShardPlanner  # noqa: E402

MB = 1024**2
NO_RESERVATION = FixedPercentageStorageReservation(0.0)  # tests of other things keep the topology's whole HBM


class TwoCollections(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sparse = torch.nn.Module()
        self.sparse.ebc = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name="big", embedding_dim=64, num_embeddings=50_000, feature_names=["f_big"]),
            EmbeddingBagConfig(name="small", embedding_dim=16, num_embeddings=1000, feature_names=["f_small", "g"]),
        ], device=torch.device("meta"))
        self.other = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name="thin", embedding_dim=4, num_embeddings=300_000, feature_names=["f_thin"]),
        ], device=torch.device("meta"))


def topology(world: int, mb: float, device: str = "cuda") -> Topology:
    if device == "cuda":
        return Topology(world_size=world, compute_device="cuda", hbm_cap=int(mb * MB))
    return Topology(world_size=world, compute_device="cpu", ddr_cap=int(mb * MB))


def test_plans_every_collection_with_pooling_from_constraints_and_memory_from_the_topology():
    # big: 50k x 64 x 4 B = 12.2 MB, more than one rank's 10 MB: cut into column slices; thin: 4.6 MB
    constraints = {"big": ParameterConstraints(pooling_factors=[20.0]),
                   "small": ParameterConstraints(pooling_factors=[2.0, 3.0])}
    planner = DreamShardPlanner(topology(2, 10.0), batch_size=512, constraints=constraints,
                                storage_reservation=NO_RESERVATION, algo="lookup_greedy")
    plan = planner.plan(TwoCollections(), [EmbeddingBagCollectionSharder()])
    assert isinstance(plan, ShardingPlan)
    assert set(plan.plan) == {"sparse.ebc", "other"}
    assert set(plan.plan["sparse.ebc"]) == {"big", "small"} and set(plan.plan["other"]) == {"thin"}
    assert plan.plan["sparse.ebc"]["big"].sharding_type == "column_wise"
    task = planner.last_task
    assert {t.name: t.pooling_factor for t in task.tables} == {"big": 20.0, "small": 5.0, "thin": 1.0}
    assert [d.memory_bytes for d in task.devices] == [10 * MB] * 2
    assert max(device_memory_bytes(task, planner.last_plan)) <= 10 * MB
    # rows only: the big table goes row-wise, TorchRec's layout (25k rows on each rank)
    rows = DreamShardPlanner(topology(2, 10.0), storage_reservation=NO_RESERVATION, algo="lookup_greedy",
                             sharding=("table", "row"))
    ps = rows.plan(TwoCollections(), [EmbeddingBagCollectionSharder()]).plan["sparse.ebc"]["big"]
    assert ps.sharding_type == "row_wise" and ps.ranks == [0, 1]
    assert [list(m.shard_sizes) for m in ps.sharding_spec.shards] == [[25_000, 64], [25_000, 64]]


def test_constraints_it_cannot_honour_are_planner_errors():
    ebc = [EmbeddingBagCollectionSharder()]
    # dense alone: data-parallel, which the sharder offers only on ranks of one host... here none offers it
    no_kernel = {"big": ParameterConstraints(compute_kernels=["key_value"])}
    with pytest.raises(PlannerError, match=r"table 'big': its constraint allows .* compute kernels \['key_value'\]") \
            as caught:
        DreamShardPlanner(topology(2, 100.0), constraints=no_kernel).plan(TwoCollections(), ebc)
    assert caught.value.error_type == PlannerErrorType.STRICT_CONSTRAINTS and isinstance(caught.value, DreamShardError)
    tw_only = {"big": ParameterConstraints(sharding_types=["table_wise"])}
    with pytest.raises(PlannerError, match=r"table 'big' \(whole\) needs 0\.012 GB on one device") as caught:
        DreamShardPlanner(topology(2, 10.0), constraints=tw_only, storage_reservation=NO_RESERVATION).plan(
            TwoCollections(), ebc)  # table_wise only: never cut, so it fits nowhere
    assert caught.value.error_type == PlannerErrorType.STRICT_CONSTRAINTS  # both ranks hold it, not one
    assert DreamShardPlanner(topology(2, 10.0)).plan(torch.nn.Linear(2, 2), ebc) == ShardingPlan({})  # as TorchRec
    with pytest.raises(DreamShardError, match="initialised process group"):
        DreamShardPlanner(topology(2, 10.0)).collective_plan(TwoCollections(), ebc)


class RestrictedSharder(EmbeddingBagCollectionSharder):
    """As TorchRec's tests restrict a sharder: only some sharding types, or only some kernels."""

    def __init__(self, types, kernels=("fused",)) -> None:
        super().__init__()
        self._types, self._kernels = list(types), list(kernels)

    def sharding_types(self, compute_device_type):
        return self._types

    def compute_kernels(self, sharding_type, compute_device_type):
        return self._kernels


def test_sharders_restrictions_are_honoured_or_refused():
    roomy = {"storage_reservation": NO_RESERVATION, "debug": False}
    rows_only = RestrictedSharder(["table_wise", "row_wise"])
    plan = DreamShardPlanner(topology(2, 10.0), algo="lookup_greedy", **roomy).plan(TwoCollections(), [rows_only])
    assert plan.plan["sparse.ebc"]["big"].sharding_type == "row_wise"  # column_wise is not offered: rows instead
    columns_only = RestrictedSharder(["column_wise"])  # as TorchRec's tests restrict one: whole tables are one slice
    plan = DreamShardPlanner(topology(2, 10.0), algo="lookup_greedy", **roomy).plan(TwoCollections(), [columns_only])
    assert {ps.sharding_type for m in plan.plan.values() for ps in m.values()} == {"column_wise"}
    assert len(plan.plan["sparse.ebc"]["big"].ranks) > 1 and len(plan.plan["other"]["thin"].ranks) == 1
    # row_wise alone (as TorchRec's tests restrict one): every table in TorchRec's row-wise layout on every rank
    row_wise = RestrictedSharder(["row_wise"])
    planner = DreamShardPlanner(topology(2, 100.0), **roomy)
    plan = planner.plan(TwoCollections(), [row_wise])
    assert {ps.sharding_type for m in plan.plan.values() for ps in m.values()} == {"row_wise"}
    by_table = {}
    for sh in planner.last_plan.shards:
        by_table.setdefault(sh.table, []).append((sh.device, sh.row_start, sh.row_end))
    rows = {t.name: t.rows for t in planner.last_task.tables}
    for name, blocks in by_table.items():
        assert sorted(blocks) == [(d, a, b) for d, (a, b) in enumerate(row_blocks(rows[name], 2))]
    with pytest.raises(PlannerError, match=r"offers \['row_wise'\].*`sharding` allows \['table'\]"):
        DreamShardPlanner(topology(2, 100.0), sharding=("table", "column"), **roomy).plan(TwoCollections(), [row_wise])
    table_wise_only = {"thin": ParameterConstraints(sharding_types=["table_wise"])}
    with pytest.raises(PlannerError, match=r"'thin': its constraint allows sharding types \['table_wise'\].*"
                                           r"offers \['row_wise'\]"):
        DreamShardPlanner(topology(2, 100.0), constraints=table_wise_only, **roomy).plan(TwoCollections(), [row_wise])
    for sharder, said in ((RestrictedSharder(["data_parallel"]), r"offers \['data_parallel'\]"),
                          (RestrictedSharder(["table_wise"], kernels=("dense",)), "fused kernel none")):
        with pytest.raises(DreamShardError, match=said):
            DreamShardPlanner(topology(2, 100.0), **roomy).plan(TwoCollections(), [sharder])


def test_every_constraint_field_is_honoured_or_refused():
    roomy = {"storage_reservation": NO_RESERVATION, "debug": False}
    ebc = [EmbeddingBagCollectionSharder()]
    written = {"big": ParameterConstraints(pooling_factors=[2.0], enforce_hbm=True, stochastic_rounding=False)}
    plan = DreamShardPlanner(topology(2, 100.0), constraints=written, **roomy).plan(TwoCollections(), ebc)
    big = plan.plan["sparse.ebc"]["big"]
    assert big.enforce_hbm is True and big.stochastic_rounding is False  # written as TorchRec writes them
    for field, value in (("batch_sizes", [64]), ("feature_names", ["other"]), ("min_partition", 0)):
        with pytest.raises(PlannerError, match=f"table 'big': constraint {field}") as caught:
            DreamShardPlanner(topology(2, 100.0), constraints={"big": ParameterConstraints(**{field: value})},
                              **roomy).plan(TwoCollections(), ebc)
        assert caught.value.error_type == PlannerErrorType.INPUT_VALIDATION
    # num_poolings multiplies a table's lookups and its pooled outputs, as TorchRec's estimators count them
    planner = DreamShardPlanner(topology(2, 100.0), constraints={"small": ParameterConstraints(
        pooling_factors=[2.0, 3.0], num_poolings=[2.0, 1.0])}, **roomy)
    planner.plan(TwoCollections(), ebc)
    small = next(t for t in planner.last_task.tables if t.name == "small")
    assert (small.pooling_factor, small.features) == (7.0, 3)


def test_embedding_and_fused_collections_are_planned_beside_bags():
    """An EmbeddingCollection (sequence embeddings) is planned with the EBCs, by its own sharder, at memory TorchRec
    counts for sequences (a row per id); so is a FusedEmbeddingBagCollection, with the optimizer it carries. Without
    its sharder DMP would leave such a module unsharded: an error naming it."""
    from torchrec import EmbeddingCollection, EmbeddingConfig
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    model = TwoCollections()
    model.seq = EmbeddingCollection(tables=[
        EmbeddingConfig(name="seq", embedding_dim=16, num_embeddings=100_000, feature_names=["f_seq"]),
        EmbeddingConfig(name="seq2", embedding_dim=16, num_embeddings=500, feature_names=["f_seq2"])],
        device=torch.device("meta"))
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    planner = DreamShardPlanner(topology(2, 20.0), batch_size=512, algo="size_lookup_greedy",
                                storage_reservation=NO_RESERVATION,
                                constraints={"seq": ParameterConstraints(pooling_factors=[8.0])})
    plan = planner.plan(model, sharders)
    assert sorted(plan.plan) == ["other", "seq", "sparse.ebc"]
    assert set(plan.plan["seq"]) == {"seq", "seq2"}
    task = planner.last_task
    seq = next(t for t in task.tables if t.name == "seq")
    assert seq.sequence and seq.pooling_factor == 8.0
    assert not any(t.sequence for t in task.tables if t.name in ("big", "small", "thin"))
    # a sequence table's buffers: a row per id it receives, where a pooled one has a row per sample
    pooled = replace(seq, sequence=False)
    assert task.shard_bytes(seq) - task.shard_bytes(pooled) == (8 - 1) * 512 * 2 * 16 * 4
    # no sharder for the EmbeddingCollection: left unplanned, as TorchRec's planner leaves it
    assert sorted(planner.plan(model, [EmbeddingBagCollectionSharder()]).plan) == ["other", "sparse.ebc"]

    class TableWiseOnly(EmbeddingCollectionSharder):  # a restricted EC sharder is honoured
        def sharding_types(self, compute_device_type):
            return ["table_wise"]

    whole = planner.plan(model, [EmbeddingBagCollectionSharder(), TableWiseOnly()])
    kinds = {name: p.sharding_type for m in whole.plan.values() for name, p in m.items()}
    # the bag sharder offers data_parallel: "small" (1000 rows, 2 features x 1024 samples a step) is replicated
    assert kinds == {"seq": "table_wise", "seq2": "table_wise", "big": "table_wise", "thin": "table_wise",
                     "small": "data_parallel"}
    assert planner.last_task.sharding == ("table", "data")

    class RowWiseOnly(EmbeddingCollectionSharder):
        def sharding_types(self, compute_device_type):
            return ["row_wise"]

    with pytest.raises(DreamShardError, match="the EmbeddingCollection sharder offers .'row_wise'. with the fused"):
        planner.plan(model, [EmbeddingBagCollectionSharder(), RowWiseOnly()])
    # a FusedEmbeddingBagCollection: planned by its own sharder, its state counted for the optimizer it carries
    from torchrec.distributed.fused_embeddingbag import FusedEmbeddingBagCollectionSharder

    fused = TwoCollections()
    fused.fused = FusedEmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="fb", embedding_dim=8, num_embeddings=100, feature_names=["f_fb"])],
        optimizer_type=torch.optim.Adagrad, optimizer_kwargs={"lr": 0.1}, device=torch.device("meta"))
    roomy = DreamShardPlanner(topology(2, 100.0), storage_reservation=NO_RESERVATION)
    fused_plan = roomy.plan(fused, [EmbeddingBagCollectionSharder(), FusedEmbeddingBagCollectionSharder()])
    assert sorted(fused_plan.plan) == ["fused", "other", "sparse.ebc"]
    assert roomy.last_task.memory.optimizer == "exact_adagrad"

    class FusedTableWise(FusedEmbeddingBagCollectionSharder):  # one rule narrows by every planned module's sharder
        def sharding_types(self, compute_device_type):
            return ["table_wise"]

    whole = roomy.plan(fused, [EmbeddingBagCollectionSharder(), FusedTableWise()])
    assert roomy.last_task.sharding == ("table",)
    assert {p.sharding_type for m in whole.plan.values() for p in m.values()} == {"table_wise"}
    # no FusedEmbeddingBagCollectionSharder: the fused collection is left unplanned, as TorchRec's planner leaves it
    assert "fused" not in roomy.plan(fused, [EmbeddingBagCollectionSharder()]).plan


def test_memory_is_what_torchrec_allocates():
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from dreamshard.interop.torchrec import torchrec_perf_estimate

    sharders = [EmbeddingBagCollectionSharder()]
    model = TwoCollections()
    apply_optimizer_in_backward(torch.optim.Adam, model.parameters(), {"lr": 0.01})
    topo = topology(2, 60.0)
    planner = DreamShardPlanner(topo, batch_size=4096, algo="size_lookup_greedy", debug=False)
    planner.plan(model, sharders)
    task = planner.last_task
    assert task.memory.optimizer == "adam" and task.memory.batch_size == 4096  # read off the module
    # each rank holds what TorchRec's default reservation leaves of its HBM
    reserved = HeuristicalStorageReservation(percentage=0.15).reserve(topo, 4096, model, sharders, {})
    assert [d.memory_bytes for d in task.devices] == [d.storage.hbm for d in reserved.devices]
    assert all(d.memory_bytes < 60 * MB for d in task.devices)
    # TorchRec's own storage estimate of the plan: within it, and never above our count
    hbm = torchrec_perf_estimate(task, planner.last_plan, 4096).rank_hbm_bytes
    assert planner.last_hbm == hbm
    assert all(t <= o <= task.capacity(r) for r, (t, o) in enumerate(zip(hbm, device_memory_bytes(task,
                                                                                                   planner.last_plan))))
    # the same tables need 3x with Adam: a contradicting optimizer argument is an error, not ignored
    with pytest.raises(DreamShardError, match="optimizer='exact_sgd'.*'adam'"):
        DreamShardPlanner(topo, batch_size=4096, optimizer="exact_sgd").plan(model, sharders)
    # at batch 262144 the buffers of every slice overflow these ranks: an error, never a plan that does not fit
    with pytest.raises(DreamShardError, match="tables need"):
        DreamShardPlanner(topo, batch_size=262144, storage_reservation=NO_RESERVATION).plan(model, sharders)


def test_tables_hbm_cannot_hold_are_uvm_cached_as_torchrec_counts_them():
    """On 2 x 8 MB the tables (17 MB) do not fit HBM: with TorchRec's sharders offering fused_uvm_caching on cuda,
    the largest is kept in host memory with a cache (no bins: half its rows), TorchRec's kernel and cache load
    factor in the plan, and TorchRec's own storage estimate within each rank. A constraint leaving the kernel
    out keeps it in HBM, and then no plan fits."""
    from dreamshard.interop.torchrec import torchrec_perf_estimate

    roomy = {"storage_reservation": NO_RESERVATION, "debug": False, "algo": "size_lookup_greedy"}
    planner = DreamShardPlanner(topology(2, 8.0), **roomy)
    plan = planner.plan(TwoCollections(), [EmbeddingBagCollectionSharder()])
    task = planner.last_task
    assert task.kernels == ("fused", "fused_uvm_caching", "fused_uvm")
    big = plan.plan["sparse.ebc"]["big"]
    assert big.compute_kernel == "fused_uvm_caching" and big.cache_params.load_factor == 0.5
    assert {p.compute_kernel for m in plan.plan.values() for n, p in m.items() if n != "big"} <= {"fused", "dense"}
    assert {s.cache for s in planner.last_plan.shards if s.table == "big"} == {0.5}
    hbm = torchrec_perf_estimate(task, planner.last_plan, task.memory.batch_size).rank_hbm_bytes
    assert hbm == tuple(device_memory_bytes(task, planner.last_plan))
    assert all(h <= task.capacity(r) for r, h in enumerate(hbm))
    kept = DreamShardPlanner(topology(2, 8.0), constraints={"big": ParameterConstraints(compute_kernels=["fused"])},
                             **roomy).plan(TwoCollections(), [EmbeddingBagCollectionSharder()])
    kernels = {n: p.compute_kernel for m in kept.plan.values() for n, p in m.items()}
    assert kernels["big"] == "fused" and kernels["thin"] == "fused_uvm_caching"  # the next largest instead
    with pytest.raises(DreamShardError, match="tables need"):  # and with neither cached no plan fits
        DreamShardPlanner(topology(2, 8.0), **roomy, constraints={
            n: ParameterConstraints(compute_kernels=["fused"]) for n in ("big", "thin")}).plan(
                TwoCollections(), [EmbeddingBagCollectionSharder()])
    # HBM too small for the smallest caches: tables wholly in host memory (TorchRec's fused_uvm), counted as TorchRec
    # counts them; a constraint leaving the kernel out keeps its table from it
    host = DreamShardPlanner(topology(2, 1.0), **roomy)
    plan = host.plan(TwoCollections(), [EmbeddingBagCollectionSharder()])
    kernels = {n: p.compute_kernel for m in plan.plan.values() for n, p in m.items()}
    assert "fused_uvm" in kernels.values(), kernels
    assert all(p.cache_params is None for m in plan.plan.values() for p in m.values() if p.compute_kernel == "fused_uvm")
    hbm = torchrec_perf_estimate(host.last_task, host.last_plan, 512).rank_hbm_bytes
    assert hbm == tuple(device_memory_bytes(host.last_task, host.last_plan))
    no_host = {n: ParameterConstraints(compute_kernels=["fused", "fused_uvm_caching"]) for n in kernels}
    with pytest.raises(DreamShardError):
        DreamShardPlanner(topology(2, 1.0), constraints=no_host, **roomy).plan(
            TwoCollections(), [EmbeddingBagCollectionSharder()])
    # CPU ranks: TorchRec offers no UVM caching there
    cpu = DreamShardPlanner(topology(2, 20.0, "cpu"), **roomy)
    cpu.plan(TwoCollections(), [EmbeddingBagCollectionSharder()])
    assert cpu.last_task.kernels == ("fused",)


def test_constructor_takes_torchrecs_arguments_in_torchrecs_order():
    model, sharders = TwoCollections(), [EmbeddingBagCollectionSharder()]
    # EmbeddingShardingPlanner(topology, batch_size, enumerator, storage_reservation, ...)
    planner = DreamShardPlanner(topology(2, 40.0), 512, None, FixedPercentageStorageReservation(0.25), debug=False,
                                timeout_seconds=60, algo="lookup_greedy")
    planner.plan(model, sharders)
    assert [d.memory_bytes for d in planner.last_task.devices] == [int(40 * MB * 0.75)] * 2
    for name in ("enumerator", "proposer", "partitioner", "performance_model", "callbacks", "plan_loader"):
        with pytest.raises(DreamShardError, match=f"{name}: TorchRec's planner parts"):
            DreamShardPlanner(topology(2, 40.0), **{name: object()})
    with pytest.raises(DreamShardError, match="topology is required"):
        DreamShardPlanner()
    # no algo: our best with a model (dreamshard_cut), our search rated by TorchRec's perf model without one
    assert DreamShardPlanner(topology(2, 40.0)).algo == "torchrec_model"


# the shard filler of the DMP scripts, prepended to each (they run as files of their own on the ranks)
FILL_SHARDS = r'''
import torch


def fill_shards(dmp, value, kinds=("",)):
    """Each local shard of a `.weight` whose name holds one of `kinds`, filled with value(r0, c0, nr, nc): the
    same block of the unsharded table. Returns [table, first row, end row, first column, end column] of each."""
    held = []
    with torch.no_grad():
        for name, tensor in dmp.state_dict().items():
            if name.endswith(".weight") and any(k in name for k in kinds):
                if not hasattr(tensor, "local_shards"):  # a data-parallel table: the whole of it on every rank
                    nr, nc = tensor.shape
                    tensor.copy_(value(0, 0, nr, nc))
                    held.append([name.split(".")[-2], 0, nr, 0, nc])
                    continue
                for s in tensor.local_shards():
                    (r0, c0), (nr, nc) = s.metadata.shard_offsets, s.metadata.shard_sizes
                    s.tensor.copy_(value(r0, c0, nr, nc))
                    held.append([name.split(".")[-2], r0, r0 + nr, c0, c0 + nc])
    return held
'''

DMP_SCRIPT = FILL_SHARDS + r'''
"""Two CPU ranks: DreamShardPlanner's plan in DistributedModelParallel; pooled outputs and loss match an
unsharded copy of the model on the same batch, and a training step runs."""
import json
import sys

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import ParameterConstraints, Topology
from torchrec.modules.embedding_configs import DataType
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

from dreamshard.planner import DreamShardPlanner

TABLES = [("big", 60_000, 32), ("mid", 3_000, 16), ("small", 100, 8)]  # big: 7.3 MB, more than a rank's 6 MB
BUDGET = 6 * 1024**2


def weight(rows, cols, row_off=0, col_off=0):
    """The same deterministic weights for any block of a table, sharded or not."""
    r = torch.arange(row_off, row_off + rows, dtype=torch.float64)[:, None]
    c = torch.arange(col_off, col_off + cols, dtype=torch.float64)[None, :]
    return (torch.sin(r * 0.37 + c * 1.3) * 0.1).float()


class Model(torch.nn.Module):
    def __init__(self, device, half=()):
        super().__init__()
        configs = [EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=[f"f_{n}"],
                                      data_type=DataType.FP16 if n in half else DataType.FP32)
                   for n, r, d in TABLES]
        self.ebc = EmbeddingBagCollection(tables=configs, device=device)
        self.top = torch.nn.Linear(sum(d for _, _, d in TABLES), 1)
        with torch.no_grad():
            self.top.weight.copy_(torch.linspace(-1, 1, self.top.weight.numel()).view_as(self.top.weight))
            self.top.bias.fill_(0.1)

    def forward(self, features):
        pooled = self.ebc(features).values()
        return pooled, self.top(pooled).pow(2).mean()


def batch(rank, size=64):
    g = torch.Generator().manual_seed(100 + rank)
    lengths = torch.randint(0, 5, (len(TABLES), size), generator=g)
    values = torch.cat([torch.randint(0, r, (int(n),), generator=g) for (_, r, _), n in zip(TABLES, lengths.sum(1))])
    return KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{n}" for n, _, _ in TABLES], values=values,
                                               lengths=lengths.flatten())


class CpuRowWiseSharder(EmbeddingBagCollectionSharder):
    """TorchRec's EBC sharder offers row_wise on CUDA only; it runs on CPU ranks too, so this one offers it there."""

    def sharding_types(self, compute_device_type):
        return [*super().sharding_types(compute_device_type), "row_wise"]


class ColumnsOnlySharder(EmbeddingBagCollectionSharder):
    """Restricted to column_wise, as TorchRec's tests restrict a sharder to one type."""

    def sharding_types(self, compute_device_type):
        return ["column_wise"]


class RowsOnlySharder(EmbeddingBagCollectionSharder):
    """Restricted to row_wise: every table in TorchRec's row-wise layout."""

    def sharding_types(self, compute_device_type):
        return ["row_wise"]


def run(sharding, rank, half=(), columns_only=False, model=None, rows_only=False, constrained=False):
    """`half`: tables with fp16 weights in the sharded model (the unsharded one holds the same values in fp32);
    `columns_only`: a sharder offering column_wise alone (every table, whole or cut, column-wise); `model`: a
    dreamshard checkpoint, planned with the default learned planner (dreamshard_cut); `constrained`: each table
    held to one sharding type by its constraint, whatever its size, planned by the default planner."""
    sharders = [ColumnsOnlySharder() if columns_only else RowsOnlySharder() if rows_only else CpuRowWiseSharder()]
    topology = Topology(world_size=2, compute_device="cpu", ddr_cap=BUDGET)
    algo = {} if model or constrained else {"algo": "size_lookup_greedy"}
    constraints = {"big": ParameterConstraints(pooling_factors=[2.0])}
    if constrained:
        constraints = {"big": ParameterConstraints(pooling_factors=[2.0], sharding_types=["column_wise"],
                                                   min_partition=8),
                       "mid": ParameterConstraints(sharding_types=["row_wise"]),
                       "small": ParameterConstraints(sharding_types=["data_parallel"])}
    planner = DreamShardPlanner(topology, batch_size=64, sharding=sharding, model=model, **algo,
                                constraints=constraints)
    model = Model(torch.device("meta"), half)
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    apply_optimizer_in_backward(torch.optim.SGD, model.ebc.parameters(), {"lr": 0.1})
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    held = fill_shards(dmp, lambda r0, c0, nr, nc: weight(nr, nc, r0, c0), (".embedding_bags.",))

    reference = Model(torch.device("cpu"))
    with torch.no_grad():
        for (name, rows, dim), bag in zip(TABLES, reference.ebc.embedding_bags.values()):
            w = weight(rows, dim)
            bag.weight.copy_(w.half().float() if name in half else w)
    features = batch(rank)
    pooled, loss = dmp(features)
    want_pooled, want_loss = reference(features)
    loss.backward()  # the fused optimizer steps the embeddings inside backward
    pooled_after, _ = dmp(features)
    return {"rank": rank, "sharding": list(sharding), "half": list(half), "columns_only": columns_only,
            "algo": planner.algo, "rows_only": rows_only, "constrained": constrained,
            "widths": [m.shard_sizes[1] for m in plan.plan["ebc"]["big"].sharding_spec.shards],
            "kinds": {n: p.sharding_type for n, p in plan.plan["ebc"].items()},
            "held": sorted(held), "pooled_diff": float((pooled - want_pooled).abs().max()),
            "loss": float(loss), "want_loss": float(want_loss),
            "changed": float((pooled_after - pooled).abs().max())}


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    reports = [run(("table", "column", "row"), rank), run(("table", "row"), rank),
               run(("table", "column", "row"), rank, half=("big", "mid")),
               run(("table", "column", "row"), rank, columns_only=True),
               run(("table", "column", "row"), rank, model=sys.argv[1]),
               run(("table", "column", "row"), rank, rows_only=True),
               run(("table", "column", "row", "data"), rank),
               run(("table", "column", "row", "data"), rank, constrained=True)]
    print(json.dumps(reports), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def reports_of(stdout: str) -> list[dict]:
    """The ranks' JSON reports: both ranks print to one pipe, so each list is decoded where it starts."""
    decoder = json.JSONDecoder()
    starts = [i for i in range(len(stdout)) if stdout.startswith('[{"rank"', i)]
    return [r for i in starts for r in decoder.raw_decode(stdout, i)[0]]


def untrained_dreamshard_checkpoint(path) -> None:
    """A dreamshard checkpoint of random weights, with a bin estimator for tables without bins (TorchRec's)."""
    from dreamshard.data.bins import META_KEY, BinEstimator
    from dreamshard.learning.cost_model import CostNetConfig
    from dreamshard.learning.features import NUM_FEATURES, FeatureScaler
    from dreamshard.learning.policy import LearnedModel, PolicyNetConfig

    gen = torch.Generator().manual_seed(0)
    scaler = FeatureScaler.fit(np.abs(np.random.default_rng(0).normal(size=(64, NUM_FEATURES))) * 100)
    estimator = BinEstimator(zipf_exponent=0.9, batch_size=64, fitted_on="test", l1_error=0.1)
    LearnedModel(CostNetConfig().build(gen), PolicyNetConfig().build(gen), scaler,
                 {"algorithm": "dreamshard", META_KEY: estimator.to_dict()}).save(path)


@pytest.mark.slow  # 10-30 s on 2 cores: two processes that each import torchrec
def test_distributed_model_parallel_with_dreamshard_planner(tmp_path):
    (tmp_path / "dmp.py").write_text(DMP_SCRIPT)
    untrained_dreamshard_checkpoint(tmp_path / "dreamshard.pt")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "dmp.py", str(tmp_path / "dreamshard.pt")], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    reports = reports_of(res.stdout)
    assert sorted({r["rank"] for r in reports}) == [0, 1] and len(reports) == 16
    for r in reports:
        assert r["pooled_diff"] < 1e-5, r
        assert abs(r["loss"] - r["want_loss"]) <= 1e-5 * max(1.0, abs(r["want_loss"])), r
        assert r["changed"] > 0, r  # the training step moved the embeddings
    # the default learned planner's export (untrained weights: any valid plan) loads and trains in DMP
    assert [r["algo"] for r in reports].count("dreamshard_cut") == 2
    # each table held to one sharding type by its constraint: planned so inside the search, and DMP trains it
    for r in (r for r in reports if r["constrained"]):
        assert r["kinds"] == {"big": "column_wise", "mid": "row_wise", "small": "data_parallel"}, r
        assert min(r["widths"]) >= 8 and sum(r["widths"]) == 32, r
    # a sharder offering row_wise alone: every table row-wise, and DMP trains it
    assert all(set(r["kinds"].values()) == {"row_wise"} for r in reports if r["rows_only"])
    by = {(r["rank"], tuple(r["sharding"])): r for r in reports
          if not r["half"] and not r["columns_only"] and not r["rows_only"] and r["algo"] != "dreamshard_cut"
          and not r["constrained"]}
    assert all(set(r["kinds"].values()) == {"column_wise"} for r in reports if r["columns_only"])
    # fp16 and fp32 tables in one module: planned each at its own bytes (big, 3.7 MB in fp16, now fits a rank)
    mixed = [r for r in reports if r["half"]]
    assert len(mixed) == 2 and all(r["kinds"]["big"] == "table_wise" for r in mixed)
    # the 60k x 32 table (7.3 MB) exceeds a rank's 6 MB: column slices by default, row-wise when rows only
    assert by[(0, ("table", "column", "row"))]["kinds"]["big"] == "column_wise"
    assert by[(0, ("table", "row"))]["kinds"]["big"] == "row_wise"
    for rank in (0, 1):
        held = [h for h in by[(rank, ("table", "row"))]["held"] if h[0] == "big"]
        assert held == [["big", rank * 30_000, (rank + 1) * 30_000, 0, 32]]
        # data-parallel allowed: "small" (100 rows, 128 lookups a step) replicated, the whole of it on each rank
        data = by[(rank, ("table", "column", "row", "data"))]
        assert data["kinds"]["small"] == "data_parallel" and data["kinds"]["big"] != "data_parallel"
        assert ["small", 0, 100, 0, 8] in data["held"]


def test_mixed_precisions_are_planned_each_table_at_its_own_bytes():
    from torchrec.modules.embedding_configs import DataType

    from dreamshard.interop.torchrec import torchrec_perf_estimate

    model = torch.nn.Module()
    model.ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name="low", embedding_dim=64, num_embeddings=50_000, feature_names=["f_low"],
                           data_type=DataType.FP16),
        EmbeddingBagConfig(name="high", embedding_dim=64, num_embeddings=50_000, feature_names=["f_high"]),
    ], device=torch.device("meta"))
    planner = DreamShardPlanner(topology(2, 40.0), batch_size=512, storage_reservation=NO_RESERVATION, debug=False)
    planner.plan(model, [EmbeddingBagCollectionSharder()])
    task, plan = planner.last_task, planner.last_plan
    by_name = {t.name: t for t in task.tables}
    assert task.memory.weights_precision == "fp32" and by_name["low"].precision == "fp16"
    assert task.shard_bytes(by_name["low"]) < task.shard_bytes(by_name["high"])  # 2 bytes a weight, not 4
    assert task.memory.weight_bytes(50_000, 64, "fp16") == 50_000 * 64 * 2
    # TorchRec counts each table at its own data type too, and never more than we do
    theirs = torchrec_perf_estimate(task, plan, 512).rank_hbm_bytes
    assert all(t <= o for t, o in zip(theirs, device_memory_bytes(task, plan)))
    assert sum(theirs) == sum(device_memory_bytes(task, plan))  # the same weights and buffers, no state


def test_mixed_precisions_are_refused_by_the_kernels_backend_not_measured_wrong():
    from dreamshard.data.lookups import GeneratedLookups
    from dreamshard.hardware import make_backend
    from dreamshard.sharders import make_sharder
    from dreamshard.tables import Table
    from dreamshard.tasks import Task

    task = Task.uniform("mixed", [Table("a", 1000, 16, 2.0, precision="fp16"), Table("b", 1000, 16, 2.0)], 1, 1.0)
    backend = make_backend("fbgemm", GeneratedLookups(seed=0), batch_size=16)
    with pytest.raises(DreamShardError, match="mixes fp32 tables with fp16"):
        backend.plan_cost(task, make_sharder("size_greedy").shard(task))


WEIGHTED_FP_SCRIPT = r'''"""Two CPU ranks: a weighted EBC and a feature-processed EBC planned by DreamShardPlanner,
against unsharded copies."""
import json

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from torchrec.distributed.planner import Topology
from torchrec.modules.feature_processor_ import PositionWeightedModuleCollection
from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

from dreamshard.planner import DreamShardPlanner

ROWS, DIM = 40_000, 16  # 2.4 MB a table, a rank holds 3 MB: one table on each


def fill(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embedding_bags" in name:
                r = torch.arange(p.shape[0], dtype=torch.float64)[:, None]
                c = torch.arange(p.shape[1], dtype=torch.float64)[None, :]
                p.copy_((torch.sin(r * 0.37 + c * 1.3) * 0.1).float())


def module(kind, device):
    configs = [EmbeddingBagConfig(name=f"{kind}_{i}", embedding_dim=DIM, num_embeddings=ROWS,
                                  feature_names=[f"{kind}_f{i}"]) for i in range(2)]
    if kind == "weighted":
        return EmbeddingBagCollection(tables=configs, is_weighted=True, device=device)
    ebc = EmbeddingBagCollection(tables=configs, is_weighted=True, device=device)
    fp = PositionWeightedModuleCollection({f"{kind}_f{i}": 5 for i in range(2)}, device=device)
    return FeatureProcessedEmbeddingBagCollection(ebc, fp)


def features(kind, rank, weighted):
    g = torch.Generator().manual_seed(7 + rank)
    lengths = torch.randint(1, 5, (2 * 8,), generator=g)
    values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
    weights = torch.rand(int(lengths.sum()), generator=g) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=[f"{kind}_f{i}" for i in range(2)], values=values,
                                               lengths=lengths, weights=weights)


def run(kind, rank):
    sharders = [EmbeddingBagCollectionSharder(), FeatureProcessedEmbeddingBagCollectionSharder()]
    topology = Topology(world_size=2, compute_device="cpu", ddr_cap=3 * 1024**2)
    planner = DreamShardPlanner(topology, batch_size=8, algo="size_lookup_greedy", debug=False)
    model = torch.nn.Module()
    model.sparse = module(kind, torch.device("meta"))
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    apply_optimizer_in_backward(torch.optim.SGD, model.parameters(), {"lr": 0.1})
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    reference = torch.nn.Module()
    reference.sparse = module(kind, torch.device("cpu"))
    fill(reference)
    with torch.no_grad():  # the same weights in the shards each rank holds
        for name, tensor in dmp.state_dict().items():
            if ".embedding_bags." in name and name.endswith(".weight"):
                for s in tensor.local_shards():
                    (r0, c0), (nr, nc) = s.metadata.shard_offsets, s.metadata.shard_sizes
                    r = torch.arange(r0, r0 + nr, dtype=torch.float64)[:, None]
                    c = torch.arange(c0, c0 + nc, dtype=torch.float64)[None, :]
                    s.tensor.copy_((torch.sin(r * 0.37 + c * 1.3) * 0.1).float())
    kjt = features(kind, rank, weighted=(kind == "weighted"))
    got = dmp.module.sparse(kjt).values()
    want = reference.sparse(kjt).values()
    kinds = {f"{fqn}/{t}": p.sharding_type for fqn, m in plan.plan.items() for t, p in m.items()}
    return {"rank": rank, "kind": kind, "diff": float((got - want).abs().max()), "kinds": kinds,
            "planned": sorted(plan.plan)}


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(json.dumps([run("weighted", rank), run("fp", rank)]), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


@pytest.mark.slow  # two processes that each import torchrec
def test_weighted_and_feature_processed_collections_shard_as_planned(tmp_path):
    """A weighted EBC and a FeatureProcessedEmbeddingBagCollection (planned at its own fqn, with its own sharder),
    on 2 gloo ranks: pooled outputs equal unsharded copies holding the same weights."""
    (tmp_path / "wfp.py").write_text(WEIGHTED_FP_SCRIPT)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "wfp.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    reports = reports_of(res.stdout)
    assert sorted((r["rank"], r["kind"]) for r in reports) == [(0, "fp"), (0, "weighted"), (1, "fp"), (1, "weighted")]
    for r in reports:
        assert r["planned"] == ["sparse"], r  # the feature-processed module's own fqn, not the EBC inside it
        assert r["diff"] < 1e-6, r


SEQUENCE_SCRIPT = FILL_SHARDS + r'''
import json

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig
from torchrec import KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import ParameterConstraints, Topology
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

from dreamshard.planner import DreamShardPlanner

DIM = 16
BAGS = [("pa", 40_000), ("pb", 10_000)]
SEQS = [("sa", 100_000), ("sb", 10_000)]  # sa: 6.4 MB, more than a rank's 5 MB: cut


def value(r0, c0, nr, nc):
    r = torch.arange(r0, r0 + nr, dtype=torch.float64)[:, None]
    c = torch.arange(c0, c0 + nc, dtype=torch.float64)[None, :]
    return (torch.sin(r * 0.37 + c * 1.3) * 0.1).float()


class Model(torch.nn.Module):
    def __init__(self, device):
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name=n, embedding_dim=DIM, num_embeddings=r, feature_names=[f"f_{n}"])
            for n, r in BAGS], device=device)
        self.ec = EmbeddingCollection(tables=[
            EmbeddingConfig(name=n, embedding_dim=DIM, num_embeddings=r, feature_names=[f"f_{n}"])
            for n, r in SEQS], device=device)

    def forward(self, bags, seqs):
        pooled = self.ebc(bags).values()
        jagged = self.ec(seqs)
        sequence = torch.cat([jagged[f"f_{n}"].values() for n, _ in SEQS])
        return pooled, sequence, pooled.pow(2).sum() + sequence.pow(2).sum()


def features(names, rank, seed):
    g = torch.Generator().manual_seed(seed + rank)
    lengths = torch.randint(1, 5, (len(names) * 8,), generator=g)
    values = torch.cat([torch.randint(0, r, (int(n),), generator=g)
                        for (_, r), n in zip(names, lengths.view(len(names), 8).sum(1))])
    return KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{n}" for n, _ in names], values=values, lengths=lengths)


def fused_run(rank):
    """A FusedEmbeddingBagCollection (its optimizer inside), its larger table more than a rank holds."""
    from torchrec.distributed.fused_embeddingbag import FusedEmbeddingBagCollectionSharder
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    def make(device):
        m = torch.nn.Module()
        m.fused = FusedEmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name=n, embedding_dim=DIM, num_embeddings=r, feature_names=[f"f_{n}"])
            for n, r in SEQS], optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.1}, device=device)
        return m

    sharders = [FusedEmbeddingBagCollectionSharder()]
    topology = Topology(world_size=2, compute_device="cpu", ddr_cap=5 * 1024**2)
    planner = DreamShardPlanner(topology, batch_size=8, algo="size_lookup_greedy", debug=False)
    model = make(torch.device("meta"))
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    fill_shards(dmp, value)
    reference = make(torch.device("cpu"))
    with torch.no_grad():
        for name, t in reference.state_dict().items():
            t.copy_(value(0, 0, *t.shape))
    kjt = features(SEQS, rank, 13)
    got = dmp.module.fused(kjt).values()
    want = reference.fused(kjt).values()
    got.pow(2).sum().backward()  # its optimizer steps the embeddings inside backward
    after = dmp.module.fused(kjt).values()
    return {"rank": rank, "fused": True, "kinds": {f"fused/{t}": p.sharding_type for t, p in plan.plan["fused"].items()},
            "pooled_diff": float((got - want).abs().max()), "changed": float((after - got).abs().max())}


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(json.dumps([fused_run(rank)]), flush=True)
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    topology = Topology(world_size=2, compute_device="cpu", ddr_cap=5 * 1024**2)
    planner = DreamShardPlanner(topology, batch_size=8, algo="size_lookup_greedy", debug=False,
                                constraints={"sa": ParameterConstraints(pooling_factors=[2.5])})
    model = Model(torch.device("meta"))
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    apply_optimizer_in_backward(torch.optim.SGD, model.parameters(), {"lr": 0.1})
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    # the same weights in the shards each rank holds as in the unsharded copy
    held = fill_shards(dmp, value, (".embedding_bags.", ".embeddings."))
    reference = Model(torch.device("cpu"))
    with torch.no_grad():
        for name, p in reference.named_parameters():
            p.copy_(value(0, 0, *p.shape))
    bags, seqs = features(BAGS, rank, 7), features(SEQS, rank, 11)
    pooled, sequence, loss = dmp(bags, seqs)
    want_pooled, want_sequence, want_loss = reference(bags, seqs)
    loss.backward()  # the fused optimizer steps the embeddings inside backward
    pooled_after, sequence_after, _ = dmp(bags, seqs)
    kinds = {f"{fqn}/{t}": p.sharding_type for fqn, m in plan.plan.items() for t, p in m.items()}
    print(json.dumps([{"rank": rank, "kinds": kinds, "held": sorted(held),
                       "pooled_diff": float((pooled - want_pooled).abs().max()),
                       "sequence_diff": float((sequence - want_sequence).abs().max()),
                       "loss": float(loss), "want_loss": float(want_loss),
                       "changed": float((sequence_after - sequence).abs().max())}]), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


@pytest.mark.slow  # two processes that each import torchrec
def test_an_embedding_collection_beside_a_bag_collection_and_a_fused_one_train_as_planned(tmp_path):
    """TorchRec's harness pattern on 2 gloo ranks. EBC + EC: DreamShardPlanner plans both collections (the large
    sequence table cut), DistributedModelParallel shards them, and their outputs and loss equal an unsharded copy
    holding the same weights; a training step moves the sequence embeddings. A FusedEmbeddingBagCollection alike."""
    (tmp_path / "seq.py").write_text(SEQUENCE_SCRIPT)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "seq.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    reports = reports_of(res.stdout)
    fused = [r for r in reports if r.get("fused")]
    reports = [r for r in reports if not r.get("fused")]
    assert sorted(r["rank"] for r in reports) == sorted(r["rank"] for r in fused) == [0, 1]
    for r in fused:  # a FusedEmbeddingBagCollection, its larger table cut, trains as its unsharded copy
        assert r["kinds"]["fused/sa"] == "column_wise" and r["pooled_diff"] < 1e-6 and r["changed"] > 0, r
    for r in reports:
        assert set(r["kinds"]) == {"ebc/pa", "ebc/pb", "ec/sa", "ec/sb"}, r
        assert r["kinds"]["ec/sa"] in ("column_wise", "row_wise"), r  # 6.4 MB: more than a rank holds
        assert r["pooled_diff"] < 1e-6 and r["sequence_diff"] < 1e-6, r
        assert abs(r["loss"] - r["want_loss"]) <= 1e-5 * max(1.0, abs(r["want_loss"])), r
        assert r["changed"] > 0, r
    held = {(h[0], *h[1:]) for r in reports for h in r["held"]}
    # every row and column of every table is held by exactly one rank
    for name, rows in (("pa", 40_000), ("pb", 10_000), ("sa", 100_000), ("sb", 10_000)):
        cells = sum((h[2] - h[1]) * (h[4] - h[3]) for h in held if h[0] == name)
        assert cells == rows * 16, (name, sorted(h for h in held if h[0] == name))


def test_the_default_search_rates_plans_on_the_users_topology_not_defaults(monkeypatch):
    """DreamShardPlanner's default (torchrec_model) prices every piece and plan with TorchRec's perf model on the
    Topology the user gave (hosts, bandwidths), and gives our sharders the global batch: TorchRec's per-rank batch
    x ranks, which they hand back to TorchRec per rank."""
    import dreamshard.interop.torchrec as tx

    seen = []
    real = tx.shard_estimates

    def spy(task, slices, batch_size, caches=None, topo=None, calibration=None):
        seen.append((topo, batch_size))
        return real(task, slices, batch_size, caches, topo, calibration)

    monkeypatch.setattr(tx, "shard_estimates", spy)
    for device in ("cuda", "cpu"):  # a CPU job's topology too: ratings stay on TorchRec's CUDA model
        slow = Topology(world_size=2, compute_device=device, local_world_size=1, inter_host_bw=1e6, hbm_mem_bw=5e8,
                        **({"hbm_cap": int(10 * MB)} if device == "cuda" else {"ddr_cap": int(10 * MB)}))
        planner = DreamShardPlanner(slow, batch_size=256, storage_reservation=NO_RESERVATION)
        assert planner.algo == "torchrec_model"
        planner.plan(TwoCollections(), [EmbeddingBagCollectionSharder()])
        got = {(topo.local_world_size, topo.inter_host_bw, topo.hbm_mem_bw, topo.compute_device, batch) for topo, batch in seen}
        assert got == {(1, 1e6, 5e8, "cuda", 256)}, got
        assert seen and all((topo.local_world_size, topo.inter_host_bw, topo.hbm_mem_bw, topo.compute_device, batch)
                            == (1, 1e6, 5e8, "cuda", 256) for topo, batch in seen)
        seen.clear()
