"""What README's headline columns come from (dreamshard.evaluation.summary): per-family summaries,
generalisation labels, the exhaustive check, and which training tasks are evaluated."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pytest

from dreamshard.evaluation.bounds import SUPER_ADDITIVE, additivity_ratio, regime_of
from dreamshard.evaluation.summary import exhaustive_check, family_summary, first_per_family, generalisation
from dreamshard.hardware.analytic import AnalyticBackend, AnalyticConfig
from dreamshard.hardware.comm import Topology
from dreamshard.sharders import make_sharder
from dreamshard.tables import Table
from dreamshard.tasks import Task


def rows(family: str, algorithm: str, costs: list[float], lb: float = 1.0, planning: float = 1.0) -> list[dict]:
    return [{"family": family, "algorithm": algorithm, "cost_ms": c, "cost_over_lb": c / lb, "planning_ms": planning}
            for c in costs]


def test_family_summary_means_and_the_best_heuristic():
    results = pd.DataFrame(
        rows("f", "random", [20.0, 20.0]) + rows("f", "size_greedy", [12.0, 14.0]) +
        rows("f", "lookup_greedy", [10.0, 12.0], planning=3.0) + rows("f", "dreamshard", [9.0, 9.0], lb=3.0) +
        rows("g", "random", [5.0]) + rows("g", "dim_greedy", [4.0]))
    out = family_summary(results)
    f = out["f"]
    assert f["best_heuristic"] == "lookup_greedy"  # mean 11 < 13; random never counts as the best heuristic
    assert f["lookup_greedy"]["mean_cost_ms"] == 11.0 and f["lookup_greedy"]["planning_ms_p50"] == 3.0
    assert f["dreamshard"]["mean_cost_over_lb"] == pytest.approx(3.0) and f["dreamshard"]["num_tasks"] == 2
    assert f["dreamshard"]["improvement_over_best_heuristic"] == pytest.approx(1 - 9 / 11)
    assert f["dreamshard"]["improvement_over_random"] == pytest.approx(1 - 9 / 20)
    assert f["lookup_greedy"]["improvement_over_best_heuristic"] == 0.0
    assert out["g"]["best_heuristic"] == "dim_greedy"
    # only random: no best heuristic, no improvement over it
    only_random = family_summary(pd.DataFrame(rows("h", "random", [1.0])))["h"]
    assert "best_heuristic" not in only_random and "improvement_over_best_heuristic" not in only_random["random"]


@dataclass
class FakeModel:  # what generalisation reads of a LearnedModel: its meta
    meta: dict


@dataclass
class PolicyLike:
    name: str
    model: FakeModel


def test_generalisation_labels_unseen_counts_for_policies_only():
    tables = [Table(f"t{i}", 100, 4, 1.0) for i in range(8)]
    tasks = [Task.uniform("a-4-2/0", tables[:4], 2, 1.0, family="a-4-2"),
             Task.uniform("b-8-2/0", tables, 2, 1.0, family="b-8-2"),
             Task.uniform("c-4-4/0", tables[:4], 4, 1.0, family="c-4-4")]
    meta = {"families": ["a-4-2"], "table_counts": [4], "device_counts": [2]}
    out = generalisation([PolicyLike("dreamshard", FakeModel(meta)), make_sharder("size_greedy")], tasks)
    assert set(out) == {"dreamshard"}  # a heuristic is trained on nothing
    fams = out["dreamshard"]["test_families"]
    assert out["dreamshard"]["trained_on"] == ["a-4-2"]
    assert fams["a-4-2"] == {"unseen_tables": True, "unseen_table_count": False, "unseen_device_count": False}
    assert fams["b-8-2"]["unseen_table_count"] and not fams["b-8-2"]["unseen_device_count"]
    assert fams["c-4-4"]["unseen_device_count"] and not fams["c-4-4"]["unseen_table_count"]


def test_exhaustive_check_reports_the_optimum_the_bound_and_the_best_sharder():
    tables = [Table(f"e{i}", 20_000 * (i + 1), 16 * (1 + i % 2), 2.0 + i) for i in range(6)]
    task = Task.uniform("big/0", tables, 4, 1.0)
    backend = AnalyticBackend(AnalyticConfig(regime="super_additive", batch_size=1024))
    regime = regime_of([additivity_ratio(backend, task)])
    sharders = [make_sharder("size_greedy"), make_sharder("lookup_greedy")]
    out = exhaustive_check(backend, [task], sharders, 1, 5, 2, 1024, Topology(), regime)
    assert out["num_tables"] == 5 and out["num_devices"] == 2 and len(out["tasks"]) == 1
    t = out["tasks"][0]
    assert t["plans"] == 2 ** 5 // 2  # identical devices: each split once
    assert t["lower_bound_ms"] <= t["optimum_ms"] <= t["best_sharder_ms"]
    assert out["bound_holds"] is True
    assert out["mean_best_sharder_over_optimum"] == pytest.approx(t["best_sharder_ms"] / t["optimum_ms"])
    assert regime in (SUPER_ADDITIVE, "mixed", "sub_additive")
    assert exhaustive_check(backend, [task], sharders, 0, 5, 2, 1024, Topology(), regime) == {}


def test_first_per_family_keeps_file_order_without_parsing_names():
    tables = [Table("x", 100, 4, 1.0)]
    tasks = [Task.uniform(name, tables, 1, 1.0, family=fam) for name, fam in
             [("odd name", "a"), ("b/7", "b"), ("a/0", "a"), ("a/1", "a"), ("b/0", "b")]]
    assert [t.name for t in first_per_family(tasks, 2)] == ["odd name", "b/7", "a/0", "b/0"]
    assert first_per_family(tasks, 0) == []


def test_estimated_bins_check_plans_twice_and_measures_both_plans():
    import numpy as np
    import torch

    from dreamshard.data.bins import BinEstimator
    from dreamshard.evaluation.evaluate import estimated_bins_check
    from dreamshard.evaluation.summary import estimated_bins_summary
    from dreamshard.learning.cost_model import CostNetConfig
    from dreamshard.learning.features import NUM_FEATURES, FeatureScaler
    from dreamshard.learning.policy import LearnedModel, PolicyNetConfig
    from dreamshard.sharders.learned import PolicySharder

    gen = torch.Generator().manual_seed(0)
    scaler = FeatureScaler.fit(np.abs(np.random.default_rng(0).normal(size=(64, NUM_FEATURES))) * 100)
    model = LearnedModel(CostNetConfig().build(gen), PolicyNetConfig().build(gen), scaler, {})
    hot = tuple(float(k == 0) for k in range(17))
    tasks = [Task.uniform(f"t{i}", [Table(f"a{j}", 1000 * (j + 1), 8 * (j % 3 + 1), 2.0 + j, hot) for j in range(6)],
                          2, 1.0, family=f"f{i}") for i in range(2)]
    sharder = PolicySharder("dreamshard", model, bins=BinEstimator(0.8, 4096, "test", 0.3))
    backend = AnalyticBackend(AnalyticConfig(regime=SUPER_ADDITIVE, batch_size=1024))
    comparisons = estimated_bins_check(backend, tasks, [sharder], rounds=1)
    assert [(c.task.name, c.algorithm) for c in comparisons] == [("t0", "dreamshard"), ("t1", "dreamshard")]
    for c in comparisons:
        assert c.measured_bins.cost_ms > 0 and c.estimated_bins.cost_ms > 0
        if c.same_plan:  # one plan, one measurement
            assert c.measured_bins.cost_ms == c.estimated_bins.cost_ms
    summary = estimated_bins_summary(comparisons)["dreamshard"]
    assert summary["tasks"] == 2 and set(summary["per_family"]) == {"f0", "f1"}
    ratios = [c.estimated_bins.cost_ms / c.measured_bins.cost_ms for c in comparisons]
    assert summary["estimated_over_measured_mean"] == pytest.approx(sum(ratios) / 2)
    # without an estimator the bin-less copy is refused, naming a table
    with pytest.raises(Exception, match=r"table 'a0'.*bin_0\.\.bin_16"):
        estimated_bins_check(backend, tasks, [PolicySharder("dreamshard", model)], rounds=1)
