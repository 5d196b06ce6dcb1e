"""What a policy's decoding with rivals would have measured, from an evaluation already journaled: no new measurement.

    python -m experiments.decoding_ab [--root DIR] [--sharder dreamshard] [--rivals a,b,...] [--out FILE]

With `rivals` (dreamshard/sharders/learned.py) a policy sharder keeps whichever of its own plan and the greedy
heuristics' plans its cost network rates cheapest. Each of those plans was planned and measured by the evaluation
(the heuristics are sharders of evaluate.sharders, and the policy's plan is the sharder's own), so the variant's
measured cost on a task is the measured cost of the plan it picks, read from the journal: the same measurement
the other sharders are compared on. For every journaled task of the run in ROOT (params.yaml, its models, its
evaluate journal: the default run or the paper-scale one), this plans the task with the variant, finds its plan
among the evaluated ones, and reports per family the paired ratio to the best heuristic (95% bootstrap interval,
win rate) of the sharder as evaluated and of the variant, and how often the variant kept the policy's plan.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from dreamshard.errors import DreamShardError
from dreamshard.plan import Plan, PlanKey
from dreamshard.sharders.heuristics import GREEDY_KEYS

VARIANT = "{sharder}+rivals"


def plan_key(shards: list[dict[str, Any]]) -> PlanKey:
    """Plan.key() of a plan's shards as written (JSON objects)."""
    return Plan.from_dict({"num_devices": 1 + max(s["device"] for s in shards), "shards": shards}).key()


def plan_key_of(shards_json: str) -> tuple:
    """plan_key of a result row's `shards` (JSON)."""
    return plan_key(json.loads(shards_json))


def counterfactual(params: dict[str, Any], sharder: str, rivals: tuple[str, ...]) -> tuple[pd.DataFrame, dict[str, int]]:
    """The journaled rows plus one row per task for the variant (the evaluated row of the plan it picks, renamed),
    and counts: tasks, kept (the policy's own plan), picked per heuristic, missing (its plan not evaluated)."""
    from dreamshard.sharders import make_sharder
    from tools.paper_cpu import evaluation_of

    _backend, sharders, journal, splits = evaluation_of(params)
    evaluated = {s.name: s for s in sharders}
    missing = sorted({sharder, *rivals} - set(evaluated))
    if missing:
        raise DreamShardError(f"params.yaml: evaluate.sharders: the variant needs {sharder} and the rivals "
                              f"{', '.join(rivals)} evaluated; missing: {', '.join(missing)}")
    variant = make_sharder(sharder, model=evaluated[sharder].model, rivals=rivals)  # type: ignore[attr-defined]
    name = VARIANT.format(sharder=sharder)
    rows: list[dict[str, Any]] = []
    counts = {"tasks": 0, "kept": 0, "missing": 0, **{r: 0 for r in rivals}}
    for split, task in splits:
        if not journal.has(split, task):
            continue
        mine = journal.read(split, task)
        rows += mine
        by_plan = {plan_key_of(r["shards"]): r for r in mine}
        key = plan_key(variant.shard(task).to_dict()["shards"])
        picked = by_plan.get(key)
        counts["tasks"] += 1
        if picked is None:
            counts["missing"] += 1
            continue
        own = next(r for r in mine if r["algorithm"] == sharder)
        if plan_key_of(own["shards"]) == key:
            counts["kept"] += 1
        else:
            counts[picked["algorithm"]] = counts.get(picked["algorithm"], 0) + 1
        rows.append({**picked, "algorithm": name, "planning_ms": float("nan")})
    return pd.DataFrame(rows), counts


def report(frame: pd.DataFrame, sharder: str, seed: int) -> dict[str, Any]:
    from dreamshard.evaluation.summary import family_summary

    name = VARIANT.format(sharder=sharder)
    out: dict[str, Any] = {}
    for split in ("test", "train"):
        part = frame[frame["split"] == split]
        if part.empty:
            continue
        fams = family_summary(part, seed=seed)
        out[split] = {f: {a: algos[a].get("vs_best_heuristic") for a in (sharder, name) if a in algos}
                      for f, algos in fams.items()}
    return out


def markdown(result: dict[str, Any], sharder: str) -> str:
    name = VARIANT.format(sharder=sharder)
    lines = [f"| split | family | {sharder} vs best heuristic | {name} vs best heuristic | tasks |", "|---|---|---:|---:|---:|"]

    def cell(c: dict | None) -> str:
        return f"{c['mean_ratio']:.3f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}], wins {100 * c['win_rate']:.0f}%" if c else "–"

    for split, fams in result["families"].items():
        for family, v in fams.items():
            tasks = (v.get(sharder) or {}).get("tasks", "–")
            lines.append(f"| {split} | {family} | {cell(v.get(sharder))} | {cell(v.get(name))} | {tasks} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.decoding_ab", description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path("."))
    ap.add_argument("--sharder", default="dreamshard")
    ap.add_argument("--rivals", default=",".join(GREEDY_KEYS))
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = ap.parse_args(argv)
    from pipeline.__main__ import huge_pages_from_params

    root = args.root.resolve()
    out = args.out.resolve() if args.out else None
    huge_pages_from_params(str(root / "params.yaml"))
    os.chdir(root)
    from stages.common import load_params, section

    try:
        params = load_params("params.yaml")
        frame, counts = counterfactual(params, args.sharder, tuple(r for r in args.rivals.split(",") if r))
        result = {"sharder": args.sharder, "rivals": args.rivals.split(","), "counts": counts,
                  "families": report(frame, args.sharder, int(section(params, "evaluate.seed")))}
    except DreamShardError as exc:
        print(f"decoding_ab: error: {exc}", file=sys.stderr)
        return 1
    print(f"{counts['tasks']} journaled tasks: the variant kept {args.sharder}'s plan on {counts['kept']}, "
          f"picked {', '.join(f'{r} {counts.get(r, 0)}' for r in args.rivals.split(','))}; "
          f"{counts['missing']} plans not among the evaluated\n")
    print(markdown(result, args.sharder))
    if out:
        out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
