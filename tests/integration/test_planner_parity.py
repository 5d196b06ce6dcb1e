"""DreamShardPlanner behaves as TorchRec's planner where a training script can tell: one test for each behaviour of
TorchRec's own planner tests (written here, not copied), each run against both planners and expecting the same
outcome, and per-table constraints honoured in the search.

Needs torchrec (docs/torchrec.md); skipped without it.
"""
from __future__ import annotations

import pytest

torchrec = pytest.importorskip("torchrec", reason="torchrec is not installed (see docs/torchrec.md)")

import torch  # noqa: E402
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology  # noqa: E402
from torchrec.distributed.planner.types import PlannerError, PlannerErrorType  # noqa: E402
from torchrec.distributed.sharding_plan import get_default_sharders  # noqa: E402
from torchrec.distributed.types import CacheAlgorithm, CacheParams, ShardingPlan  # noqa: E402

from dreamshard.planner import DreamShardPlanner  # noqa: E402

PLANNERS = {"torchrec": EmbeddingShardingPlanner, "dreamshard": DreamShardPlanner}


class Restricted(EmbeddingBagCollectionSharder):
    def __init__(self, types) -> None:
        super().__init__()
        self._types = list(types)

    def sharding_types(self, compute_device_type):
        return self._types

    def compute_kernels(self, sharding_type, compute_device_type):
        return ["fused"]


def model(rows: int, dim: int, count: int) -> torch.nn.Module:
    m = torch.nn.Module()
    m.ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"table_{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f_{i}"])
        for i in range(count)], device=torch.device("meta"))
    return m


def planner(kind: str, constraints=None, world: int = 2, hbm: int = 2 * 1024**2):
    topo = Topology(world_size=world, hbm_cap=hbm, compute_device="cuda")
    kwargs = {} if kind == "torchrec" else {"debug": False}
    return PLANNERS[kind](topology=topo, constraints=constraints, **kwargs)


def ranks(plan: ShardingPlan) -> list[list[int]]:
    return sorted(list(ps.ranks) for ps in plan.plan["ebc"].values())


@pytest.mark.parametrize("kind", PLANNERS)
def test_four_small_tables_go_two_a_rank(kind):
    plan = planner(kind).plan(model(100, 64, 4), [Restricted(["table_wise", "row_wise"])])
    assert ranks(plan) == [[0], [0], [1], [1]]


@pytest.mark.parametrize("kind", PLANNERS)
def test_three_tables_balance_with_one_row_wise(kind):
    plan = planner(kind).plan(model(100, 64, 3), [Restricted(["table_wise", "row_wise"])])
    assert ranks(plan) == [[0], [0, 1], [1]]


@pytest.mark.parametrize("kind", PLANNERS)
def test_a_model_that_never_fits_is_insufficient_storage(kind):
    p = planner(kind)
    with pytest.raises(PlannerError) as caught:
        p.plan(model(10_000_000, 10_000_000, 2), [Restricted(["table_wise", "row_wise"])])
    assert caught.value.error_type == PlannerErrorType.INSUFFICIENT_STORAGE


@pytest.mark.parametrize("kind", PLANNERS)
def test_fail_then_plan_again_with_a_sharder_that_cuts(kind):
    p = planner(kind)
    with pytest.raises(PlannerError) as caught:  # 2 MB a rank less the reservation: whole, it fits neither
        p.plan(model(4096, 128, 1), [Restricted(["table_wise"])])
    assert caught.value.error_type == PlannerErrorType.STRICT_CONSTRAINTS
    assert ranks(p.plan(model(4096, 128, 1), [Restricted(["table_wise", "row_wise"])])) == [[0, 1]]


@pytest.mark.parametrize("kind", PLANNERS)
def test_no_sharders_plan_nothing(kind):
    assert planner(kind).plan(model(100, 64, 4), []) == ShardingPlan({})


@pytest.mark.parametrize("kind", PLANNERS)
def test_constraint_fields_and_cache_params_reach_the_plan(kind):
    constraints = {
        "table_0": ParameterConstraints(enforce_hbm=True, cache_params=CacheParams(algorithm=CacheAlgorithm.LFU)),
        "table_1": ParameterConstraints(stochastic_rounding=True),
        "table_2": ParameterConstraints(cache_params=CacheParams(algorithm=CacheAlgorithm.LRU, load_factor=0.1)),
    }
    plan = planner(kind, constraints).plan(model(100, 64, 4), get_default_sharders())
    got = {name: (ps.cache_params, ps.enforce_hbm, ps.stochastic_rounding) for name, ps in plan.plan["ebc"].items()}
    assert got["table_0"] == (CacheParams(algorithm=CacheAlgorithm.LFU), True, None)
    assert got["table_1"] == (None, None, True)
    assert got["table_2"] == (CacheParams(algorithm=CacheAlgorithm.LRU, load_factor=0.1), None, None)


@pytest.mark.parametrize("types", [["row_wise"], ["column_wise"], ["table_row_wise"], ["data_parallel"]])
@pytest.mark.parametrize("kind", PLANNERS)
def test_a_tables_sharding_types_are_honoured_whatever_its_size(kind, types):
    """A table of 60k rows that fits one rank whole, constrained to one sharding type: planned that way."""
    constraints = {"table_0": ParameterConstraints(sharding_types=types)}
    p = planner(kind, constraints, world=4, hbm=1024**3)
    plan = p.plan(model(60_000, 64, 3), get_default_sharders())
    assert plan.plan["ebc"]["table_0"].sharding_type == types[0]


@pytest.mark.parametrize("kind", PLANNERS)
def test_a_table_allowed_uvm_caching_alone_is_cached_at_its_load_factor(kind):
    constraints = {"table_0": ParameterConstraints(compute_kernels=["fused_uvm_caching"],
                                                   cache_params=CacheParams(load_factor=0.3))}
    plan = planner(kind, constraints, world=2, hbm=1024**3).plan(model(60_000, 64, 2), get_default_sharders())
    ps = plan.plan["ebc"]["table_0"]
    assert ps.compute_kernel == "fused_uvm_caching" and ps.cache_params.load_factor == 0.3
    assert plan.plan["ebc"]["table_1"].compute_kernel == "fused"


def test_min_partition_is_the_narrowest_column_slice():
    constraints = {"table_0": ParameterConstraints(sharding_types=["column_wise"], min_partition=32)}
    p = planner("dreamshard", constraints, world=4, hbm=1024**3)
    plan = p.plan(model(200_000, 128, 1), [Restricted(["column_wise"])])
    widths = [m.shard_sizes[1] for m in plan.plan["ebc"]["table_0"].sharding_spec.shards]
    assert sum(widths) == 128 and min(widths) >= 32
    # narrower than TorchRec's slices could be without it: 32 columns is what its search may use
    assert max(widths) <= 128


def test_failures_are_planner_errors_a_script_can_catch():
    p = planner("dreamshard", {"table_0": ParameterConstraints(feature_names=["nope"])})
    with pytest.raises(PlannerError) as caught:
        p.plan(model(100, 64, 2), get_default_sharders())
    assert caught.value.error_type == PlannerErrorType.INPUT_VALIDATION
    assert "feature_names" in str(caught.value)


def test_a_checkpoint_of_other_hardware_is_refused_unless_allowed(tmp_path):
    import numpy as np

    from dreamshard.data.bins import META_KEY, BinEstimator
    from dreamshard.learning.cost_model import CostNetConfig
    from dreamshard.learning.features import NUM_FEATURES, FeatureScaler
    from dreamshard.learning.policy import LearnedModel, PolicyNetConfig

    gen = torch.Generator().manual_seed(0)
    scaler = FeatureScaler.fit(np.abs(np.random.default_rng(0).normal(size=(64, NUM_FEATURES))) * 100)
    estimator = BinEstimator(zipf_exponent=0.9, batch_size=64, fitted_on="test", l1_error=0.1)
    path = tmp_path / "cpu.pt"
    LearnedModel(CostNetConfig().build(gen), PolicyNetConfig().build(gen), scaler,
                 {"algorithm": "dreamshard", "backend": "fbgemm", "device": "cpu: AMD EPYC (1 thread)",
                  META_KEY: estimator.to_dict()}).save(path)
    cuda = Topology(world_size=2, hbm_cap=1024**3, compute_device="cuda")
    with pytest.raises(PlannerError, match="trained on cpu kernel timings, but the topology's compute device is cuda"):
        DreamShardPlanner(cuda, model=path)
    plan = DreamShardPlanner(cuda, model=path, allow_other_hardware=True, debug=False).plan(
        model(100, 64, 4), get_default_sharders())
    assert len(plan.plan["ebc"]) == 4
    cpu = Topology(world_size=2, ddr_cap=1024**3, compute_device="cpu")
    DreamShardPlanner(cpu, model=path)  # the hardware it was trained on


SMALL = [(100, 16), (1_000, 32), (5_000, 64), (20_000, 128), (50_000, 16), (100_000, 64), (200_000, 32),
         (400_000, 128), (800_000, 16), (1_000_000, 64), (1_500_000, 32), (2_000_000, 128)]


@pytest.mark.parametrize("kind", PLANNERS)
def test_tables_beyond_hbm_go_to_host_memory_where_torchrec_puts_them(kind):
    """16 ranks of 0.05 GiB hold less than the 12 tables: both planners keep some wholly in host memory
    (fused_uvm) or cached, and the plan fits TorchRec's count (benchmarks/planner_coverage.py: this case)."""
    m = torch.nn.Module()
    m.ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=d, num_embeddings=r, feature_names=[f"f{i}"])
        for i, (r, d) in enumerate(SMALL)], device=torch.device("meta"))
    p = planner(kind, world=16, hbm=int(0.05 * 1024**3))
    plan = p.plan(m, get_default_sharders())
    kernels = {ps.compute_kernel for ps in plan.plan["ebc"].values()}
    assert kernels & {"fused_uvm", "fused_uvm_caching"}, kernels
