"""evaluate: plan every test task with every sharder, measure the plans, compare with lower bounds.

Also measures the backend's additivity (which decides the lower bound, see
dreamshard/bounds.py) and checks the bound against the true optimum of small tasks,
found by measuring every plan.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from tqdm import tqdm

from dreamshard.bounds import MIXED, SUB_ADDITIVE, SUPER_ADDITIVE, additivity_ratio, regime_of
from dreamshard.evaluate import evaluate_task, exhaustive_optimum, plan_with
from dreamshard.io import write_parquet, write_text
from dreamshard.memory import GB
from dreamshard.sharders import HEURISTICS, LEARNED, SPLITTING, make_sharder
from dreamshard.tasks import Task, read_tasks
from stages.backend import make_stage_backend
from stages.common import ParamsError, build, section

BOUND_USED = {
    SUPER_ADDITIVE: "(sum of single-table costs - (T-1) x cheapest single cost) / N + all-to-all bound",
    SUB_ADDITIVE: "cost of all tables fused / N + all-to-all bound",
    MIXED: "(sum of single-table costs - (T-1) x cheapest single cost) / N + all-to-all bound",
}


def run(params: dict[str, Any]) -> None:
    from dreamshard.hardware import Topology

    cfg = section(params, "evaluate")
    backend = make_stage_backend(params)
    batch_size = int(section(params, "backend.batch_size"))
    topology = build(Topology, section(params, "backend").get("topology", {}), "backend.topology")
    tasks_dir = Path(section(params, "paths.tasks"))
    tasks = read_tasks(tasks_dir / "test.parquet", section(params, "paths.tables"))
    per_family = int(cfg.get("train_tasks_per_family", 0))
    train_tasks = [t for t in read_tasks(tasks_dir / "train.parquet", section(params, "paths.tables"))
                   if int(t.name.rsplit("/", 1)[1]) < per_family]
    names = cfg.get("sharders")
    if not names:
        raise ParamsError("params.yaml: evaluate.sharders: expected a list of sharder names")
    models = Path(section(params, "paths.models"))
    try:
        sharders = [make_sharder(n, seed=int(cfg.get("seed", 0)), model=models / f"{n}.pt" if n in LEARNED else None,
                                 search=section(params, "neuroshard"), batch_size=batch_size) for n in names]
    except ValueError as exc:
        raise ParamsError(f"params.yaml: evaluate.sharders: {exc}") from None

    probes = tasks[: int(cfg.get("additivity_probes", 3))]
    ratios = [additivity_ratio(backend, t) for t in probes]
    regime = regime_of(ratios)
    print(f"evaluate: {backend.name} on {backend.device_name()}: fused / sum of singles = "
          f"{', '.join(f'{r:.3f}' for r in ratios)} -> {regime}")

    rows = []
    splits = [("test", t) for t in tasks] + [("train", t) for t in train_tasks]
    for split, task in tqdm(splits, desc="evaluate", unit="task"):
        for r in evaluate_task(backend, task, sharders, regime, batch_size, topology, int(cfg.get("rounds", 1)),
                               column_splits=any(n in SPLITTING for n in names)):
            rows.append({"split": split, **result_row(r)})
    results = pd.DataFrame(rows)
    out = Path(section(params, "paths.eval"))
    write_parquet(pa.Table.from_pandas(results, preserve_index=False), out / "results.parquet")

    exhaustive = exhaustive_check(backend, tasks, sharders, cfg.get("exhaustive", {}), batch_size, topology, regime)
    metrics = {
        "backend": backend.name,
        "device": backend.device_name(),
        "measured": backend.measured,
        "versions": backend.versions(),
        "batch_size": batch_size,
        "additivity": {"fused_over_sum_of_singles": ratios, "regime": regime, "lower_bound": BOUND_USED[regime]},
        "families": family_summary(results[results["split"] == "test"]),
        "train_families": family_summary(results[results["split"] == "train"]),
        "generalisation": generalisation(sharders, tasks),
        "exhaustive": exhaustive,
    }
    write_text(json.dumps(metrics, indent=2) + "\n", section(params, "paths.eval_metrics"))
    plot = results[results["split"] == "test"].groupby(["family", "algorithm"], sort=False)["cost_over_lb"].mean().reset_index()
    plot["family_algorithm"] = plot["family"] + " / " + plot["algorithm"]
    write_parquet(pa.Table.from_pandas(plot, preserve_index=False), out / "summary.parquet")
    plot_path = Path(section(params, "paths.eval_plot"))
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    write_text(plot[["family_algorithm", "cost_over_lb"]].to_csv(index=False), plot_path)
    print(f"evaluate: {len(tasks)} tasks x {len(sharders)} sharders -> {out}, {section(params, 'paths.eval_metrics')}")


def result_row(r) -> dict:
    return {
        "task": r.task.name, "family": r.task.family, "algorithm": r.algorithm,
        "cost_ms": r.cost.cost_ms, "lower_bound_ms": r.bound.total_ms, "cost_over_lb": r.cost.cost_ms / r.bound.total_ms,
        "plan_ms": r.plan_ms,
        "fwd_ms": [d.fwd_ms for d in r.cost.devices], "bwd_ms": [d.bwd_ms for d in r.cost.devices],
        "fwd_comm_ms": [d.fwd_comm_ms for d in r.cost.devices], "bwd_comm_ms": [d.bwd_comm_ms for d in r.cost.devices],
        "backend": r.cost.backend, "device_name": r.cost.device_name, "measured": r.cost.measured, "comm": r.cost.comm,
        "shards": json.dumps(r.plan.to_dict()["shards"]),
    }


def family_summary(results: pd.DataFrame) -> dict:
    """Per family and algorithm: mean cost, cost / lower bound, planning time; improvements."""
    out: dict[str, dict] = defaultdict(dict)
    for (family, algo), g in results.groupby(["family", "algorithm"], sort=False):
        out[family][algo] = {
            "mean_cost_ms": float(g["cost_ms"].mean()),
            "mean_cost_over_lb": float(g["cost_over_lb"].mean()),
            "plan_ms_p50": float(g["plan_ms"].median()),
            "num_tasks": int(len(g)),
        }
    for family, algos in out.items():
        heuristics = {a: v["mean_cost_ms"] for a, v in algos.items() if a in HEURISTICS and a != "random"}
        best = min(heuristics, key=heuristics.get) if heuristics else None
        for algo, v in algos.items():
            if "random" in algos:
                v["improvement_over_random"] = 1 - v["mean_cost_ms"] / algos["random"]["mean_cost_ms"]
            if best:
                v["improvement_over_best_heuristic"] = 1 - v["mean_cost_ms"] / heuristics[best]
        if best:
            algos["best_heuristic"] = best
    return dict(out)


def generalisation(sharders, tasks: list[Task]) -> dict:
    """For each learned sharder, what each test family is new in: tables, table count, device count."""
    out = {}
    for sh in sharders:
        if sh.name not in ("dreamshard", "autoshard"):
            continue  # only the policies are trained on task families
        model = sh.model
        seen_tables = set(model.meta.get("table_counts", []))
        seen_devices = set(model.meta.get("device_counts", []))
        fams = {t.family: t for t in tasks}
        out[sh.name] = {"trained_on": model.meta.get("families", []), "test_families": {
            f: {"unseen_tables": True,  # test tasks draw from the test pool, disjoint from training tables
                "unseen_table_count": len(t.tables) not in seen_tables,
                "unseen_device_count": t.num_devices not in seen_devices}
            for f, t in fams.items()}}
    return out


def exhaustive_check(backend, tasks: list[Task], sharders, cfg: dict, batch_size, topology, regime) -> dict:
    """Measure every plan of small tasks: does the bound hold, how far is the best sharder?"""
    num_tasks = int(cfg.get("num_tasks", 0))
    if num_tasks == 0:
        return {}
    n_tables, n_devices = int(cfg.get("num_tables", 8)), int(cfg.get("num_devices", 2))
    memory = tasks[0].devices[0].memory_bytes / GB
    small = [Task.uniform(f"exhaustive/{i}", t.tables[:n_tables], n_devices, memory, t.memory, "exhaustive")
             for i, t in enumerate(tasks[:num_tasks])]
    per_task = []
    for task in tqdm(small, desc="exhaustive", unit="task"):
        res = exhaustive_optimum(backend, task, batch_size, topology, regime)
        enumerated = [(p.plan, res.cost_of(p.plan)) for p in plan_with(sharders, task)]
        best_algo_cost = min(cost if cost is not None else backend.plan_cost(task, plan).cost_ms  # split: measure
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
