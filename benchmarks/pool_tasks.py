"""Pool the per-task costs of several `benchmarks.cut_designs` runs over other tasks of the same families.

    python -m benchmarks.pool_tasks DIR [DIR ...] --out DIR [--reference torchrec_full]

Each DIR holds the tasks.csv a run wrote (family, task, sharder, cost_ms, ...). Per sharder and family: the mean
over the pooled tasks of the paired ratio cost / the reference's cost on the same task, with the same 95%
bootstrap interval as the runs themselves (seed 0). A task in two runs is an error: pool disjoint tasks, not
passes. Writes pooled.json and README.md to --out.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd


def pooled_rows(folders: list[Path]) -> pd.DataFrame:
    frames = []
    for folder in folders:
        path = folder / "tasks.csv"
        if not path.is_file():
            raise SystemExit(f"{path}: missing (benchmarks.cut_designs writes it beside summary.json)")
        frame = pd.read_csv(path)
        missing = {"family", "task", "sharder", "cost_ms"} - set(frame.columns)
        if missing:
            raise SystemExit(f"{path}: no column(s) {', '.join(sorted(missing))}")
        frames.append(frame)
    rows = pd.concat(frames, ignore_index=True)
    seen = rows.groupby(["task", "sharder"]).size()
    twice = sorted({task for task, _ in seen[seen > 1].index})
    if twice:
        raise SystemExit(f"tasks in more than one run ({', '.join(twice[:5])}...): pool disjoint tasks only")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pool_tasks", description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--reference", default="torchrec_full")
    args = ap.parse_args(argv)
    from dreamshard.project.evaluation import bootstrap_ci

    rows = pooled_rows(args.runs)
    costs = rows.pivot_table(index=["family", "task"], columns="sharder", values="cost_ms")
    if args.reference not in costs.columns:
        raise SystemExit(f"--reference {args.reference}: no such sharder in the runs ({', '.join(costs.columns)})")
    out: dict = {"runs": [str(r) for r in args.runs], "reference": args.reference,
                 "command": " ".join(["python -m benchmarks.pool_tasks", *sys.argv[1:]]), "families": {}}
    lines = [f"# Pooled tasks, cost over `{args.reference}`\n", "Command:\n", f"    {out['command']}\n",
             "| family | tasks | sharder | mean [95% bootstrap] |", "|---|---:|---|---|"]
    for family, of_family in costs.groupby(level="family"):
        out["families"][family] = {}
        for sharder in of_family.columns:
            ratios = (of_family[sharder] / of_family[args.reference]).dropna()
            low, high = bootstrap_ci(ratios.to_numpy(), seed=0)
            out["families"][family][sharder] = {"mean": float(ratios.mean()), "ci_low": low, "ci_high": high,
                                                "tasks": int(len(ratios))}
            lines.append(f"| {family} | {len(ratios)} | {sharder} | {ratios.mean():.3f} [{low:.3f}, {high:.3f}] |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pooled.json").write_text(json.dumps(out, indent=2) + "\n")
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[3:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
