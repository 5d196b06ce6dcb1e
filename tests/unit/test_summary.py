"""What README's headline columns come from (dreamshard.evaluation.summary): per-family summaries,
generalisation labels, the exhaustive check, and which training tasks are evaluated."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from dreamshard.evaluation.bounds import SUPER_ADDITIVE, additivity_ratio, regime_of
from dreamshard.evaluation.summary import (
    bootstrap_ci,
    compare,
    exhaustive_check,
    family_summary,
    first_per_family,
    generalisation,
    interleave_families,
    paired_ratios,
    table_groups,
    win_rate,
)
from dreamshard.hardware.analytic import AnalyticBackend, AnalyticConfig
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


def task_rows(family: str, algorithm: str, costs: dict[str, float]) -> list[dict]:
    """Rows of `algorithm` on the named tasks of `family`, one per task."""
    return [{"task": t, "family": family, "algorithm": algorithm, "cost_ms": c, "cost_over_lb": c / 2.0,
             "planning_ms": 1.0} for t, c in costs.items()]


def test_bootstrap_of_constant_values_is_the_value_and_of_one_value_is_that_value():
    assert bootstrap_ci([3.5] * 7, seed=0) == (3.5, 3.5)
    assert bootstrap_ci([2.25], seed=4) == (2.25, 2.25)
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_ci([], seed=0)


def test_bootstrap_of_normal_draws_has_the_textbook_width_and_is_seeded():
    sigma, n = 2.0, 1000
    values = np.random.default_rng(123).normal(5.0, sigma, n)
    low, high = bootstrap_ci(values, seed=0)
    assert low < values.mean() < high
    # the mean's 95% interval: 2 x 1.96 x sigma / sqrt(n)
    assert high - low == pytest.approx(2 * 1.96 * sigma / np.sqrt(n), rel=0.10)
    assert bootstrap_ci(values, seed=0) == (low, high)  # same seed, same interval
    other = bootstrap_ci(values, seed=1)
    assert other != (low, high)  # another seed: another draw ...
    assert other == pytest.approx((low, high), abs=0.02 * (high - low) + 0.01)  # ... but close


def test_bootstrap_takes_other_statistics_and_levels():
    values = np.arange(1.0, 102.0)
    low50, high50 = bootstrap_ci(values, seed=0, level=0.5, statistic=np.median)
    low95, high95 = bootstrap_ci(values, seed=0, statistic=np.median)
    assert low95 <= low50 <= 51.0 <= high50 <= high95 and high50 - low50 < high95 - low95
    # a statistic without `axis` is applied per resample
    low, high = bootstrap_ci(values, seed=0, resamples=500, statistic=lambda v: float(max(v)))
    assert 95.0 <= low <= high == 101.0


def mixed_results() -> pd.DataFrame:
    return pd.DataFrame(
        task_rows("f", "size_greedy", {"a": 10.0, "b": 10.0, "c": 10.0, "d": 10.0}) +
        task_rows("f", "lookup_greedy", {"a": 12.0, "b": 12.0, "c": 12.0, "d": 12.0}) +
        # dreamshard: cheaper on a and b, a tie on c, dearer on d, not run on e
        task_rows("f", "dreamshard", {"a": 8.0, "b": 9.0, "c": 10.0, "d": 11.0, "e": 1.0}) +
        task_rows("f", "random", {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}) +  # never a best heuristic
        task_rows("g", "size_greedy", {"x": 10.0, "y": 10.0}) +
        task_rows("g", "lookup_greedy", {"x": 5.0, "y": 5.0}) +
        task_rows("g", "dreamshard", {"x": 4.0, "y": 6.0}))


def test_grouped_bootstrap_resamples_whole_groups():
    """Oracle: groups of equal size holding one value each resample exactly as the task bootstrap of one value a
    group; tasks that are copies of one another widen the interval back to what their groups justify."""
    values = np.random.default_rng(4).normal(1.0, 0.1, 6)
    copies = np.repeat(values, 3)
    labels = np.repeat(list("abcdef"), 3)
    assert bootstrap_ci(copies, 7, groups=labels) == pytest.approx(bootstrap_ci(values, 7), rel=1e-12)
    low, high = bootstrap_ci(copies, 7)  # as if the 18 tasks were independent: too narrow
    g_low, g_high = bootstrap_ci(copies, 7, groups=labels)
    assert g_high - g_low > 1.5 * (high - low)
    # distinct labels: the task bootstrap itself; one group: nothing to resample
    assert bootstrap_ci(values, 3, groups=range(6)) == bootstrap_ci(values, 3)
    assert all(np.isnan(bootstrap_ci(values, 3, groups=["x"] * 6)))
    with pytest.raises(ValueError, match="mean only"):
        bootstrap_ci(copies, 7, groups=labels, statistic=np.median)
    with pytest.raises(ValueError, match="5 group labels for 6 values"):
        bootstrap_ci(values, 7, groups=range(5))


def test_table_groups_join_tasks_that_share_tables_within_a_family():
    def task(name: str, family: str, tables: str) -> Task:
        return Task.uniform(name, [Table(n, 100, 4, 1.0) for n in tables], 2, 1.0, family=family)

    tasks = [task("a0", "a", "pq"), task("a1", "a", "rs"), task("a2", "a", "qr"), task("a3", "a", "xy"),
             task("b0", "b", "pq"), task("b1", "b", "tu")]
    groups = table_groups(tasks)
    assert groups["a0"] == groups["a1"] == groups["a2"]  # a0-a2 share q, a2-a1 share r: one group
    assert len({groups["a0"], groups["a3"], groups["b0"], groups["b1"]}) == 4  # families apart, disjoint apart
    frame = pd.DataFrame([{"family": "a", "task": n, "algorithm": algo, "cost_ms": c, "table_group": groups[n]}
                          for n, (x, y) in zip(["a0", "a1", "a2", "a3"], [(1, 2), (1, 2), (1, 2), (3, 4)])
                          for algo, c in (("x", x), ("y", y))])
    out = compare(frame, "x", "y", seed=0)
    assert (out["tasks"], out["groups"]) == (4, 2)


def test_win_rate_counts_a_tie_as_one_half():
    results = mixed_results()
    f = results[results["family"] == "f"]
    assert win_rate(f, "dreamshard", "size_greedy") == pytest.approx((1 + 1 + 0.5 + 0) / 4)
    assert win_rate(f, "size_greedy", "dreamshard") == pytest.approx((0 + 0 + 0.5 + 1) / 4)
    assert win_rate(f, "size_greedy", "size_greedy") == 0.5
    assert np.isnan(win_rate(f, "dreamshard", "torchrec"))  # nothing to pair with


def test_paired_ratios_use_only_tasks_both_have_and_best_heuristic_per_family():
    results = mixed_results()
    f = results[results["family"] == "f"]
    r = paired_ratios(f, "dreamshard", "size_greedy")
    assert list(r.index) == ["a", "b", "c", "d"]  # task e has no size_greedy run
    assert list(r) == pytest.approx([0.8, 0.9, 1.0, 1.1])
    # best heuristic: size_greedy in f (mean 10 < 12), lookup_greedy in g (5 < 10); random never counts
    best = paired_ratios(results, "dreamshard", "best_heuristic")
    assert best.to_dict() == pytest.approx({"a": 0.8, "b": 0.9, "c": 1.0, "d": 1.1, "x": 0.8, "y": 1.2})
    assert win_rate(results, "dreamshard", "best_heuristic") == pytest.approx((1 + 1 + 0.5 + 0 + 1 + 0) / 6)
    # the mean ratio is the mean of per-task ratios, not a ratio of means
    skewed = pd.DataFrame(task_rows("h", "size_greedy", {"p": 1.0, "q": 100.0}) +
                          task_rows("h", "dreamshard", {"p": 2.0, "q": 50.0}))
    c = compare(skewed, "dreamshard", "best_heuristic", seed=0)
    assert c["mean_ratio"] == pytest.approx((2.0 + 0.5) / 2) and c["tasks"] == 2
    with pytest.raises(ValueError, match="no task"):
        compare(skewed, "dreamshard", "torchrec", seed=0)


def test_compare_is_better_only_when_the_whole_interval_is_below_one():
    def one(ratios: list[float]) -> dict:
        tasks = {f"t{i}": 10.0 for i in range(len(ratios))}
        return compare(pd.DataFrame(task_rows("f", "size_greedy", tasks) + task_rows(
            "f", "x", {t: 10.0 * r for t, r in zip(tasks, ratios)})), "x", "size_greedy", seed=0)

    clearly = one([0.80, 0.85, 0.82, 0.88, 0.84, 0.81])
    assert clearly["better"] and not clearly["worse"] and clearly["ci_high"] < 1 and clearly["win_rate"] == 1.0
    noisy = one([0.6, 1.3, 0.7, 1.2, 0.9, 0.95])  # mean below 1, interval across 1
    assert noisy["mean_ratio"] < 1 and noisy["ci_low"] < 1 < noisy["ci_high"]
    assert not noisy["better"] and not noisy["worse"]
    dearer = one([1.2, 1.3, 1.25, 1.22])
    assert dearer["worse"] and not dearer["better"] and dearer["ci_low"] > 1
    assert set(clearly) == {"mean_ratio", "ci_low", "ci_high", "win_rate", "tasks", "groups", "better", "worse"}


def test_family_summary_keeps_its_keys_and_adds_paired_comparisons():
    results = pd.concat([mixed_results(), pd.DataFrame(
        task_rows("f", "torchrec", {"a": 10.0, "b": 10.0, "c": 10.0}) +
        task_rows("f", "torchrec_full", {"a": 16.0, "b": 16.0, "c": 16.0, "d": 16.0}))])
    out = family_summary(results, seed=3)
    f, g = out["f"], out["g"]
    assert f["best_heuristic"] == "size_greedy" and g["best_heuristic"] == "lookup_greedy"
    old = {"mean_cost_ms", "mean_cost_over_lb", "planning_ms_p50", "num_tasks", "improvement_over_best_heuristic"}
    assert old | {"improvement_over_random", "vs_best_heuristic", "vs_torchrec", "vs_torchrec_full",
                  "vs_torchrec_peer"} == set(f["dreamshard"])
    # the peer: the TorchRec planner of lowest family mean (torchrec, 10 < 16), compared on its tasks
    assert f["torchrec_peer"] == "torchrec" and "torchrec_peer" not in g
    assert f["dreamshard"]["vs_torchrec_peer"] == compare(results[results["family"] == "f"], "dreamshard", "torchrec",
                                                          seed=3)
    assert f["dreamshard"]["mean_cost_ms"] == pytest.approx(39 / 5) and f["dreamshard"]["num_tasks"] == 5
    vs = f["dreamshard"]["vs_best_heuristic"]
    assert vs == compare(results[results["family"] == "f"], "dreamshard", "best_heuristic", seed=3)
    assert vs["tasks"] == 4 and vs["mean_ratio"] == pytest.approx(0.95) and vs["win_rate"] == pytest.approx(0.625)
    assert f["dreamshard"]["vs_torchrec"]["tasks"] == 3 and f["dreamshard"]["vs_torchrec_full"]["better"]
    assert f["size_greedy"]["vs_best_heuristic"]["mean_ratio"] == 1.0
    assert not f["size_greedy"]["vs_best_heuristic"]["better"] and not f["size_greedy"]["vs_best_heuristic"]["worse"]
    assert f["lookup_greedy"]["vs_best_heuristic"]["worse"]  # 1.2 on every task
    # no torchrec in family g: no comparison with it there
    assert old | {"vs_best_heuristic"} == set(g["dreamshard"])
    assert g["dreamshard"]["vs_best_heuristic"]["mean_ratio"] == pytest.approx(1.0)
    # the same seed, the same summary; json-ready (plain floats, ints and bools)
    assert family_summary(results, seed=3) == out
    assert type(vs["better"]) is bool and type(vs["tasks"]) is int and type(vs["ci_low"]) is float


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
    sharders = [PolicyLike("dreamshard", FakeModel(meta)), make_sharder("size_greedy")]
    out = generalisation(sharders, tasks)  # type: ignore[arg-type]  # a stand-in with only name and model
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
    out = exhaustive_check(backend, [task], sharders, 1, 5, 2, regime)
    assert out["num_tables"] == 5 and out["num_devices"] == 2 and len(out["tasks"]) == 1
    t = out["tasks"][0]
    assert t["plans"] == 2 ** 5 // 2  # identical devices: each split once
    assert t["lower_bound_ms"] <= t["optimum_ms"] <= t["best_sharder_ms"]
    assert out["bound_holds"] is True
    assert out["mean_best_sharder_over_optimum"] == pytest.approx(t["best_sharder_ms"] / t["optimum_ms"])
    assert regime in (SUPER_ADDITIVE, "mixed", "sub_additive")
    assert exhaustive_check(backend, [task], sharders, 0, 5, 2, regime) == {}


def test_first_per_family_keeps_file_order_without_parsing_names():
    tables = [Table("x", 100, 4, 1.0)]
    tasks = [Task.uniform(name, tables, 1, 1.0, family=fam) for name, fam in
             [("odd name", "a"), ("b/7", "b"), ("a/0", "a"), ("a/1", "a"), ("b/0", "b")]]
    assert [t.name for t in first_per_family(tasks, 2)] == ["odd name", "b/7", "a/0", "b/0"]
    assert first_per_family(tasks, 0) == []


def test_interleave_families_takes_families_in_turns_and_keeps_every_task_once():
    tables = [Table("x", 100, 4, 1.0)]
    tasks = [Task.uniform(name, tables, 1, 1.0, family=fam) for name, fam in
             [("a0", "a"), ("a1", "a"), ("a2", "a"), ("b0", "b"), ("c0", "c"), ("c1", "c")]]
    assert [t.name for t in interleave_families(tasks)] == ["a0", "b0", "c0", "a1", "c1", "a2"]
    assert interleave_families([]) == []


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
    # several sharders: a task's plans are measured together, a plan two sharders made once (a round's operators)
    class Counting(AnalyticBackend):
        operators = 0

        def compute_cost(self, task, shards):
            Counting.operators += 1
            return super().compute_cost(task, shards)

    counting = Counting(AnalyticConfig(regime=SUPER_ADDITIVE, batch_size=1024))
    twins = estimated_bins_check(counting, tasks[:1], [sharder, PolicySharder("dreamshard_twin", model,
                                                                              bins=sharder.bins)], rounds=2)
    assert [c.algorithm for c in twins] == ["dreamshard", "dreamshard_twin"]
    assert twins[0].measured_bins == twins[1].measured_bins and twins[0].estimated_bins == twins[1].estimated_bins
    plans = 1 if comparisons[0].same_plan else 2
    assert Counting.operators <= 2 * plans * tasks[0].num_devices  # 2 rounds, each distinct plan's devices once
    # without an estimator the bin-less copy is refused, naming a table
    with pytest.raises(Exception, match=r"table 'a0'.*bin_0\.\.bin_16"):
        estimated_bins_check(backend, tasks, [PolicySharder("dreamshard", model)], rounds=1)


class Disturbed:
    """Another backend's readings, each device operator's scaled by `factor` (noise or drift of a machine)."""

    def __init__(self, inner):
        self.inner, self.name, self.measured = inner, inner.name, inner.measured
        self.batch_size, self.topology = inner.batch_size, inner.topology

    def device_name(self):
        return self.inner.device_name()

    def factor(self, shards) -> float:
        raise NotImplementedError

    def compute_cost(self, task, shards):
        from dreamshard.hardware.base import ComputeCost

        c, f = self.inner.compute_cost(task, shards), self.factor(shards)
        return ComputeCost(c.fwd_ms * f, c.bwd_ms * f)

    def plan_cost(self, task, plan):
        return self.plan_cost_from(task, plan, [self.compute_cost(task, plan.device_shards(d))
                                                for d in range(plan.num_devices)])

    def plan_cost_from(self, task, plan, compute):
        return self.inner.plan_cost_from(task, plan, compute)


def test_exhaustive_check_remeasures_the_top_plans_against_the_winners_curse():
    class LuckyOnce(Disturbed):
        """The analytic model, but each device shard set's first measurement comes out 30% low (noise)."""

        def __init__(self, inner):
            super().__init__(inner)
            self.seen: set = set()

        def factor(self, shards):
            key = tuple(sorted(s.table for s in shards))
            if key in self.seen:
                return 1.0
            self.seen.add(key)
            return 0.7

    tables = [Table(f"e{i}", 20_000 * (i + 1), 16 * (1 + i % 2), 2.0 + i) for i in range(6)]
    task = Task.uniform("big/0", tables, 4, 1.0)
    exact = AnalyticBackend(AnalyticConfig(regime="super_additive", batch_size=1024))
    sharders = [make_sharder("size_greedy")]
    truth = exhaustive_check(exact, [task], sharders, 1, 5, 2, "either", top_plans=4, rounds=3)
    noisy = exhaustive_check(LuckyOnce(exact), [task], sharders, 1, 5, 2, "either", top_plans=4,
                             rounds=3)
    t, n = truth["tasks"][0], noisy["tasks"][0]
    assert n["optimum_single_ms"] < 0.75 * t["optimum_ms"]  # the minimum of single lucky measurements
    assert n["optimum_ms"] == pytest.approx(t["optimum_ms"])  # re-measured: the median of 3 rounds is the truth
    assert n["bound_holds"] and noisy["rounds"] == 3 and noisy["top_plans"] == 4


def greedy_rows(backend) -> tuple[Task, pd.DataFrame, list[Table]]:
    """A 10-table, 3-device task of family "fam", and its evaluated rows for three greedy sharders (and its tables)."""
    from dreamshard.evaluation.evaluate import evaluate_task
    from dreamshard.evaluation.summary import result_row

    tables = [Table(f"e{i}", 20_000 * (i + 1), 16 * (1 + i % 3), 2.0 + 3 * i) for i in range(10)]
    task = Task.uniform("big/0", tables, 3, 1.0, family="fam")
    sharders = [make_sharder(n) for n in ("size_greedy", "dim_greedy", "lookup_greedy")]
    return task, pd.DataFrame([result_row(r) for r in evaluate_task(backend, task, sharders, "either")]), tables


def test_best_known_check_seeds_the_search_with_every_sharders_plan():
    from dreamshard.evaluation.improve import ImproveConfig
    from dreamshard.evaluation.summary import best_known_check, best_known_summary

    backend = AnalyticBackend(AnalyticConfig(regime="super_additive", batch_size=1024))
    task, rows, tables = greedy_rows(backend)
    config = ImproveConfig(budget=40, rounds=1, min_gain=0.0)
    per_task = best_known_check(backend, [task], rows, config)
    t = per_task[0]
    assert set(t["over_best_known"]) == {"size_greedy", "dim_greedy", "lookup_greedy"}
    for name, ratio in t["over_best_known"].items():  # each sharder's own cost over the best plan found
        assert ratio >= 1 - 1e-12
        assert ratio * t["best_known_ms"] == pytest.approx(rows.loc[rows["algorithm"] == name, "cost_ms"].item())
    assert t["best_known_ms"] <= t["best_sharder_ms"] and t["measurements"] <= 40
    cheapest = best_known_check(backend, [task], rows, config, seeds=1)[0]
    assert cheapest["seeds"] == [rows.sort_values("cost_ms")["algorithm"].iloc[0]]
    assert set(cheapest["over_best_known"]) == set(t["over_best_known"])  # every sharder still compared
    summary = best_known_summary(per_task, config)
    assert summary["families"]["fam"]["dim_greedy"] == {"mean_over_best_known": t["over_best_known"]["dim_greedy"],
                                                        "tasks": 1}
    assert summary["budget"] == 40
    with pytest.raises(ValueError, match="no evaluated plans of task 'other'"):
        best_known_check(backend, [Task.uniform("other", tables, 3, 1.0)], rows, config)


def test_best_known_check_compares_fresh_paired_readings_not_the_search_against_evaluate():
    """The machine speeds up while the search runs (each reading 1% faster than the one before): the search's own
    best median and the evaluated costs were read at different speeds, so a sharder's distance must come from
    readings taken side by side. Break the recheck (compare evaluated costs with the search's median) and a
    sharder's plan reads far from a best plan no cheaper than it."""
    from dreamshard.evaluation.improve import ImproveConfig
    from dreamshard.evaluation.summary import best_known_check

    class SpeedingUp(Disturbed):
        def __init__(self, inner):
            super().__init__(inner)
            self.calls = 0

        def factor(self, shards):
            self.calls += 1
            return 0.99 ** self.calls

    exact = AnalyticBackend(AnalyticConfig(regime="super_additive", batch_size=1024))
    task, rows, _ = greedy_rows(exact)
    config = ImproveConfig(budget=30, rounds=3, min_gain=0.0)
    truth = best_known_check(exact, [task], rows, config)[0]
    drifting = best_known_check(SpeedingUp(exact), [task], rows, config)[0]
    assert drifting["search_best_ms"] < 0.85 * truth["search_best_ms"]  # the search read a faster machine
    for name, ratio in truth["over_best_known"].items():
        assert ratio >= 1 - 1e-12 and drifting["over_best_known"][name] >= 1 - 1e-12
        # side by side: within the drift of one round of readings (the 4 plans of a round, 3 devices each)
        assert drifting["over_best_known"][name] == pytest.approx(ratio, rel=0.12)
    assert drifting["evaluated_ms"] == truth["evaluated_ms"] and drifting["recheck_rounds"] == 3
