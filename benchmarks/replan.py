"""Re-planning that moves little: what a budget of moved bytes buys. Costs are MODELLED, not measured.

    python -m benchmarks.replan [--tasks 5] [--seed 0] [--out metrics/replan.json]

Tables: data/tables.parquet (the pipeline's) if it exists, else synthetic tables drawn by the pipeline's own
generator (dreamshard.data.dlrm: heavy-tailed rows and pooling factors, Zipf-skewed lookups; access-count bins
counted from a seeded batch of their lookups). Test tasks: `--tasks` tasks of 40 tables and as many of 80 tables,
on 8 devices, dims drawn from {4, 8, 16, 32, 64, 128}, device memory loose (twice an even share of the bytes, and
room for the largest table). Each task is planned by size_lookup_greedy (and by neuroshard if
models/neuroshard.pt exists); then 10% new tables (from the tables no task of that size uses) join it, and it is
re-planned (dreamshard.sharders.replan) with X = 0, 5, 10, 25, 50, 100% of the new task's bytes allowed to move. Scenario
`devices` also adds 4 devices (8 -> 12), which keeping everything cannot use for the old tables.

Per X: the median over tasks of cost / the full re-plan's cost (the full re-plan moves what it likes), of the GB
moved, and of the GB the full re-plan moves; costs from the analytic backend (super-additive regime, batch 2048),
a model of the fused kernels, never a measurement.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dreamshard.project.data import SyntheticConfig, generate_lookups, sample_table_profiles, table_seed
from dreamshard.project.domain import BIN_COLUMNS, GB, Task, access_count_bins, stats_table, write_text
from dreamshard.project.hardware import AnalyticBackend, AnalyticConfig
from dreamshard.project.sharders import load_model, make_sharder, replan

FRACTIONS = (0.0, 0.05, 0.10, 0.25, 0.50, 1.00)
DIMS = (4, 8, 16, 32, 64, 128)
FAMILIES = ((40, 8), (80, 8))
REGIME = "super_additive"
BATCH = 2048


def synthetic_stats(seed: int, num_tables: int = 400) -> pd.DataFrame:
    """Table statistics like data/tables.parquet's, from the pipeline's synthetic generator."""
    cfg = SyntheticConfig(num_tables=num_tables, seed=seed)
    rows = []
    for i, p in enumerate(sample_table_profiles(cfg)):
        indices, _ = generate_lookups(p, BATCH, table_seed(seed, f"t{i}"))
        _, counts = np.unique(indices, return_counts=True)
        rows.append({"table_id": i, "name": f"t{i}", "rows": p.hash_size, "pooling_factor": p.pooling_factor,
                     **dict(zip(BIN_COLUMNS, access_count_bins(counts)))})
    return pd.DataFrame(rows)


def make_tasks(stats: pd.DataFrame, num_tasks: int, seed: int, add_devices: int) -> list[tuple[Task, Task]]:
    """(task, the task with 10% new tables and `add_devices` more devices) pairs."""
    rng = np.random.default_rng(seed)
    records = stats.to_dict("records")
    pairs = []
    for num_tables, num_devices in FAMILIES:
        for k in range(num_tasks):
            picked = rng.choice(len(records), num_tables + num_tables // 10, replace=False)
            tables = [stats_table(records[int(i)], int(rng.choice(DIMS))) for i in picked]
            old = tables[:num_tables]
            name = f"replan-{num_tables}-{num_devices}-{k}"
            probe = Task.uniform(name, tables, num_devices, 1.0)
            sizes = [probe.table_bytes(i) for i in range(len(tables))]
            memory_gb = max(2 * sum(sizes) / num_devices, 1.25 * max(sizes)) / GB
            task = Task.uniform(name, old, num_devices, memory_gb)
            changed = replace(task, tables=tuple(tables), devices=task.devices + task.devices[:1] * add_devices)
            pairs.append((task, changed))
    return pairs


def git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def run(pairs: list[tuple[Task, Task]], sharder: Any, backend: AnalyticBackend) -> dict[str, Any]:
    per_x: dict[float, list[dict[str, Any]]] = {f: [] for f in FRACTIONS}
    for task, changed in pairs:
        previous = sharder.shard(task)
        total = sum(changed.table_bytes(i) for i in range(len(changed.tables)))
        for f in FRACTIONS:
            start = time.perf_counter()
            r = replan(changed, previous, sharder, f * total, backend)
            per_x[f].append({"task": task.name, "cost_ms": r.cost_ms, "full_cost_ms": r.full_cost_ms,
                             "kept_cost_ms": r.kept_cost_ms, "moved_gb": r.moved_bytes / GB,
                             "full_moved_gb": r.full_moved_bytes / GB, "total_gb": total / GB,
                             "evaluations": r.evaluations, "source": r.source,
                             "seconds": time.perf_counter() - start})
    rows = []
    for f, runs in per_x.items():
        rows.append({
            "fraction": f,
            "median_cost_over_full": statistics.median(r["cost_ms"] / r["full_cost_ms"] for r in runs),
            "mean_cost_over_full": statistics.mean(r["cost_ms"] / r["full_cost_ms"] for r in runs),
            "median_kept_over_full": statistics.median(r["kept_cost_ms"] / r["full_cost_ms"] for r in runs),
            "median_moved_gb": statistics.median(r["moved_gb"] for r in runs),
            "median_full_moved_gb": statistics.median(r["full_moved_gb"] for r in runs),
            "median_total_gb": statistics.median(r["total_gb"] for r in runs),
            "median_seconds": statistics.median(r["seconds"] for r in runs),
            "tasks": runs,
        })
    return {"rows": rows}


def show(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title} (analytic backend, {REGIME}: modelled, not measured)")
    print(f"{'X':>5} {'cost/full p50':>13} {'mean':>6} {'kept/full p50':>13} {'moved GB p50':>12} "
          f"{'full moved GB p50':>17} {'s p50':>6}")
    for r in rows:
        print(f"{r['fraction']:>5.0%} {r['median_cost_over_full']:>13.3f} {r['mean_cost_over_full']:>6.3f} "
              f"{r['median_kept_over_full']:>13.3f} {r['median_moved_gb']:>12.3f} {r['median_full_moved_gb']:>17.3f} "
              f"{r['median_seconds']:>6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", type=Path, default=Path("data/tables.parquet"))
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--tasks", type=int, default=5, help="tasks per family (40 and 80 tables on 8 devices)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("metrics/replan.json"))
    args = parser.parse_args()
    if args.tables.exists():
        stats, source = pd.read_parquet(args.tables), str(args.tables)
    else:
        stats, source = synthetic_stats(args.seed), f"synthetic (dreamshard.data.dlrm, seed {args.seed})"
    backend = AnalyticBackend(AnalyticConfig(regime=REGIME, batch_size=BATCH))
    sharders = {"size_lookup_greedy": make_sharder("size_lookup_greedy")}
    neuroshard = args.models / "neuroshard.pt"
    if neuroshard.exists():
        sharders["neuroshard"] = make_sharder("neuroshard", model=load_model("neuroshard", neuroshard))
    results: dict[str, Any] = {}
    for scenario, add_devices in (("tables", 0), ("devices", 4)):
        pairs = make_tasks(stats, args.tasks, args.seed, add_devices)
        for algo, sharder in sharders.items():
            key = f"{algo}/{scenario}"
            results[key] = run(pairs, sharder, backend)
            what = "10% new tables" + (f", {add_devices} new devices" if add_devices else "")
            show(f"{algo}: {what}, {len(pairs)} tasks", results[key]["rows"])
    out = {
        "what": "re-planning with X% of the task's bytes allowed to move: cost over the full re-plan's cost (median "
                "over tasks), GB moved; costs MODELLED by the analytic backend, not measured",
        "provenance": {"backend": "analytic", "measured": False, "regime": REGIME, "batch_size": BATCH,
                       "seed": args.seed, "tables": source, "commit": git("rev-parse", "HEAD") or None,
                       "uncommitted_changes": None if (status := git("status", "--porcelain")) is None else bool(status),
                       "tasks": {"families": [f"{n} tables on {d} devices" for n, d in FAMILIES],
                                 "per_family": args.tasks, "dims": list(DIMS), "new_tables": "10%",
                                 "memory": "2x an even share of the bytes, and 1.25x the largest table",
                                 "scenarios": {"tables": "10% new tables", "devices": "10% new tables, 8 -> 12 devices"}},
                       "fractions": list(FRACTIONS), "sharders": list(sharders)},
        "results": results,
    }
    write_text(json.dumps(out, indent=2) + "\n", args.out)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
