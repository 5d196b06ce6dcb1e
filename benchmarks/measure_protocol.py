"""How well a plan's measured cost repeats under two reductions of the same readings.

    python -m benchmarks.measure_protocol [--families dlrm-20-4,...] [--tasks 3] [--rounds 3] [--passes 3]
                                          [--split validation] [--in-time] [--out results/measure-protocol]

A plan's readings (hardware.base.measure_rounds, `rounds` interleaved rounds) reduce to one cost three ways:
`whole` takes the median of the whole-plan readings (each the max over its devices, as evaluate did up to
2026-11-29); `device` takes each device's median operator across the readings and prices the plan from them
(hardware.base.median_cost: collect's reduction, and evaluate's since); `least` each device's least
forward and backward (a contended machine only adds time). On the first --tasks validation
tasks of each family, the plans of `dreamshard_cut`, `dreamshard`, `neuroshard`, `size_lookup_greedy` and
TorchRec's planners (told the cluster, as evaluate builds them) are measured in --passes passes, one task after
another each time; both reductions read the same readings. Reported per reduction: how far a plan's cost moves
between passes (max / min over passes), how far each task's paired ratio `dreamshard_cut` / TorchRec moves, and
the family means of that ratio in each pass; with --in-time, whether rounds spread over minutes agree better
than rounds taken within seconds (`in_time`). CPU timings of the machine it runs on. Writes summary.json and
README.md to --out. Needs `make run`'s data/ and models/.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

SHARDERS = ("dreamshard_cut", "dreamshard", "neuroshard", "size_lookup_greedy", "torchrec", "torchrec_full")
PEERS = ("torchrec", "torchrec_full")


def device_least(readings) -> float:
    """The plan priced from each device's least forward and least backward across the readings: a contended
    machine only ever adds time to a reading."""
    least = [replace(readings[0].compute[d], fwd_ms=min(r.compute[d].fwd_ms for r in readings),
                     bwd_ms=min(r.compute[d].bwd_ms for r in readings)) for d in range(len(readings[0].compute))]
    return readings[0].assemble(least).cost_ms


def whole_plan_median(readings) -> float:
    """The median whole-plan reading (the lower middle one for an even count): the reduction evaluate used."""
    return sorted(r.cost.cost_ms for r in readings)[(len(readings) - 1) // 2]


def spread(values: list[float]) -> float:
    """max / min: how far repeated readings of one quantity move."""
    return max(values) / min(values)


def quantiles(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {"median": float(np.median(a)), "p90": float(np.quantile(a, 0.9)), "max": float(a.max())}


def in_time(kept: dict[tuple[str, str], list], tasks: list, passes: int) -> dict:
    """How well two estimates of a plan's cost agree when their readings were taken within seconds or over minutes.

    `kept[(task, sharder)][p]`: pass p's readings. With h = passes / 2 and h readings per estimate: `within
    seconds` compares the per-device median of pass k's first h rounds with that of pass k + h's (k < h), `over
    minutes` the per-device median of round 0 of passes 0..h-1 with that of passes h..2h-1."""
    from dreamshard.project.hardware import median_cost

    h = passes // 2
    out = {}
    for how in ("within seconds", "over minutes"):
        pairs: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for key, by_pass in kept.items():
            if how == "within seconds":
                pairs[key] = [(median_cost(by_pass[k][:h]).cost_ms, median_cost(by_pass[k + h][:h]).cost_ms)
                              for k in range(h)]
            else:
                pairs[key] = [(median_cost([by_pass[k][0] for k in range(h)]).cost_ms,
                               median_cost([by_pass[k][0] for k in range(h, 2 * h)]).cost_ms)]
        entry = {"plan": quantiles([spread([a, b]) for v in pairs.values() for a, b in v])}
        for peer in PEERS:
            moves = []
            for t in tasks:
                mine, theirs = pairs[(t.name, "dreamshard_cut")], pairs[(t.name, peer)]
                for (a, b), (c, d) in zip(mine, theirs):
                    moves.append(spread([a / c, b / d]))
            entry[peer] = quantiles(moves)
        out[how] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=Path("."), help="project with data/ and models/ from make run")
    parser.add_argument("--families", default="dlrm-20-4,dlrm-40-4,dlrm-40-8,dlrm-80-8,dlrm-80-16")
    parser.add_argument("--split", default="validation", choices=("validation", "train"),
                        help="the test pool is evaluate's alone")
    parser.add_argument("--tasks", type=int, default=3, help="tasks per family")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--in-time", action="store_true",
                        help="also compare rounds taken within seconds (one pass) with rounds spread over minutes "
                             "(one round of each of several passes); needs an even --passes and --rounds >= "
                             "--passes / 2")
    parser.add_argument("--out", type=Path, default=Path("results/measure-protocol"))
    args = parser.parse_args()
    if args.in_time and (args.passes % 2 or args.rounds < args.passes // 2):
        parser.error(f"--in-time needs an even --passes and --rounds >= passes / 2, got {args.passes} and {args.rounds}")
    from dreamshard.project.backend import huge_pages_from_params

    huge_pages_from_params(str(args.root / "params.yaml"))  # before torch is imported

    import torch

    from benchmarks.cut_designs import project_at
    from dreamshard.project.backend import backend_of
    from dreamshard.project.domain import write_text
    from dreamshard.project.evaluation import make_sharders
    from dreamshard.project.hardware import measure_rounds, median_cost
    from dreamshard.project.tasks import read_split

    torch.set_num_threads(1)
    params, _, _ = project_at(args.root)
    sharders = make_sharders(params, int(params["backend"]["batch_size"]), names=list(SHARDERS))
    backend = backend_of(params)
    tasks = [t for f in args.families.split(",") for t in [t for t in read_split(params, args.split)
                                                            if t.family == f][:args.tasks]]
    planned = [(task, [s.shard(task) for s in sharders]) for task in tasks]
    names = [s.name for s in sharders]
    # cost[reduction][(task, sharder)] = one cost per pass
    cost: dict[str, dict[tuple[str, str], list[float]]] = {"whole": {}, "device": {}, "least": {}}
    kept: dict[tuple[str, str], list] = {}  # every pass's readings, for --in-time
    for p in range(args.passes):
        for task, plans in planned:
            for name, readings in zip(names, measure_rounds(backend, task, plans, args.rounds, list)):
                cost["whole"].setdefault((task.name, name), []).append(whole_plan_median(readings))
                cost["device"].setdefault((task.name, name), []).append(median_cost(readings).cost_ms)
                cost["least"].setdefault((task.name, name), []).append(device_least(readings))
                kept.setdefault((task.name, name), []).append(readings)
            print(f"pass {p + 1}/{args.passes} {task.name}", flush=True)

    summary: dict = {"device": backend.device_name(), "versions": backend.versions(), "split": args.split,
                     "families": args.families.split(","), "tasks_per_family": args.tasks, "rounds": args.rounds,
                     "passes": args.passes, "reductions": {}}
    for reduction, of in cost.items():
        entry: dict = {"plan_spread": quantiles([spread(v) for v in of.values()]),
                       "device_over_whole": None, "pairs": {}}
        for peer in PEERS:
            ratios = {t.name: [a / b for a, b in zip(of[(t.name, "dreamshard_cut")], of[(t.name, peer)])]
                      for t in tasks}
            entry["pairs"][peer] = {
                "ratio_spread": quantiles([spread(v) for v in ratios.values()]),
                "family_means_by_pass": {f: [float(np.mean([ratios[t.name][p] for t in tasks if t.family == f]))
                                             for p in range(args.passes)] for f in summary["families"]}}
        summary["reductions"][reduction] = entry
    summary["reductions"]["device"]["device_over_whole"] = quantiles(
        [d / w for k in cost["device"] for d, w in zip(cost["device"][k], cost["whole"][k])])
    if args.in_time:
        summary["in_time"] = in_time(kept, tasks, args.passes)

    args.out.mkdir(parents=True, exist_ok=True)
    write_text(json.dumps(summary, separators=(",", ":")) + "\n", args.out / "summary.json")
    r = summary["reductions"]
    lines = ["# How well a measured plan cost repeats: whole-plan medians, per-device medians, per-device least\n",
             f"{backend.device_name()}; {summary['versions']}; {args.tasks} {args.split} tasks per family of "
             f"{', '.join(summary['families'])}; {len(names)} sharders' plans; {args.rounds} interleaved rounds; "
             f"{args.passes} passes. Command:\n",
             f"    python -m benchmarks.measure_protocol --split {args.split} --families {args.families} "
             f"--tasks {args.tasks} --rounds {args.rounds} --passes {args.passes} --out {args.out}\n",
             "| reduction | plan cost max/min over passes: median | p90 | max | `dreamshard_cut` / `torchrec` "
             "max/min: median | p90 | max | / `torchrec_full`: median | p90 | max |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for reduction, e in r.items():
        cells = [e["plan_spread"], e["pairs"]["torchrec"]["ratio_spread"], e["pairs"]["torchrec_full"]["ratio_spread"]]
        lines.append(f"| {reduction} | " + " | ".join(f"{q[k]:.3f}" for q in cells for k in ("median", "p90", "max"))
                     + " |")
    d = r["device"]["device_over_whole"]
    lines += ["", f"Per-device medians over whole-plan medians, plan by plan and pass by pass: median {d['median']:.3f}, "
              f"p90 {d['p90']:.3f}, max {d['max']:.3f}.", "",
              "Family means of `dreamshard_cut` / peer in each pass:", "",
              "| reduction | peer | family | " + " | ".join(f"pass {p + 1}" for p in range(args.passes)) + " |",
              "|---|---|---|" + "---:|" * args.passes]
    for reduction, e in r.items():
        for peer, pe in e["pairs"].items():
            for f, means in pe["family_means_by_pass"].items():
                lines.append(f"| {reduction} | {peer} | {f} | " + " | ".join(f"{m:.3f}" for m in means) + " |")
    if args.in_time:
        lines += ["", "Two estimates of each plan's cost from equally many readings, per-device medians, taken in two "
                  "halves of the passes: `within seconds` the rounds of one pass (pass k and pass k + passes/2), `over "
                  "minutes` the first round of each pass of a half. Max / min between the two estimates:", "",
                  "| readings taken | plan cost: median | p90 | max | `dreamshard_cut` / `torchrec`: median | p90 | "
                  "max | / `torchrec_full`: median | p90 | max |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for how, e in summary["in_time"].items():
            cells = [e["plan"], e["torchrec"], e["torchrec_full"]]
            lines.append(f"| {how} | " + " | ".join(f"{q[k]:.3f}" for q in cells for k in ("median", "p90", "max"))
                         + " |")
    write_text("\n".join(lines) + "\n", args.out / "README.md")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
