"""Which `cut_search.cut_gain` (dreamshard/sharders/cuts.py) to keep: plans with cuts that the cost network rates
only a little cheaper than the best plan of whole tables, measured against that plan. Any other settings of the
search the same way (`--variant`).

    python -m experiments.cut_gain [--root .] [--gains 0,0.01,0.02,0.03,0.05] [--rounds 3] [--out DIR]
    python -m experiments.cut_gain --variant 'off={"must_cut_share": 0}' --variant 'on={"must_cut_share": 1}' \
        [--splits train,validation] [--root .] [--out DIR]

Tasks never reported (`--splits`, default train,validation): the training tasks the evaluate stage does not
report (it reports the first `evaluate.train_tasks_per_family` of each family) and the tasks stage's validation
tasks (the validation pool's tables). The test pool is evaluate's alone (docs/tasks.md).
Each task is planned by `dreamshard_cut` with the project's `cut_search` at every gain (or with every
`--variant`: CutConfig fields over the project's, the first the reference); where the plans differ, the distinct
plans are measured in one interleaved pass (`measure_rounds`, `rounds` rounds, medians) on the project's
backend. Reported per setting: the tasks whose plan it changes from the first setting's, and each changed plan's
measured cost over that plan's. Writes rows.jsonl (one row per task, as measured) and README.md to --out.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=Path("."), help="project with data/ and models/ from make run")
    parser.add_argument("--gains", default="0,0.01,0.02,0.03,0.05", help="comma-separated; the first is the reference")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                        help='CutConfig fields over the project\'s, e.g. \'on={"must_cut_share": 1}\' (repeatable; the '
                             'first is the reference; instead of --gains)')
    parser.add_argument("--splits", default="train,validation", help="comma-separated: train, validation")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/cut_designs/cut-gain"))
    args = parser.parse_args()
    from benchmarks.cut_designs import parse_variants, project_at, validation_tasks

    if args.variant:
        settings = parse_variants(args.variant)
    else:
        settings = {f"{float(g):g}": {"cut_gain": float(g)} for g in args.gains.split(",")}
    if len(settings) < 2:
        parser.error("expected at least two gains or variants, the first the reference")
    splits = set(args.splits.split(","))
    if not splits <= {"train", "validation"}:
        parser.error(f"--splits: expected train or validation, got {args.splits}")
    names = list(settings)

    from dreamshard.project.backend import huge_pages_from_params

    huge_pages_from_params(str(args.root / "params.yaml"))  # before torch is imported

    import torch

    from dreamshard.project.backend import backend_of
    from dreamshard.project.evaluation import reported_train_tasks
    from dreamshard.project.hardware import measure_rounds, median_cost
    from dreamshard.project.sharders import make_sharder
    from dreamshard.project.tasks import read_split

    torch.set_num_threads(1)
    params, model, base = project_at(args.root)
    sharders = [make_sharder("dreamshard_cut", model=model, cuts=replace(base, **settings[n])) for n in names]
    tasks = []
    if "train" in splits:  # the training tasks the evaluate stage does not report
        reported = {t.name for t in reported_train_tasks(params)}
        tasks += [("train", t) for t in read_split(params, "train") if t.name not in reported]
    if "validation" in splits:
        tasks += [("validation", t) for t in validation_tasks(params)]
    backend = backend_of(params)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(args.out / "rows.jsonl", "w") as fh:
        for split, task in tasks:
            plans = [s.shard(task) for s in sharders]
            keys = [p.key() for p in plans]
            distinct = list(dict.fromkeys(keys))
            row = {"split": split, "family": task.family, "task": task.name,
                   "settings": names, "plan_of_gain": [distinct.index(k) for k in keys]}
            if len(distinct) > 1:
                costs = measure_rounds(backend, task, [plans[keys.index(k)] for k in distinct], args.rounds,
                                       median_cost)
                row["cost_ms"] = [c.cost_ms for c in costs]
                print(split, task.name, row["plan_of_gain"], [round(c.cost_ms, 4) for c in costs], flush=True)
            rows.append(row)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
    command = " ".join(f"--variant '{v}'" for v in args.variant) if args.variant else f"--gains {args.gains}"
    lines = ["# `dreamshard_cut`'s settings: the plans they change, measured\n",
             f"{backend.device_name()}; {backend.versions()}; {sum(s == 'train' for s, _ in tasks)} training tasks "
             f"(those evaluate does not report) and {sum(s == 'validation' for s, _ in tasks)} validation tasks; "
             f"{args.rounds} interleaved rounds (medians). Command:\n",
             f"    python -m experiments.cut_gain {command} --splits {args.splits} --rounds {args.rounds} "
             f"--out {args.out}\n",
             f"| setting | tasks whose plan it changes (of {len(rows)}) | measured cost / cost at {names[0]}, "
             "each changed task | mean | cheaper |", "|---|---:|---|---:|---:|"]
    for i, g in enumerate(names[1:], 1):
        changed = [r for r in rows if r["plan_of_gain"][i] != 0]
        ratios = [r["cost_ms"][r["plan_of_gain"][i]] / r["cost_ms"][0] for r in changed]
        mean = f"{sum(ratios) / len(ratios):.3f}" if ratios else "-"
        lines.append(f"| {g} | {len(changed)} | {', '.join(f'{x:.3f}' for x in ratios) or '-'} | {mean} | "
                     f"{sum(x < 1 for x in ratios)} |")
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
