"""What the evaluate stage reports: result rows, per-family summaries, generalisation labels, the exhaustive check.

These produce metrics/eval.json and the results tables built from it (dreamshard.evaluation.report, readme_table).
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from dreamshard.evaluation.bounds import BOUND_USED
from dreamshard.evaluation.evaluate import BinsComparison, EvalResult, exhaustive_optimum, plan_with
from dreamshard.evaluation.improve import ImproveConfig, improve
from dreamshard.hardware.base import CostBackend, measure_rounds, median_cost
from dreamshard.memory import GB
from dreamshard.plan import Plan
from dreamshard.sharders import HEURISTICS, SHARDERS, Sharder
from dreamshard.tasks import Task


def first_per_family(tasks: Sequence[Task], count: int) -> list[Task]:
    """The first `count` tasks of each family, in the order given."""
    taken: dict[str, int] = defaultdict(int)
    out = []
    for t in tasks:
        if taken[t.family] < count:
            taken[t.family] += 1
            out.append(t)
    return out


def interleave_families(tasks: Sequence[Task]) -> list[Task]:
    """The tasks in turns across families (each family's first, then each one's second, ...), each family's in
    the order given: an evaluation stopped partway holds a like share of every family."""
    by_family: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        by_family[t.family].append(t)
    queues = list(by_family.values())
    return [q[i] for i in range(max((len(q) for q in queues), default=0)) for q in queues if i < len(q)]


def result_row(r: EvalResult) -> dict[str, Any]:
    """One row of data/eval/results.parquet."""
    return {
        "task": r.task.name, "family": r.task.family, "algorithm": r.algorithm,
        "cost_ms": r.cost.cost_ms, "lower_bound_ms": r.bound.total_ms, "cost_over_lb": r.cost.cost_ms / r.bound.total_ms,
        "planning_ms": r.planning_ms, "fallback": r.fallback,
        "fwd_ms": [d.fwd_ms for d in r.cost.devices], "bwd_ms": [d.bwd_ms for d in r.cost.devices],
        "fwd_comm_ms": [d.fwd_comm_ms for d in r.cost.devices], "bwd_comm_ms": [d.bwd_comm_ms for d in r.cost.devices],
        "backend": r.cost.backend, "device_name": r.cost.device_name, "measured": r.cost.measured, "comm": r.cost.comm,
        "shards": json.dumps(r.plan.to_dict()["shards"]),
    }


BEST_HEURISTIC = "best_heuristic"  # the reference name that means: per family, the best heuristic
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_LEVEL = 0.95
# compared with when present (vs_torchrec, ...): TorchRec's planner, and NeuroShard table-wise, the peer of the
# table-wise learned sharders
REFERENCES = ("torchrec", "torchrec_full", "neuroshard_tw")
# the reference name that means: per family, whichever of TorchRec's planners evaluated there has the lowest mean
# cost (TorchRec at its strongest); every claim against TorchRec is made against it
TORCHREC_PEER = "torchrec_peer"
PEER_CANDIDATES = ("torchrec", "torchrec_full", "torchrec_full_min", "torchrec_calibrated")


def bootstrap_ci(values: Sequence[float] | np.ndarray | pd.Series, seed: int, resamples: int = BOOTSTRAP_RESAMPLES,
                 level: float = BOOTSTRAP_LEVEL, statistic: Callable[..., Any] = np.mean,
                 groups: Sequence[Any] | None = None) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over `values` (one per task): `resamples` resamples with
    replacement, drawn by numpy's default_rng(seed), so the same values and seed give the same interval.

    `statistic` is called as statistic(samples, axis=1) on a (resamples, n) array when it takes `axis`
    (np.mean, np.median), otherwise once per resample. Returns the (1 - level) / 2 and (1 + level) / 2
    percentiles of the resampled statistics; a single value v gives (v, v).

    `groups` (one label per value: tasks that share tables, `table_groups`): a cluster bootstrap of the mean,
    resampling whole groups (the mean over every value of the groups drawn); with one group there is nothing to
    resample and the interval is (nan, nan). Distinct labels for every value give the task bootstrap."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"bootstrap_ci: expected a non-empty 1-d sequence of values, got shape {x.shape}")
    if not 0 < level < 1:
        raise ValueError(f"bootstrap_ci: level must lie in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"bootstrap_ci: resamples must be at least 1, got {resamples}")
    if groups is not None:
        labels = pd.Series(list(groups), dtype=object)
        if len(labels) != x.size:
            raise ValueError(f"bootstrap_ci: {len(labels)} group labels for {x.size} values")
        if statistic is not np.mean:
            raise ValueError("bootstrap_ci: groups resample the mean only")
        if labels.nunique() < x.size:
            return _cluster_ci(x, labels, seed, resamples, level)
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    n = x.size
    block = max(1, 2_000_000 // n)  # resamples drawn at once: bounds memory for long value lists
    stats = []
    for start in range(0, resamples, block):
        samples = x[rng.integers(0, n, size=(min(block, resamples - start), n))]
        try:
            stats.append(np.asarray(statistic(samples, axis=1), dtype=float))
        except TypeError:  # a statistic without `axis`
            stats.append(np.array([statistic(row) for row in samples], dtype=float))
    low, high = np.percentile(np.concatenate(stats), [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(low), float(high)


def _cluster_ci(x: np.ndarray, labels: pd.Series, seed: int, resamples: int, level: float) -> tuple[float, float]:
    """bootstrap_ci over groups: each resample draws as many groups as there are, with replacement, and takes
    the mean of all their values (a group of k tasks weighs k)."""
    codes, _ = pd.factorize(labels)
    sums = np.bincount(codes, weights=x)
    sizes = np.bincount(codes).astype(float)
    g = sizes.size
    if g == 1:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    block = max(1, 2_000_000 // g)
    stats = []
    for start in range(0, resamples, block):
        drawn = rng.integers(0, g, size=(min(block, resamples - start), g))
        stats.append(sums[drawn].sum(axis=1) / sizes[drawn].sum(axis=1))
    low, high = np.percentile(np.concatenate(stats), [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(low), float(high)


def table_groups(tasks: Sequence[Task]) -> dict[str, str]:
    """Task name -> its group: within each family, the tasks joined by shared tables (connected components: two
    tasks of different groups share no table). Test tasks drawn in disjoint blocks (data.sampling.table_blocks)
    form one group per block; tasks that share no table are a group each. Labelled family/first task's name."""
    out: dict[str, str] = {}
    by_family: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        by_family[t.family].append(t)
    for family, members in by_family.items():
        parent = list(range(len(members)))
        owner: dict[str, int] = {}
        for i, task in enumerate(members):
            for table in task.tables:
                parent[_root(parent, i)] = _root(parent, owner.setdefault(table.name, i))
        for i, task in enumerate(members):
            out[task.name] = f"{family}/{members[_root(parent, i)].name}"
    return out


def with_table_groups(results: pd.DataFrame, test_tasks: Sequence[Task]) -> pd.DataFrame:
    """`results` with the TABLE_GROUP column `compare` resamples by: test tasks grouped by shared tables
    (table_groups), every other task (training tasks, drawn freely) a group of its own."""
    groups = table_groups(test_tasks)
    return results.assign(**{TABLE_GROUP: results["task"].map(lambda name: groups.get(name, name))})


def _root(parent: list[int], i: int) -> int:
    """Union-find: the root of `i`, halving the path on the way."""
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def best_heuristics(results: pd.DataFrame) -> dict[str, str]:
    """Per family, the heuristic (HEURISTICS but random) with the lowest mean cost there; families without
    one are left out. Ties go to the heuristic that appears first in `results`."""
    return _best_of(results, [h for h in HEURISTICS if h != "random"])


def torchrec_peers(results: pd.DataFrame) -> dict[str, str]:
    """Per family, the TorchRec planner (PEER_CANDIDATES) with the lowest mean cost there; families without one
    are left out. Ties go to the one that appears first in `results`."""
    return _best_of(results, PEER_CANDIDATES)


def _best_of(results: pd.DataFrame, candidates: Sequence[str]) -> dict[str, str]:
    means = results.groupby(["family", "algorithm"], sort=False)["cost_ms"].mean()
    out: dict[str, str] = {}
    best_cost: dict[str, float] = {}
    for (family, algo), cost in means.items():
        if algo in candidates and (family not in out or cost < best_cost[family]):
            out[family], best_cost[family] = algo, float(cost)
    return out


def _costs(results: pd.DataFrame, algorithm: str) -> pd.Series:
    """`algorithm`'s cost per (family, task)."""
    rows = results[results["algorithm"] == algorithm]
    return rows.set_index(["family", "task"])["cost_ms"]


def paired_ratios(results: pd.DataFrame, algorithm: str, reference: str) -> pd.Series:
    """Per task, `algorithm`'s cost over `reference`'s on the same task, for the tasks where both were
    measured (results: one row per task and algorithm, columns task, family, algorithm, cost_ms).

    `reference` is an algorithm's name, "best_heuristic": per family, the heuristic with the lowest
    mean cost in that family (best_heuristics), or "torchrec_peer": likewise of TorchRec's planners. The series
    is indexed by task name, in the order of `algorithm`'s rows."""
    mine = _costs(results, algorithm)
    if reference in (BEST_HEURISTIC, TORCHREC_PEER):
        best = best_heuristics(results) if reference == BEST_HEURISTIC else torchrec_peers(results)
        ref = pd.concat([_costs(results[results["family"] == f], h) for f, h in best.items()]) if best \
            else pd.Series(dtype=float)
    else:
        ref = _costs(results, reference)
    for name, costs in ((algorithm, mine), (reference, ref)):
        if costs.index.has_duplicates:
            raise ValueError(f"paired_ratios: {name} has more than one row for a task")
    both = mine.index[mine.index.isin(ref.index)]
    ratios = mine.loc[both] / ref.loc[both]
    return pd.Series(ratios.to_numpy(dtype=float), index=pd.Index(both.get_level_values("task"), name="task"),
                     name=f"{algorithm}/{reference}")


def win_rate(results: pd.DataFrame, algorithm: str, reference: str) -> float:
    """The share of the paired tasks (see paired_ratios) where `algorithm` costs less than `reference`;
    a tie counts one half. NaN when no task has both."""
    return _win_rate(paired_ratios(results, algorithm, reference))


def _win_rate(ratios: pd.Series) -> float:
    if ratios.empty:
        return float("nan")
    return float(((ratios < 1).sum() + 0.5 * (ratios == 1).sum()) / len(ratios))


def compare(results: pd.DataFrame, algorithm: str, reference: str, seed: int) -> dict[str, Any]:
    """`algorithm` against `reference` over their paired tasks: the mean of the per-task cost ratios (not
    a ratio of means), its 95% percentile bootstrap interval (bootstrap_ci with `seed`: over groups of tasks
    that share tables where `results` has a `table_group` column, else over tasks), the win rate, the number of
    tasks and of groups, and whether the whole interval lies below 1 ("better") or above ("worse"). Raises
    ValueError when no task has both."""
    compared = _compared(results, algorithm, reference, seed)
    if compared is None:
        raise ValueError(f"compare: no task has both {algorithm} and {reference}")
    return compared


def _compared(results: pd.DataFrame, algorithm: str, reference: str, seed: int) -> dict[str, Any] | None:
    """compare's answer, None when no task has both (the pairing made once)."""
    ratios = paired_ratios(results, algorithm, reference)
    if ratios.empty:
        return None
    groups = None
    if TABLE_GROUP in results.columns:
        group_of = results.drop_duplicates("task").set_index("task")[TABLE_GROUP]
        groups = group_of.loc[ratios.index].to_numpy()
    low, high = bootstrap_ci(ratios.to_numpy(), seed, groups=groups)
    return {"mean_ratio": float(ratios.mean()), "ci_low": low, "ci_high": high,
            "win_rate": _win_rate(ratios), "tasks": int(len(ratios)),
            "groups": int(len(set(groups))) if groups is not None else int(len(ratios)),
            "better": bool(high < 1), "worse": bool(low > 1)}


TABLE_GROUP = "table_group"  # results column: the task's group of tasks sharing tables (table_groups)


def bootstrap_meta(seed: int, grouped: bool = False) -> dict[str, Any]:
    """How family_summary's intervals were drawn, for metrics/eval.json (key "bootstrap"), which
    dreamshard.evaluation.report's legend quotes; `grouped`: over groups of tasks that share tables."""
    return {"method": "percentile", "over": "groups of tasks sharing tables" if grouped else "tasks",
            "seed": int(seed), "resamples": BOOTSTRAP_RESAMPLES, "level": BOOTSTRAP_LEVEL}


def family_summary(results: pd.DataFrame, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Per family and algorithm: mean cost, cost / lower bound, planning time; improvements of mean costs
    over random and over the family's best heuristic (key "best_heuristic", see best_heuristics).

    With a `task` column, each algorithm also gets paired per-task comparisons (compare, bootstrap
    seeded with `seed`): "vs_best_heuristic", "vs_torchrec_peer" (key "torchrec_peer": the TorchRec planner it is),
    and "vs_torchrec" / "vs_torchrec_full" / "vs_neuroshard_tw" where that algorithm was measured on the same tasks
    of the family."""
    out: dict[str, dict] = defaultdict(dict)
    for (family, algo), g in results.groupby(["family", "algorithm"], sort=False):
        out[family][algo] = {
            "mean_cost_ms": float(g["cost_ms"].mean()),
            "mean_cost_over_lb": float(g["cost_over_lb"].mean()),
            "planning_ms_p50": float(g["planning_ms"].median()),
            "num_tasks": int(len(g)),
        }
    best_of, peer_of = best_heuristics(results), torchrec_peers(results)
    for family, algos in out.items():
        best, peer = best_of.get(family), peer_of.get(family)
        for v in algos.values():
            if "random" in algos:
                v["improvement_over_random"] = 1 - v["mean_cost_ms"] / algos["random"]["mean_cost_ms"]
            if best:
                v["improvement_over_best_heuristic"] = 1 - v["mean_cost_ms"] / algos[best]["mean_cost_ms"]
        if "task" in results.columns:
            rows = results[results["family"] == family]
            references = ([(BEST_HEURISTIC, "vs_best_heuristic")] if best else []) + \
                ([(TORCHREC_PEER, "vs_torchrec_peer")] if peer else []) + \
                [(r, f"vs_{r}") for r in REFERENCES if r in algos]
            for algo, v in algos.items():
                for reference, key in references:
                    if (compared := _compared(rows, algo, reference, seed)) is not None:
                        v[key] = compared
        if best:
            algos["best_heuristic"] = best
        if peer:
            algos[TORCHREC_PEER] = peer
    return dict(out)


def pooled_summary(results: pd.DataFrame, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Per algorithm, its paired ratios over every family's tasks at once (each task against its own family's best
    heuristic and TorchRec peer), with compare's interval over all those tasks: the claim of a run whose families
    hold too few tasks each for an interval of their own."""
    out: dict[str, dict[str, Any]] = {}
    for algo in results["algorithm"].unique():
        entry = {}
        for reference, key in ((BEST_HEURISTIC, "vs_best_heuristic"), (TORCHREC_PEER, "vs_torchrec_peer")):
            if (compared := _compared(results, algo, reference, seed)) is not None:
                entry[key] = compared
        out[str(algo)] = entry
    return out


def with_ratios(gen: dict[str, Any], families: dict[str, Any], train_families: dict[str, Any]) -> dict[str, Any]:
    """`generalisation`'s entries with each sharder's paired ratio to the best heuristic (`vs_best_heuristic` of
    `family_summary`): per test family, and on the training tasks of each family it trained on (None where the
    family or the sharder was not evaluated)."""
    out = {}
    for algo, g in gen.items():
        test = {f: {**entry, "vs_best_heuristic": families.get(f, {}).get(algo, {}).get("vs_best_heuristic")}
                for f, entry in g["test_families"].items()}
        seen = {f: train_families.get(f, {}).get(algo, {}).get("vs_best_heuristic") for f in g["trained_on"]}
        out[algo] = {**g, "test_families": test, "training_tasks": seen}
    return out


def generalisation(sharders: Sequence[Sharder], tasks: Sequence[Task]) -> dict[str, Any]:
    """For each sharder trained on task families (the policies, the RNN baseline), what each test family is new
    in: tables, table count, device count."""
    fams = {t.family: t for t in tasks}
    out = {}
    for sh in sharders:
        if SHARDERS[sh.name].kind not in ("policy", "rnn"):
            continue  # only these are trained on task families
        model = sh.model  # type: ignore[attr-defined]
        seen_tables = set(model.meta.get("table_counts", []))
        seen_devices = set(model.meta.get("device_counts", []))
        out[sh.name] = {"trained_on": model.meta.get("families", []), "test_families": {
            f: {"unseen_tables": True,  # test tasks draw from the test pool, disjoint from training tables
                "unseen_table_count": len(t.tables) not in seen_tables,
                "unseen_device_count": t.num_devices not in seen_devices}
            for f, t in fams.items()}}
    return out


def exhaustive_check(backend: CostBackend, tasks: Sequence[Task], sharders: Sequence[Sharder], num_tasks: int,
                     n_tables: int, n_devices: int, regime: str,
                     top_plans: int = 8, rounds: int = 3) -> dict[str, Any]:
    """Measure every plan of small tasks (the first `n_tables` tables of the first `num_tasks` tasks on
    `n_devices` devices): does the bound hold, how far is the best sharder from the optimum?

    Every plan is measured once; the minimum of many single noisy measurements is biased low (the
    winner's curse), so the `top_plans` cheapest plans and every sharder's plan are then measured again
    in `rounds` interleaved rounds (measure_rounds) and compared by their medians: `optimum_ms` is
    the best re-measured whole-table plan, `optimum_single_ms` the minimum of the single measurements. The
    bound's probes are read `rounds` times each, the least reading kept (ProbeCache)."""
    if num_tasks == 0:
        return {}
    if top_plans < 1 or rounds < 1:
        raise ValueError(f"exhaustive check: top_plans and rounds must be >= 1, got {top_plans}, {rounds}")
    memory = tasks[0].devices[0].memory_bytes / GB
    small = [Task.uniform(f"exhaustive/{i}", t.tables[:n_tables], n_devices, memory, t.memory, "exhaustive")
             for i, t in enumerate(tasks[:num_tasks])]
    per_task = []
    for task in tqdm(small, desc="exhaustive", unit="task"):
        res = exhaustive_optimum(backend, task, regime, bound_rounds=rounds)
        top = [Plan.from_assignment(task, list(a)) for a in sorted(res.costs, key=lambda a: res.costs[a])[:top_plans]]
        planned = [p.plan for p in plan_with(sharders, task)]
        remeasured = measure_rounds(backend, task, top + planned, rounds, median_cost)
        optimum = min(c.cost_ms for c in remeasured[:len(top)])
        best_algo_cost = min(c.cost_ms for c in remeasured[len(top):])
        per_task.append({
            "task": task.name, "plans": len(res.costs), "optimum_ms": optimum,
            "optimum_single_ms": res.optimum.cost_ms, "remeasured_plans": len(top) + len(planned),
            "lower_bound_ms": res.bound.total_ms, "best_sharder_ms": best_algo_cost,
            "bound_holds": bool(res.bound.total_ms <= optimum),
        })
    opt = np.array([p["optimum_ms"] for p in per_task])
    lb = np.array([p["lower_bound_ms"] for p in per_task])
    best = np.array([p["best_sharder_ms"] for p in per_task])
    return {
        "num_tables": n_tables, "num_devices": n_devices, "top_plans": top_plans, "rounds": rounds,
        "bound": BOUND_USED[regime],
        "bound_holds": bool((lb <= opt).all()),
        "mean_lower_bound_over_optimum": float((lb / opt).mean()),
        "mean_best_sharder_over_optimum": float((best / opt).mean()),
        "tasks": per_task,
    }


def best_known_check(backend: CostBackend, tasks: Sequence[Task], results: pd.DataFrame,
                     config: ImproveConfig, seeds: int | None = None) -> list[dict[str, Any]]:
    """Distance to the best plan found: for each task, the improvement search (dreamshard.evaluation.improve)
    seeded with the sharders' plans of it (the `shards` of its rows in `results`: all of them, or the `seeds`
    cheapest by their evaluated cost), measuring real plans. The search keeps the plan whose median read lowest
    of many, and evaluate measured the sharders' plans at another time, so neither figure is compared: the best
    plan found and every sharder's plan are measured again, `config.rounds` fresh readings each in interleaved
    turns, and each sharder's median over the best of those medians is its distance (>= 1). Per task also the
    search's own best median and the sharders' evaluated costs."""
    out = []
    for task in tasks:
        rows = results[results["task"] == task.name]
        if rows.empty:
            raise ValueError(f"best-known check: no evaluated plans of task {task.name!r}")
        chosen = rows.sort_values("cost_ms", kind="stable").head(seeds) if seeds is not None else rows
        names = rows["algorithm"].tolist()
        every = [Plan.from_dict({"num_devices": task.num_devices, "shards": json.loads(s)}, f"{task.name}/{a}")
                 for a, s in zip(names, rows["shards"])]
        found = improve(backend, task, [every[names.index(a)] for a in chosen["algorithm"]], config)
        # fresh paired readings: the same plan given twice (a sharder's plan the search kept) is measured once
        again = [c.cost_ms for c in measure_rounds(backend, task, [*every, found.best_plan], config.rounds,
                                                   median_cost)]
        best = min(again)
        out.append({"task": task.name, "family": task.family, "best_known_ms": best,
                    "search_best_ms": found.best_cost.cost_ms, "search_best_rechecked_ms": again[-1],
                    "seeds": chosen["algorithm"].tolist(), "best_sharder_ms": min(again[:-1]),
                    "measurements": found.measurements, "recheck_rounds": config.rounds,
                    "rechecked_ms": dict(zip(names, again[:-1])),
                    "evaluated_ms": {a: float(c) for a, c in zip(names, rows["cost_ms"])},
                    "over_best_known": {a: c / best for a, c in zip(names, again[:-1])}})
    return out


def best_known_summary(per_task: Sequence[dict[str, Any]], config: ImproveConfig) -> dict[str, Any]:
    """Per family and sharder, the mean of cost / best-known cost over the tasks searched."""
    families: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t in per_task:
        for a, r in t["over_best_known"].items():
            families[t["family"]][a].append(r)
    return {"budget": config.budget, "rounds": config.rounds, "min_gain": config.min_gain,
            "families": {f: {a: {"mean_over_best_known": float(np.mean(v)), "tasks": len(v)} for a, v in algos.items()}
                         for f, algos in families.items()},
            "tasks": list(per_task)}


def estimated_bins_summary(comparisons: Sequence[BinsComparison]) -> dict[str, Any]:
    """Per sharder: the measured cost of its plans made with estimated bins over those made with the measured
    bins (mean, per family, range), and the share of tasks where the two plans are the same."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(c.algorithm for c in comparisons):
        mine = [c for c in comparisons if c.algorithm == name]
        ratios = [c.estimated_bins.cost_ms / c.measured_bins.cost_ms for c in mine]
        families: dict[str, list[float]] = {}
        for c, r in zip(mine, ratios):
            families.setdefault(c.task.family, []).append(r)
        out[name] = {"estimated_over_measured_mean": float(np.mean(ratios)),
                     "min": float(min(ratios)), "max": float(max(ratios)), "tasks": len(mine),
                     "same_plan_share": sum(c.same_plan for c in mine) / len(mine),
                     "per_family": {f: float(np.mean(v)) for f, v in families.items()}}
    return out
