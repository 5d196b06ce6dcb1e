"""What the evaluate stage reports: result rows, per-family summaries, generalisation labels, the exhaustive check.

These produce metrics/eval.json and README's results table (dreamshard.evaluation.report).
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from dreamshard.evaluation.evaluate import BinsComparison, EvalResult, exhaustive_optimum, plan_with
from dreamshard.hardware.base import CostBackend
from dreamshard.hardware.comm import Topology
from dreamshard.memory import GB
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


def result_row(r: EvalResult) -> dict[str, Any]:
    """One row of data/eval/results.parquet."""
    return {
        "task": r.task.name, "family": r.task.family, "algorithm": r.algorithm,
        "cost_ms": r.cost.cost_ms, "lower_bound_ms": r.bound.total_ms, "cost_over_lb": r.cost.cost_ms / r.bound.total_ms,
        "planning_ms": r.planning_ms,
        "fwd_ms": [d.fwd_ms for d in r.cost.devices], "bwd_ms": [d.bwd_ms for d in r.cost.devices],
        "fwd_comm_ms": [d.fwd_comm_ms for d in r.cost.devices], "bwd_comm_ms": [d.bwd_comm_ms for d in r.cost.devices],
        "backend": r.cost.backend, "device_name": r.cost.device_name, "measured": r.cost.measured, "comm": r.cost.comm,
        "shards": json.dumps(r.plan.to_dict()["shards"]),
    }


def family_summary(results: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per family and algorithm: mean cost, cost / lower bound, planning time; improvements."""
    out: dict[str, dict] = defaultdict(dict)
    for (family, algo), g in results.groupby(["family", "algorithm"], sort=False):
        out[family][algo] = {
            "mean_cost_ms": float(g["cost_ms"].mean()),
            "mean_cost_over_lb": float(g["cost_over_lb"].mean()),
            "planning_ms_p50": float(g["planning_ms"].median()),
            "num_tasks": int(len(g)),
        }
    for algos in out.values():
        heuristics = {a: v["mean_cost_ms"] for a, v in algos.items() if a in HEURISTICS and a != "random"}
        best = min(heuristics, key=lambda a: heuristics[a]) if heuristics else None
        for v in algos.values():
            if "random" in algos:
                v["improvement_over_random"] = 1 - v["mean_cost_ms"] / algos["random"]["mean_cost_ms"]
            if best:
                v["improvement_over_best_heuristic"] = 1 - v["mean_cost_ms"] / heuristics[best]
        if best:
            algos["best_heuristic"] = best
    return dict(out)


def generalisation(sharders: Sequence[Sharder], tasks: Sequence[Task]) -> dict[str, Any]:
    """For each policy sharder, what each test family is new in: tables, table count, device count."""
    fams = {t.family: t for t in tasks}
    out = {}
    for sh in sharders:
        if SHARDERS[sh.name].kind != "policy":
            continue  # only the policies are trained on task families
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
                     n_tables: int, n_devices: int, batch_size: int, topology: Topology, regime: str) -> dict[str, Any]:
    """Measure every plan of small tasks (the first `n_tables` tables of the first `num_tasks` tasks on
    `n_devices` devices): does the bound hold, how far is the best sharder from the optimum?"""
    if num_tasks == 0:
        return {}
    memory = tasks[0].devices[0].memory_bytes / GB
    small = [Task.uniform(f"exhaustive/{i}", t.tables[:n_tables], n_devices, memory, t.memory, "exhaustive")
             for i, t in enumerate(tasks[:num_tasks])]
    per_task = []
    for task in tqdm(small, desc="exhaustive", unit="task"):
        res = exhaustive_optimum(backend, task, batch_size, topology, regime)
        # a whole-table plan's cost was enumerated; one with column slices or row ranges is measured
        enumerated = [(p.plan, None if any(s.is_row_range for s in p.plan.shards) else res.cost_of(p.plan))
                      for p in plan_with(sharders, task)]
        best_algo_cost = min(cost if cost is not None else backend.plan_cost(task, plan).cost_ms
                             for plan, cost in enumerated)
        per_task.append({
            "task": task.name, "plans": len(res.costs), "optimum_ms": res.optimum.cost_ms,
            "lower_bound_ms": res.bound.total_ms, "best_sharder_ms": best_algo_cost,
        })
    opt = np.array([p["optimum_ms"] for p in per_task])
    lb = np.array([p["lower_bound_ms"] for p in per_task])
    best = np.array([p["best_sharder_ms"] for p in per_task])
    return {
        "num_tables": n_tables, "num_devices": n_devices,
        "bound_holds": bool((lb <= opt).all()),
        "mean_lower_bound_over_optimum": float((lb / opt).mean()),
        "mean_best_sharder_over_optimum": float((best / opt).mean()),
        "tasks": per_task,
    }


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
