"""How the learned sharders plan tables beyond their training range, on tables no stage reads: with pieces beyond
the range folded into in-range ones (FeatureScaler.fold) or not, and with or without the analytic fallback.

    python -m benchmarks.fold_probe [--tasks 4] [--rounds 3] [--seed 1] [--kinds heavy,wide] [--out DIR]

`heavy`: tables pooled beyond the training range, generated afresh as `data.synthetic` generates its heavy tail but
from synthetic seed --seed (not the pipeline's: none of these tables is in any pool, the holdout's included).
`wide`: validation-pool tables at `tasks.holdout.dims`. Each kind's tasks take the shape of its holdout families
in params.yaml (tables, devices, memory: tight and ample). Each task is planned by the learned sharders as evaluate
builds them (dims folded), folding nothing (`@unfolded`), folding pooling too (`@pooling`) and with no fallback
(`@nofallback`: the learned plan the fallback judges), and by TorchRec's planners (`torchrec_full`, the fallback's
own planner), `torchrec_model` and the best-known heuristic. Every distinct plan is measured (--rounds interleaved
rounds, per-device medians, as evaluate does) and rated by the cost network and NeuroShard's models in the same
three settings; the fallback's decisions are kept. Reported per family: Kendall tau of each rating against the
measurements (mean over tasks), and each plan's measured cost over TorchRec's planners'. CPU timings of this
machine. Writes summary.json to --out. Needs `make run`'s data/ and models/.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

LEARNED = ("dreamshard_cut", "dreamshard", "neuroshard")
OTHERS = ("size_lookup_greedy", "torchrec", "torchrec_full", "torchrec_model")
PEERS = ("torchrec", "torchrec_full")


def fresh_heavy_tables(params: dict, seed: int, count: int) -> tuple[list, dict]:
    """`count` tables pooled as data.synthetic's heavy tail, from synthetic seed `seed`, and their recorded lookups."""
    from dreamshard.project.data import (
        SyntheticConfig,
        TableRequests,
        generate_lookups,
        sample_table_profiles,
        table_seed,
        table_statistics,
    )
    from dreamshard.project.domain import Table
    from dreamshard.project.params import build, section

    cfg = replace(build(SyntheticConfig, section(params, "data.synthetic"), "data.synthetic"),
                  num_tables=0, heavy_tables=count, seed=seed)
    if seed == int(section(params, "data.synthetic.seed")):
        raise SystemExit(f"--seed {seed}: the pipeline's own synthetic seed; pick another (its tables are the holdout)")
    keep = int(section(params, "process.sample_batch"))
    tables, requests = [], {}
    for i, profile in enumerate(sample_table_profiles(cfg)):
        indices, lengths = generate_lookups(profile, cfg.batch_size, table_seed(seed, f"h{i}"))
        stats = table_statistics(indices, lengths)
        name = f"probe_s{seed}/h{i:04d}"
        tables.append(Table(name, stats.rows, 4, stats.pooling_factor, bins=tuple(stats.bins)))
        requests[name] = TableRequests(indices[:int(lengths[:keep].sum())], lengths[:keep])
    return tables, requests


def draw(tables: list, family, dims, count: int, seed: int, memory) -> list:
    """`count` tasks of `family`'s shape from `tables` at random `dims`, disjoint tables where the pool allows."""
    from dreamshard.project.domain import InfeasibleTaskError, Task
    from dreamshard.project.sharders import make_sharder

    rng = np.random.default_rng([seed, len(family.name)])
    n = family.num_tables
    order = list(rng.permutation(len(tables)))
    greedy = make_sharder("size_greedy")
    out: list = []
    while len(out) < count:  # the next n tables of the shuffled pool at random dims, drawn again where they cannot fit
        if len(order) < n:
            raise SystemExit(f"{family.name}: {len(out)} of {count} tasks drawn before the pool ran out")
        ids, order = order[:n], order[n:]
        chosen = [replace(tables[i], dim=int(d)) for i, d in zip(ids, rng.choice(dims, size=n))]
        task = Task.uniform(f"probe/{family.name}/{len(out):04d}", chosen, family.num_devices, family.memory_gb,
                            memory, family.name)
        try:
            greedy.shard(task)
        except InfeasibleTaskError:
            continue
        out.append(task)
    return out


def probe_tasks(params: dict, seed: int, count: int, kinds=("heavy", "wide"), heavy_tables: int = 120
                ) -> tuple[list, dict]:
    """A pass's tasks (`count` per holdout family of `kinds`, drawn from `seed`) and the fresh heavy tables' lookups:
    `heavy` from fresh_heavy_tables, `wide` from the validation pool at `tasks.holdout.dims`."""
    from dreamshard.project.domain import MemoryModel
    from dreamshard.project.params import build, section
    from dreamshard.project.tasks import read_split, task_families

    memory = build(MemoryModel, section(params, "memory"), "memory")
    tasks: list = []
    requests: dict = {}
    if "heavy" in kinds:
        heavy, requests = fresh_heavy_tables(params, seed, heavy_tables)
        for f in (f for f in task_families(params) if f.holdout == "pooling"):
            tasks += draw(heavy, f, section(params, "tasks.dims"), count, seed, memory)
    if "wide" in kinds:
        pool = list({t.name: t for task in read_split(params, "validation") for t in task.tables}.values())
        for f in (f for f in task_families(params) if f.holdout == "dims"):
            tasks += draw(pool, f, section(params, "tasks.holdout.dims"), count, seed, memory)
    return tasks, requests


def refolded(sharder, folds: tuple[str, ...]):
    """A copy of a learned sharder whose model folds `folds` (the loaded model shared, not changed)."""
    return replace(sharder, model=replace(sharder.model, scaler=replace(sharder.model.scaler, folds=folds)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=Path("."), help="project with data/ and models/ from make run")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per family")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1, help="synthetic seed of the fresh heavy tables")
    parser.add_argument("--heavy-tables", type=int, default=120)
    parser.add_argument("--kinds", default="heavy,wide")
    parser.add_argument("--out", type=Path, default=Path("results/holdout/fold-probe"))
    args = parser.parse_args()
    from dreamshard.project.backend import huge_pages_from_params

    huge_pages_from_params(str(args.root / "params.yaml"))  # before torch is imported

    import torch

    from benchmarks.cut_designs import project_at
    from dreamshard.project.backend import backend_of, recorded_lookups
    from dreamshard.project.data import RecordedLookups
    from dreamshard.project.domain import InfeasibleTaskError, write_text
    from dreamshard.project.evaluation import make_sharders, model_paths_of
    from dreamshard.project.hardware import measure_rounds, median_cost
    from dreamshard.project.learning import FOLDABLE, FOLDED, NetworkEstimate, kendall_tau
    from dreamshard.project.sharders import load_model

    torch.set_num_threads(1)
    params, _, _ = project_at(args.root)
    batch = int(params["backend"]["batch_size"])
    tasks, requests = probe_tasks(params, args.seed, args.tasks, args.kinds.split(","), args.heavy_tables)
    backend = backend_of(params, RecordedLookups({**recorded_lookups(params).by_name, **requests}))
    # as evaluate builds them (dims folded), folding nothing, folding pooling too, and with no fallback
    built = make_sharders(params, batch, names=[*LEARNED, *OTHERS])
    learned = [s for s in built if s.name in LEARNED]
    sets = {"": built, "@unfolded": [refolded(s, ()) for s in learned],
            "@pooling": [refolded(s, FOLDABLE) for s in learned],
            "@nofallback": [replace(s, fallback=None) for s in learned]}
    paths = model_paths_of(params)
    ds, ns = load_model("dreamshard", paths["dreamshard"]), load_model("neuroshard", paths["neuroshard"])
    raters = {f"{name}{suffix}": model for suffix, folds in (("", FOLDED), ("@unfolded", ()), ("@pooling", FOLDABLE))
              for name, model in (("cost_network", NetworkEstimate(ds.cost_net, replace(ds.scaler, folds=folds))),
                                  ("neuroshard", replace(ns, scaler=replace(ns.scaler, folds=folds))))}

    rows, skipped = [], []
    for task in tasks:
        try:
            named = [(s.name + suffix, s.shard(task)) for suffix, group in sets.items() for s in group]
            decisions = {s.name + suffix: s.last_decision.to_dict() for suffix, group in sets.items() for s in group
                         if getattr(s, "last_decision", None) is not None}
        except InfeasibleTaskError as exc:  # as evaluate would not hold it: a task some planner cannot place
            skipped.append({"task": task.name, "why": str(exc)[:200]})
            print(f"{task.name}: skipped: {exc}", flush=True)
            continue
        key_of = {name: json.dumps(plan.to_dict(), sort_keys=True) for name, plan in named}
        unique = {key_of[name]: plan for name, plan in named}  # each distinct plan once, in first-seen order
        keys = list(unique)
        readings = measure_rounds(backend, task, [unique[k] for k in keys], args.rounds, list)
        measured = {k: median_cost(r).cost_ms for k, r in zip(keys, readings)}
        rated = {m: [est.plan_cost(task, unique[k]).cost_ms for k in keys] for m, est in raters.items()}
        row = {"task": task.name, "family": task.family,
               "cost_ms": {name: measured[key_of[name]] for name, _ in named},
               "tau": {m: kendall_tau(np.array(v), np.array([measured[k] for k in keys])) for m, v in rated.items()},
               "decisions": decisions, "plans": [unique[k].to_dict() for k in keys], "measured_ms": [measured[k] for k in keys]}
        rows.append(row)
        print(task.name, {k: round(v, 2) for k, v in row["cost_ms"].items()},
              {k: round(v, 2) for k, v in row["tau"].items()}, flush=True)

    families = sorted({r["family"] for r in rows})
    summary: dict = {"device": backend.device_name(), "versions": backend.versions(), "tasks_per_family": args.tasks,
                     "rounds": args.rounds, "seed": args.seed, "families": {}, "tasks": rows, "skipped": skipped}
    for f in families:
        of = [r for r in rows if r["family"] == f]
        entry: dict = {"tau": {m: float(np.mean([r["tau"][m] for r in of])) for m in of[0]["tau"]}, "ratios": {}}
        for name in of[0]["cost_ms"]:
            for peer in PEERS:
                entry["ratios"][f"{name} / {peer}"] = float(np.mean([r["cost_ms"][name] / r["cost_ms"][peer]
                                                                     for r in of]))
        summary["families"][f] = entry
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(json.dumps(summary, separators=(",", ":")) + "\n", args.out / "summary.json")
    for f, e in summary["families"].items():
        print(f, json.dumps({k: round(v, 3) for k, v in e["tau"].items()}))
        for k, v in e["ratios"].items():
            print(f"   {k}: {v:.3f}")


if __name__ == "__main__":
    main()
