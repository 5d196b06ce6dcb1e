"""The analytic backend (dreamshard.hardware.analytic): a deterministic model of the fused operator, never a measurement."""
from __future__ import annotations

import pytest

from dreamshard.data.lookups import (
    GeneratedLookups,
)
from dreamshard.evaluation.bounds import (
    additivity_ratio,
    whole_shards,
)
from dreamshard.hardware import make_backend
from dreamshard.hardware.analytic import AnalyticBackend, AnalyticConfig, cold_fraction
from dreamshard.hardware.base import ComputeCost
from dreamshard.hardware.comm import (
    Topology,
)
from dreamshard.plan import Plan
from dreamshard.sharders import make_sharder
from dreamshard.tables import Table
from dreamshard.tasks import Task
from helpers import BIG, SMALL
from helpers import analytic as backend

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


def test_analytic_plan_cost_is_compute_plus_modelled_comm(big_task):
    topo = Topology(devices_per_host=1)
    b = backend("super_additive", 1024, topo)
    plan = Plan.from_assignment(big_task, [0, 1, 1, 0])
    cost = b.plan_cost(big_task, plan)
    compute = [b.compute_cost(big_task, plan.device_shards(d)) for d in range(2)]
    # dims 64 + 64 and 128 + 32; the ids (8 B each) and a length (4 B) per sample of each table
    ids = [sum(t.pooling_factor * 8 + 4 for t in big_task.tables if t.name in {s.table for s in plan.device_shards(d)})
           for d in range(2)]
    fwd_comm, bwd_comm = b.communication_cost([c.fwd_ms for c in compute], [[64 + 64, ids[0]], [128 + 32, ids[1]]])
    # whole tables: one lookup group, whose input dist is 3 collectives where the exchange charged one
    extra = 2 * topo.latency_us * 1e-3
    for d in range(2):
        assert cost.devices[d].fwd_ms == compute[d].fwd_ms and cost.devices[d].bwd_ms == compute[d].bwd_ms
        assert cost.devices[d].fwd_comm_ms == pytest.approx(fwd_comm[d] + extra)
        assert cost.devices[d].bwd_comm_ms == pytest.approx(bwd_comm[d])



def test_row_shards_share_their_tables_work_by_rows():
    from dreamshard.plan import Shard

    t = Table("t", 100_000, 64, 20.0)
    task = Task.uniform("rows", [t], 2, 1.0)
    b = backend("sub_additive", batch_size=1024)
    whole = b.compute_cost(task, [Shard("t", 0, 0, 64)])
    first = b.compute_cost(task, [Shard("t", 0, 0, 64, 0, 25_000)])
    rest = b.compute_cost(task, [Shard("t", 0, 0, 64, 25_000, 100_000)])
    # lookups and touched rows by the rows' share (1/4, 3/4); each piece writes partial sums for the whole batch
    assert first.total_ms < rest.total_ms < whole.total_ms
    output_ms = 1024 * 64 * 0.5 / 1e6  # B x width x output_ns, per piece
    assert first.fwd_ms > 50 / 1000 + output_ms
