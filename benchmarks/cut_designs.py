"""Designs of the learned planner that cuts tables (issue 37), measured against TorchRec's full planner.

    python -m benchmarks.cut_designs [--families dlrm-20-4,...] [--tasks 4] [--rounds 3]
                                     [--out results/cut_designs]

Each variant is `dreamshard_cut` (dreamshard/sharders/cuts.py) with some of its search turned off, planned
with the pipeline's dreamshard checkpoint; beside them table-wise `dreamshard`, `neuroshard`,
`size_lookup_greedy`, `lookup_greedy` and `torchrec_full`. On the first --tasks validation tasks of each family,
every plan of a task is measured in one interleaved pass (hardware.base.measure_rounds, --rounds rounds,
medians), with the pipeline's backend (params.yaml `backend`): CPU timings on the machine it runs on.
Reported per variant: the mean of the paired ratios to torchrec_full with a 95% bootstrap interval over
tasks, overall and per family, the tasks it cut tables in, and its median planning time. Needs `make run`'s
data/ and models/ (or --root of a project that has them). --split validation (the default) measures the tasks
stage's validation tasks (the validation pool's tables: no model learned from them), --split train training
tasks; the test pool is evaluate's alone (docs/tasks.md).
Writes summary.json, README.md and tasks.csv (every task's cost per sharder, for pooling passes) to --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

# variant -> CutConfig fields changed from params.yaml's cut_search
VARIANTS: dict[str, dict] = {
    "columns only, no escapes": {"row_wise": False, "escapes": 0},
    "columns and rows, no escapes": {"escapes": 0},
    "columns and rows, escapes (params)": {},
    "wider: candidates 6, escapes 6": {"candidates": 6, "escapes": 6},
}


PEER = ("torchrec", "torchrec_full")  # with --peer: TorchRec's planners, told the cluster (evaluate's peer)


def parse_variants(items: list[str]) -> dict[str, dict]:
    """NAME=JSON items (`--variant`) -> {name: CutConfig fields changed from params.yaml's cut_search}."""
    variants = {}
    for item in items:
        name, _, fields = item.partition("=")
        variants[name] = json.loads(fields)
    return variants


def validation_tasks(params: dict) -> list:
    """The tasks stage's validation tasks (paths.tasks/validation.parquet): drawn as the test tasks are, from the
    validation pool of tables, which no model learned from and evaluate never reports."""
    from dreamshard.project.tasks import read_split

    return read_split(params, "validation")


def project_at(root: Path) -> tuple[dict, object, object]:
    """A project's params with every path under `root`, its dreamshard checkpoint and its cut_search settings
    (call after huge_pages_from_params: this imports torch)."""
    import yaml

    from dreamshard.project.params import build
    from dreamshard.project.sharders import CutConfig, load_model

    params = yaml.safe_load((root / "params.yaml").read_text())
    params["paths"] = {k: str(root / v) if isinstance(v, str) else v for k, v in params["paths"].items()}
    return params, load_model("dreamshard", params["paths"]["dreamshard_model"]), \
        build(CutConfig, params["cut_search"], "cut_search")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=Path("."), help="project with data/ and models/ from make run")
    parser.add_argument("--families", default="dlrm-20-4,dlrm-40-4,dlrm-40-8,dlrm-80-8,dlrm-80-16")
    parser.add_argument("--first", type=int, default=0, help="skip this many tasks of each family")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                        help='a variant instead of the built-in ones, e.g. \'deeper={"depth": 48}\' (repeatable)')
    parser.add_argument("--split", default="validation", choices=("validation", "train"),
                        help="validation: the validation pool's tasks; train: training tasks (the test pool is "
                             "evaluate's alone)")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per family")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passes", type=int, default=1,
                        help="measure every task's plans this many times over, one task after another each time: a "
                             "plan's cost is the median over passes, and each pass's family means are reported")
    parser.add_argument("--peer", action="store_true",
                        help="TorchRec's planners as evaluate builds them (told the cluster), the ratio to the better "
                             "of them per family, and each variant's plan or theirs, whichever its model rates cheaper")
    parser.add_argument("--out", type=Path, default=Path("results/cut_designs"))
    args = parser.parse_args()
    from dreamshard.project.backend import huge_pages_from_params

    huge_pages_from_params(str(args.root / "params.yaml"))  # before torch is imported

    import torch

    from dreamshard.project.backend import backend_of
    from dreamshard.project.evaluation import bootstrap_ci
    from dreamshard.project.hardware import measure_rounds, median_cost
    from dreamshard.project.params import build
    from dreamshard.project.sharders import SearchConfig, load_model, make_sharder
    from dreamshard.project.tasks import read_split

    torch.set_num_threads(1)
    params, model, base = project_at(args.root)
    paths = params["paths"]
    tasks = read_split(params, args.split)
    variants = {"params": {}, **parse_variants(args.variant)} if args.variant else dict(VARIANTS)
    sharders = {name: make_sharder("dreamshard_cut", model=model, cuts=replace(base, **fields))
                for name, fields in variants.items()}
    sharders["dreamshard"] = make_sharder("dreamshard", model=model)
    sharders["neuroshard"] = make_sharder("neuroshard", model=load_model("neuroshard", paths["neuroshard_model"]),
                                          search=build(SearchConfig, params["neuroshard"], "neuroshard"))
    # the best heuristics: size_lookup_greedy on every default family, lookup_greedy on some of the paper's
    sharders["size_lookup_greedy"] = make_sharder("size_lookup_greedy")
    sharders["lookup_greedy"] = make_sharder("lookup_greedy")
    if args.peer:  # TorchRec's planners as evaluate builds them: told the cluster, the per-rank batch
        from dreamshard.project.evaluation import make_sharders

        for peer in make_sharders(params, int(params["backend"]["batch_size"]), names=list(PEER)):
            sharders[peer.name] = peer
    else:
        sharders["torchrec_full"] = make_sharder("torchrec_full", batch_size=int(params["backend"]["batch_size"]))
    backend = backend_of(params)

    planned = []  # (family, task, plans, planning ms by sharder): every task planned before anything is measured
    chosen: dict[tuple[str, str], str] = {}  # (task, rated choice) -> the sharder whose plan it keeps
    for family in args.families.split(","):
        for task in [t for t in tasks if t.family == family][args.first:args.first + args.tasks]:
            plans, planning = [], {}
            for name, sharder in sharders.items():
                start = time.perf_counter()
                plans.append(sharder.shard(task))
                planning[name] = (time.perf_counter() - start) * 1e3
            if args.peer:  # each variant's plan or TorchRec's, whichever its own cost network rates cheapest
                for name in variants:
                    options = [name, *PEER]
                    rated = {o: sharders[name].own_ms(task, plans[list(sharders).index(o)]) for o in options}
                    planning[f"{name} or TorchRec's"] = sum(planning[o] for o in options)
                    chosen[(task.name, f"{name} or TorchRec's")] = min(options, key=lambda o: (rated[o], o != name))
            planned.append((family, task, plans, planning))
    # passes[p][(task, sharder)]: each pass measures every task's plans once more, in the same order
    passes: list[dict[tuple[str, str], float]] = []
    for p in range(args.passes):
        passes.append({})
        for _, task, plans, _ in planned:
            costs = measure_rounds(backend, task, plans, args.rounds, median_cost)
            passes[p].update({(task.name, name): c.cost_ms for name, c in zip(sharders, costs)})
            print(f"pass {p + 1}/{args.passes}", task.name,
                  " ".join(f"{name}={c.cost_ms:.3f}" for name, c in zip(sharders, costs)), flush=True)
    rows = []
    for family, task, plans, planning in planned:
        for name, plan in zip(sharders, plans):
            cut = len(plan.shards) > len({s.table for s in plan.shards})
            each = [measured[(task.name, name)] for measured in passes]
            rows.append({"family": family, "task": task.name, "sharder": name, "cost_ms": statistics.median(each),
                         "cost_ms_passes": each, "planning_ms": planning[name], "cuts": cut})
        for (task_name, name), source in chosen.items():  # the measured cost of the plan each choice keeps
            if task_name == task.name:
                kept = next(r for r in rows if r["task"] == task.name and r["sharder"] == source)
                rows.append({**kept, "sharder": name, "planning_ms": planning[name], "kept": source})
    names = list(dict.fromkeys([*sharders, *(name for _, name in chosen)]))

    summary: dict = {"device": backend.device_name(), "versions": backend.versions(), "rounds": args.rounds,
                     "passes": args.passes,
                     "split": args.split,
                     "tasks_per_family": args.tasks, "first": args.first, "families": args.families.split(","), "sharders": {}}
    reference = {(r["family"], r["task"]): r["cost_ms"] for r in rows if r["sharder"] == "torchrec_full"}
    reference_passes = {(r["family"], r["task"]): r["cost_ms_passes"] for r in rows if r["sharder"] == "torchrec_full"}
    for name in names:
        mine = [r for r in rows if r["sharder"] == name]
        ratios = np.array([r["cost_ms"] / reference[(r["family"], r["task"])] for r in mine])
        low, high = bootstrap_ci(ratios, seed=0)
        per_family = {}
        for f in summary["families"]:
            of_family = np.array([r["cost_ms"] / reference[(f, r["task"])] for r in mine if r["family"] == f])
            f_low, f_high = bootstrap_ci(of_family, seed=0)
            by_pass = [float(np.mean([r["cost_ms_passes"][p] / reference_passes[(f, r["task"])][p]
                                      for r in mine if r["family"] == f])) for p in range(args.passes)]
            per_family[f] = {"mean": float(of_family.mean()), "ci_low": f_low, "ci_high": f_high,
                             "passes": by_pass}
        summary["sharders"][name] = {"vs_torchrec_full": float(ratios.mean()), "ci_low": low, "ci_high": high,
                                     "per_family": per_family, "tasks_with_cuts": sum(r["cuts"] for r in mine),
                                     "tasks": len(mine),
                                     "planning_ms_p50": statistics.median(r["planning_ms"] for r in mine)}
    if args.peer:  # per family, the better of TorchRec's planners by family mean: every sharder paired with it
        summary["peer"] = {f: min(PEER, key=lambda p: summary["sharders"][p]["per_family"][f]["mean"])
                           for f in summary["families"]}
        for name in names:
            mine = [r for r in rows if r["sharder"] == name]
            peer_cost = {(r["family"], r["task"]): r["cost_ms"] for r in rows
                         if r["sharder"] == summary["peer"][r["family"]]}
            per = {}
            for f in summary["families"]:
                ratios = np.array([r["cost_ms"] / peer_cost[(f, r["task"])] for r in mine if r["family"] == f])
                f_low, f_high = bootstrap_ci(ratios, seed=0)
                per[f] = {"mean": float(ratios.mean()), "ci_low": f_low, "ci_high": f_high}
            summary["sharders"][name]["vs_torchrec_peer"] = per
            kept = [r.get("kept") for r in mine if r.get("kept")]
            if kept:
                summary["sharders"][name]["kept"] = {k: kept.count(k) for k in sorted(set(kept))}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    # every task's cost per sharder, so that passes over other tasks of a family can be pooled later
    pd.DataFrame([{k: v for k, v in r.items() if k != "cost_ms_passes"} for r in rows]).to_csv(
        args.out / "tasks.csv", index=False)
    lines = ["# Designs of the planner that cuts tables, against `torchrec_full`\n",
             f"{backend.device_name()}; {summary['versions']}; {args.tasks} {args.split} tasks per family of "
             f"{', '.join(summary['families'])}; {args.rounds} interleaved rounds (medians)"
             + (f", {args.passes} passes (medians)" if args.passes > 1 else "") + ". Command:\n",
             f"    python -m benchmarks.cut_designs --split {args.split} --families {args.families} --first {args.first} "
             f"--tasks {args.tasks} " + "".join(f"--variant '{v}' " for v in args.variant)
             + ("--peer " if args.peer else "")
             + f"--rounds {args.rounds} " + (f"--passes {args.passes} " if args.passes > 1 else "")
             + f"--out {args.out}\n",
             "| sharder | mean cost / torchrec_full [95% CI] | " + " | ".join(summary["families"])
             + " | tasks with cuts | planning p50 (ms) |",
             "|---|---|" + "---:|" * len(summary["families"]) + "---:|---:|"]
    for name, s in summary["sharders"].items():
        lines.append(f"| {name} | {s['vs_torchrec_full']:.3f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}] | "
                     + " | ".join(f"{s['per_family'][f]['mean']:.3f}" for f in summary["families"])
                     + f" | {s['tasks_with_cuts']}/{s['tasks']} | {s['planning_ms_p50']:.1f} |")
    lines += ["", "Per family, with 95% bootstrap intervals over its tasks:", "",
              "| family | " + " | ".join(summary["sharders"]) + " |", "|---|" + "---:|" * len(summary["sharders"])]
    for f in summary["families"]:
        cells = [summary["sharders"][name]["per_family"][f] for name in summary["sharders"]]
        lines.append(f"| {f} | " + " | ".join(f"{c['mean']:.3f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]"
                                             for c in cells) + " |")
    if args.peer:
        lines += ["", "Against the TorchRec peer (per family the better of " + ", ".join(PEER) + " by family mean: "
                  + ", ".join(f"{f} {p}" for f, p in summary["peer"].items()) + "), 95% intervals over tasks; "
                  "`X or TorchRec's` keeps X's plan or TorchRec's, whichever X's cost network rates cheapest:", "",
                  "| sharder | " + " | ".join(summary["families"]) + " | plans kept |",
                  "|---|" + "---:|" * len(summary["families"]) + "---|"]
        for name, s in summary["sharders"].items():
            lines.append(f"| {name} | " + " | ".join(
                f"{s['vs_torchrec_peer'][f]['mean']:.3f} [{s['vs_torchrec_peer'][f]['ci_low']:.2f}, "
                f"{s['vs_torchrec_peer'][f]['ci_high']:.2f}]" for f in summary["families"])
                + f" | {', '.join(f'{k} {n}' for k, n in s.get('kept', {}).items())} |")
    if args.passes > 1:  # the same plans measured again: how far a family's mean moves between passes
        lines += ["", "Each pass on its own (the same plans, measured again after every other task's):", "",
                  "| sharder | family | " + " | ".join(f"pass {p + 1}" for p in range(args.passes)) + " |",
                  "|---|---|" + "---:|" * args.passes]
        for name, s in summary["sharders"].items():
            if name == "torchrec_full":
                continue
            for f in summary["families"]:
                lines.append(f"| {name} | {f} | " + " | ".join(f"{x:.3f}" for x in s["per_family"][f]["passes"]) + " |")
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
