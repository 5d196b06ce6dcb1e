"""What fusing a device's shards into one operator flatters: plans measured as TorchRec's lookup groups run them.

    python -m benchmarks.lookup_groups [--families dlrm-20-4,...] [--tasks 4] [--rounds 3]
                                       [--out results/lookup-groups]

TorchRec runs one lookup group per sharding kind: a device holding whole tables, column slices and row blocks runs
three TBE operators (`backend.fbgemm.lookup_groups: kind`, the pipeline's since 2026-11-28); before, the backend
fused every pooled shard of a device into one (`device`). On the first --tasks validation tasks of each
family, `dreamshard_cut`, `size_lookup_greedy` and TorchRec's planners (as evaluate builds them, told the cluster)
plan each task; every plan is measured both ways, round by round, the two groupings alternating which goes first
(medians over --rounds). Reported per family: `dreamshard_cut` / the TorchRec peer (the better of `torchrec` and
`torchrec_full` by family mean) under each grouping, each sharder's cost measured by kind over fused, and the share
of its plans' devices holding more than one kind. CPU timings on the machine it runs on; needs `make run`'s data/
and models/. The test pool is evaluate's alone: this reads validation tasks.
Writes summary.json, tasks.csv and README.md's table (printed) to --out.
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

SHARDERS = ("dreamshard_cut", "size_lookup_greedy", "torchrec", "torchrec_full")
PEER = ("torchrec", "torchrec_full")
GROUPINGS = ("device", "kind")


def mixed_devices(task, plan) -> float:
    """The share of the plan's devices whose pooled shards span more than one sharding kind."""
    from dreamshard.project.hardware import sharding_kind

    tables = {t.name: t for t in task.tables}
    kinds = [{sharding_kind(s, tables[s.table]) for s in plan.device_shards(d) if not s.replica}
             for d in range(plan.num_devices)]
    return float(np.mean([len(k) > 1 for k in kinds]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--families", default="dlrm-20-4,dlrm-40-4,dlrm-40-8,dlrm-80-8,dlrm-80-16")
    parser.add_argument("--tasks", type=int, default=4, help="validation tasks per family")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/lookup-groups"))
    args = parser.parse_args()
    from dreamshard.project.backend import huge_pages_from_params

    huge_pages_from_params(str(args.params))  # before torch is imported
    import torch

    from dreamshard.project.backend import backend_of
    from dreamshard.project.domain import write_text
    from dreamshard.project.evaluation import bootstrap_ci, make_sharders
    from dreamshard.project.hardware import FbgemmBackend, measure_rounds, median_cost
    from dreamshard.project.params import load_params
    from dreamshard.project.tasks import read_split

    torch.set_num_threads(1)
    params = load_params(args.params)
    fused = backend_of(params)
    if not isinstance(fused, FbgemmBackend):
        raise SystemExit(f"{args.params}: backend.name: lookup groups are the fbgemm backend's; got {fused.name!r}")
    backends = {"device": FbgemmBackend(fused.lookups, replace(fused.config, lookup_groups="device")),
                "kind": FbgemmBackend(fused.lookups, replace(fused.config, lookup_groups="kind"))}
    sharders = make_sharders(params, int(params["backend"]["batch_size"]), names=list(SHARDERS))
    tasks = read_split(params, "validation")
    rows = []
    for family in args.families.split(","):
        for task in [t for t in tasks if t.family == family][:args.tasks]:
            plans, planning = [], {}
            for sharder in sharders:
                start = time.perf_counter()
                plans.append(sharder.shard(task))
                planning[sharder.name] = (time.perf_counter() - start) * 1e3
            readings: dict[str, list[list[float]]] = {g: [] for g in GROUPINGS}
            for r in range(args.rounds):  # the two groupings alternate which goes first
                for g in (GROUPINGS if r % 2 == 0 else GROUPINGS[::-1]):
                    readings[g].append([c.cost_ms for c in measure_rounds(backends[g], task, plans, 1, median_cost)])
            for i, (sharder, plan) in enumerate(zip(sharders, plans)):
                rows.append({"family": family, "task": task.name, "sharder": sharder.name,
                             **{f"cost_ms_{g}": statistics.median(x[i] for x in readings[g]) for g in GROUPINGS},
                             "mixed_devices": mixed_devices(task, plan), "planning_ms": planning[sharder.name]})
            print(task.name, " ".join(f"{r['sharder']}={r['cost_ms_device']:.3f}/{r['cost_ms_kind']:.3f}"
                                      for r in rows[-len(sharders):]), flush=True)
    df = pd.DataFrame(rows)
    summary: dict = {"device": fused.device_name(), "versions": fused.versions(), "rounds": args.rounds,
                     "split": "validation", "tasks_per_family": args.tasks, "families": {}}
    lines = ["| family | `dreamshard_cut` / peer, fused | by kind | peer fused / by kind | by kind / fused: "
             + ", ".join(f"`{s}`" for s in SHARDERS) + " | devices with 2+ kinds: `dreamshard_cut`, `torchrec_full` |",
             "|---|---:|---:|---|---|---|"]
    for family, g in df.groupby("family", sort=False):
        entry: dict = {}
        for grouping in GROUPINGS:
            cost = g.pivot(index="task", columns="sharder", values=f"cost_ms_{grouping}")
            peer = min(PEER, key=lambda p: cost[p].mean())
            ratios = (cost["dreamshard_cut"] / cost[peer]).to_numpy()
            low, high = bootstrap_ci(ratios, seed=0)
            entry[grouping] = {"peer": peer, "dreamshard_cut_vs_peer": {"mean_ratio": float(ratios.mean()),
                                                                        "ci_low": low, "ci_high": high}}
        kind_over_fused = {s: float((g[g.sharder == s].cost_ms_kind / g[g.sharder == s].cost_ms_device).mean())
                           for s in SHARDERS}
        mixed = {s: float(g[g.sharder == s].mixed_devices.mean()) for s in SHARDERS}
        entry.update({"kind_over_fused": kind_over_fused, "mixed_devices": mixed})
        summary["families"][family] = entry
        f = lambda r: f"{r['mean_ratio']:.3f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"  # noqa: E731
        lines.append(f"| {family} | {f(entry['device']['dreamshard_cut_vs_peer'])} | "
                     f"{f(entry['kind']['dreamshard_cut_vs_peer'])} | `{entry['device']['peer']}` / "
                     f"`{entry['kind']['peer']}` | " + ", ".join(f"{kind_over_fused[s]:.3f}" for s in SHARDERS)
                     + f" | {mixed['dreamshard_cut']:.0%}, {mixed['torchrec_full']:.0%} |")
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(json.dumps(summary, indent=2) + "\n", args.out / "summary.json")
    write_text(df.to_csv(index=False), args.out / "tasks.csv")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
