"""Which model should judge a learned sharder's fallback beyond its training range, on plans already measured.

    python -m benchmarks.fallback_judge SUMMARY [SUMMARY ...] [--out DIR]

Each SUMMARY is a `benchmarks.fold_probe` pass (summary.json, or .json.xz): fresh heavy tables and validation
tables at holdout dims, every sharder's plan measured. Its tasks are drawn again from the pass's seed and task
count. For `dreamshard_cut` and `neuroshard` (their plans with no fallback, `@nofallback`) and each fallback
planner (`torchrec_full`, `torchrec_model`), the plan its judge rates cheaper is kept, the judge being the learned
model or TorchRec's perf model (always), or the rule of sharders/fallback.py: the learned plan where every feature
beyond the range is folded (dims), else TorchRec's perf model. Reported per family: the kept plan's measured cost
over the TorchRec peer's (the cheaper of `torchrec` and `torchrec_full` on the task), mean over tasks, and how
often the fallback's plan was kept. Nothing is measured: the figures are the pass's measurements. Writes
summary.json to --out.
"""
from __future__ import annotations

import argparse
import json
import lzma
from pathlib import Path

import numpy as np

LEARNED = {"dreamshard_cut": "cost_network", "neuroshard": "neuroshard"}
FALLBACKS = ("torchrec_full", "torchrec_model")
JUDGES = ("learned", "analytic", "rule")


def read_pass(path: Path) -> dict:
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("passes", type=Path, nargs="+", help="fold_probe summary.json files")
    parser.add_argument("--root", type=Path, default=Path("."), help="project with data/ and models/ from make run")
    parser.add_argument("--out", type=Path, default=Path("results/holdout/fallback-judge"))
    args = parser.parse_args()
    from benchmarks.cut_designs import project_at
    from benchmarks.fold_probe import probe_tasks
    from dreamshard.project.domain import Plan, write_text
    from dreamshard.project.learning import FOLDED
    from dreamshard.project.model_error import estimates_of

    params, _, _ = project_at(args.root)
    rate = estimates_of(params)  # the learned models and TorchRec's perf model on params' cluster and batch
    rows = []
    for path in args.passes:
        probe = read_pass(path)
        tasks = {t.name: t for t in probe_tasks(params, int(probe["seed"]), int(probe["tasks_per_family"]))[0]}
        for r in probe["tasks"]:
            task, cost = tasks[r["task"]], r["cost_ms"]
            plans = {}
            for plan, ms in zip(r["plans"], r["measured_ms"]):
                for name, c in cost.items():
                    if c == ms:
                        plans.setdefault(name, Plan.from_dict(plan))
            peer = min(cost["torchrec"], cost["torchrec_full"])
            for learned, model in LEARNED.items():
                mine = f"{learned}@nofallback" if f"{learned}@nofallback" in cost else learned
                outside = set(r["decisions"].get(learned, {}).get("outside_training_range", {}))
                for fallback in FALLBACKS:
                    for judge in JUDGES:
                        if judge == "rule" and outside <= set(FOLDED):
                            kept = mine
                        else:
                            f = rate[model] if judge == "learned" else rate["torchrec"]
                            kept = fallback if f(task, plans[fallback]) < f(task, plans[mine]) else mine
                        rows.append({"pass": path.name, "task": r["task"], "family": r["family"],
                                     "sharder": learned, "fallback": fallback, "judge": judge,
                                     "alone": cost[mine] / peer, "kept": cost[kept] / peer,
                                     "kept_fallback": kept == fallback})
    summary: dict = {"passes": [str(p) for p in args.passes], "families": {}, "rows": rows}
    for fam in sorted({r["family"] for r in rows}):
        entry = summary["families"].setdefault(fam, {})
        for learned in LEARNED:
            for fallback in FALLBACKS:
                for judge in JUDGES:
                    of = [r for r in rows if (r["family"], r["sharder"], r["fallback"], r["judge"])
                          == (fam, learned, fallback, judge)]
                    entry[f"{learned} / {fallback} / {judge}"] = {
                        "tasks": len(of), "alone": float(np.mean([r["alone"] for r in of])),
                        "kept": float(np.mean([r["kept"] for r in of])),
                        "kept_fallback": int(sum(r["kept_fallback"] for r in of))}
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(json.dumps(summary, separators=(",", ":")) + "\n", args.out / "summary.json")
    for fam, entry in summary["families"].items():
        print(fam)
        for key, e in entry.items():
            print(f"   {key:45s} alone {e['alone']:.3f}  kept {e['kept']:.3f}  fallback's plan {e['kept_fallback']}/"
                  f"{e['tasks']}")


if __name__ == "__main__":
    main()
