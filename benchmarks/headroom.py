"""How much faster than the TorchRec peer can a plan be? The room issue 50's bar asks for, on validation tasks.

    python -m benchmarks.headroom [--families dlrm-20-4,...] [--tasks 3] [--budget 120] [--rounds 5]
                                  [--holdout heavy,wide [--seed 1]] [--out results/headroom]

On the first --tasks validation tasks of each family (the validation pool's tables: no model learned from them;
the test pool is evaluate's alone), every sharder of params `evaluate.sharders` plans as evaluate builds it
(TorchRec's planners told the cluster), each plan is measured in --rounds interleaved rounds, and the measured
search of `best_known` (dreamshard.evaluation.improve, the pipeline's backend) starts from all of them with
--budget measurements. Then every plan and the one found are measured again side by side, --rounds fresh
rounds (best_known_check): only those medians are compared. The search is local and its budget finite, so the
plan it finds bounds the best plan from above: "best found / peer" is how much room at least there is.
Reported per family, over the TorchRec peer (per family the better of TorchRec's planners by mean rechecked
cost): the best plan found, `dreamshard_cut`, and the best heuristic, with 95% bootstrap intervals over tasks.
With --holdout, the tasks are instead fold_probe's (benchmarks.fold_probe.probe_tasks: the holdout families'
shapes, `heavy` on fresh tables from synthetic seed --seed, `wide` on validation-pool tables at the holdout dims),
--tasks per holdout family; a task some planner cannot place is skipped, as evaluate would not hold it.
Writes summary.json, tasks.csv and README.md to --out.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from benchmarks.run_info import commit, machine


def family_table(rows: pd.DataFrame, seed: int = 0) -> dict[str, dict]:
    """Per family: the peer (TorchRec planner of least mean rechecked cost, as evaluate picks it) and, over it per
    task, the best plan found, each sharder and the best heuristic (by family mean), with bootstrap intervals over
    tasks."""
    from dreamshard.project.evaluation import best_heuristics, bootstrap_ci, torchrec_peers

    costs = rows.rename(columns={"sharder": "algorithm", "rechecked_ms": "cost_ms"})
    peers, heuristics = torchrec_peers(costs), best_heuristics(costs)
    out = {}
    for family, part in rows.groupby("family", sort=False):
        wide = part.pivot(index="task", columns="sharder", values="rechecked_ms")
        peer = peers[family]
        entry: dict = {"peer": peer, "best_heuristic": heuristics[family], "tasks": len(wide), "over_peer": {}}
        for name in ["best found", *[c for c in wide if c != "best found"]]:
            ratios = (wide[name] / wide[peer]).to_numpy()
            low, high = bootstrap_ci(ratios, seed=seed)
            entry["over_peer"][name] = {"mean": float(ratios.mean()), "ci_low": low, "ci_high": high}
        out[str(family)] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=Path("."), help="project with data/ and models/ from make run")
    parser.add_argument("--families", default="dlrm-20-4,dlrm-40-4,dlrm-40-8,dlrm-80-8,dlrm-80-16")
    parser.add_argument("--tasks", type=int, default=3, help="validation tasks per family (the first ones)")
    parser.add_argument("--budget", type=int, default=120, help="measurements of the search per task")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds: the plans, the search, the recheck")
    parser.add_argument("--min-gain", type=float, default=0.03, help="the search's min_gain (params best_known's)")
    parser.add_argument("--holdout", default=None, help="kinds of fold_probe's tasks (heavy,wide) instead of --families")
    parser.add_argument("--seed", type=int, default=1, help="with --holdout: synthetic seed of the fresh heavy tables")
    parser.add_argument("--out", type=Path, default=Path("results/headroom"))
    args = parser.parse_args()
    from dreamshard.project.backend import huge_pages_from_params

    huge_pages_from_params(str(args.root / "params.yaml"))  # before torch is imported

    import torch

    from benchmarks.cut_designs import project_at
    from benchmarks.fold_probe import probe_tasks
    from dreamshard.project.backend import backend_of, recorded_lookups
    from dreamshard.project.data import RecordedLookups
    from dreamshard.project.domain import InfeasibleTaskError
    from dreamshard.project.evaluation import ImproveConfig, best_known_check, make_sharders
    from dreamshard.project.hardware import measure_rounds, median_cost
    from dreamshard.project.tasks import read_split

    torch.set_num_threads(1)
    started, code = time.time(), commit()  # the code that runs: read before any later edit of the checkout
    params, _, _ = project_at(args.root)
    sharders = make_sharders(params, int(params["backend"]["batch_size"]))
    if args.holdout:
        tasks, requests = probe_tasks(params, args.seed, args.tasks, tuple(args.holdout.split(",")))
        backend = backend_of(params, RecordedLookups({**recorded_lookups(params).by_name, **requests}))
        names = list(dict.fromkeys(t.family for t in tasks))
    else:
        tasks, names = read_split(params, "validation"), args.families.split(",")
        backend = backend_of(params)
    config = ImproveConfig(budget=args.budget, rounds=args.rounds, min_gain=args.min_gain,
                           seed=int(params["evaluate"]["seed"]))
    rows, skipped = [], []
    for family in names:
        for task in [t for t in tasks if t.family == family][:args.tasks]:
            try:
                plans = [s.shard(task) for s in sharders]
            except InfeasibleTaskError as exc:
                skipped.append({"task": task.name, "why": str(exc)[:200]})
                print(f"{task.name}: skipped: {str(exc)[:120]}", flush=True)
                continue
            costs = measure_rounds(backend, task, plans, args.rounds, median_cost)
            evaluated = pd.DataFrame({"task": task.name, "algorithm": [s.name for s in sharders],
                                      "shards": [json.dumps(p.to_dict()["shards"]) for p in plans],
                                      "cost_ms": [c.cost_ms for c in costs]})
            found = best_known_check(backend, [task], evaluated, config)[0]
            for name in [*found["rechecked_ms"], "best found"]:
                rows.append({"family": family, "task": task.name, "sharder": name,
                             "evaluated_ms": found["evaluated_ms"].get(name, found["search_best_ms"]),
                             "rechecked_ms": found["rechecked_ms"].get(name, found["search_best_rechecked_ms"]),
                             "measurements": found["measurements"]})
            print(task.name, f"search {found['search_best_ms']:.3f} -> rechecked "
                  f"{found['search_best_rechecked_ms']:.3f}; best sharder {found['best_sharder_ms']:.3f}", flush=True)
    frame = pd.DataFrame(rows)
    families = family_table(frame)
    which = f"--holdout {args.holdout} --seed {args.seed}" if args.holdout else f"--families {args.families}"
    summary = {"command": f"python -m benchmarks.headroom {which} --tasks {args.tasks} "
                          f"--budget {args.budget} --rounds {args.rounds} --min-gain {args.min_gain}",
               "commit": code, "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "device": backend.device_name(), "versions": backend.versions(),
               "split": f"fold_probe's {args.holdout} tasks" if args.holdout else "validation", "skipped": skipped,
               "seconds": round(time.time() - started), "families": families}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    frame.to_csv(args.out / "tasks.csv", index=False)
    lines = ["| family | peer | tasks | best found / peer | dreamshard_cut / peer | best heuristic / peer |",
             "|---|---|---:|---:|---:|---:|"]
    for family, e in families.items():
        cell = [e["over_peer"][n] for n in ("best found", "dreamshard_cut", e["best_heuristic"])]
        lines.append(f"| {family} | {e['peer']} | {e['tasks']} | " + " | ".join(
            f"{c['mean']:.3f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]" for c in cell) + " |")
    print("\n".join(lines))
    print(json.dumps({k: summary[k] for k in ("command", "commit", "machine", "date", "seconds")}))


if __name__ == "__main__":
    main()
