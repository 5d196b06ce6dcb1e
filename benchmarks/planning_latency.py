"""Planning latency of the learned sharders on one CPU thread (median of repeats).

    python -m benchmarks.planning_latency [--repeats 5] [--out metrics/planning_latency.json]

Synthetic tasks are built from data/tables.parquet (tables repeated under new names where
more are needed) at seeded random dims, with memory that never binds; models are the
pipeline's checkpoints. Targets (issues): dreamshard 100 tables / 8 devices <= 20 ms and
1,000 tables / 64 devices <= 1 s; neuroshard 100 tables / 8 devices < 1 s; dreamshard_cut 200 tables / 8
devices <= 1 s.

The production model (dreamshard.data.examples: 26 tables of dim 128, four of 40M rows
larger than a device, no access-count bins) on 8 devices of 16 GB: every heuristic and
DreamShard <= 1 s, NeuroShard <= 10 s (learned sharders estimate the bins with their
model's estimator, inside the timed call); NeuroShard on 856 synthetic tables / 64 devices
<= 60 s. Times include cutting the big tables (dreamshard.sharders.pieces).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dreamshard.project.data import production_model_tables
from dreamshard.project.domain import InfeasibleTaskError, Task, stats_table
from dreamshard.project.sharders import load_model, make_sharder, spec

CASES = [("dreamshard", 100, 8), ("dreamshard", 1000, 64), ("neuroshard", 100, 8), ("size_lookup_greedy", 100, 8),
         ("neuroshard", 856, 64), ("dreamshard_cut", 100, 8), ("dreamshard_cut", 200, 8), ("dreamshard_cut", 1000, 64)]
PRODUCTION = ["random", "size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy", "dreamshard",
              "dreamshard_cut", "autoshard", "neuroshard", "torchrec", "torchrec_full"]


def make_task(stats: pd.DataFrame, num_tables: int, num_devices: int, seed: int) -> Task:
    rng = np.random.default_rng(seed)
    records = stats.to_dict("records")
    tables = []
    for i in range(num_tables):
        rec = dict(records[int(rng.integers(len(records)))], name=f"t{i}")
        tables.append(stats_table(rec, int(rng.choice([4, 8, 16, 32, 64, 128]))))
    return Task.uniform(f"latency-{num_tables}-{num_devices}", tables, num_devices, 1000.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", default="data/tables.parquet")
    parser.add_argument("--models", default="models")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    stats = pd.read_parquet(args.tables)
    results = {}
    production = Task.uniform("production-26x8", production_model_tables(), 8, 16.0)
    cases = [(algo, make_task(stats, n, d, seed=0)) for algo, n, d in CASES]
    cases += [(algo, production) for algo in PRODUCTION]
    for algo, task in cases:
        checkpoint = Path(args.models) / f"{spec(algo).trained_as}.pt"
        options = {"model": load_model(algo, checkpoint)} if spec(algo).needs_model else {}
        sharder = make_sharder(algo, **options)
        n_tables, n_devices = len(task.tables), task.num_devices
        key = f"{algo}/{task.name if task is production else f'{n_tables}x{n_devices}'}"
        try:
            sharder.shard(task)  # warm-up: first-call allocations
        except InfeasibleTaskError as exc:  # table-wise TorchRec cannot place tables larger than a device
            results[key] = {"no_plan": str(exc)[:200]}
            print(f"{key:>28}: no plan ({str(exc)[:80]}...)")
            continue
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            sharder.shard(task)
            times.append((time.perf_counter() - start) * 1e3)
        results[key] = {"median_ms": statistics.median(times), "min_ms": min(times), "repeats": args.repeats}
        print(f"{key:>28}: median {statistics.median(times):8.1f} ms  (min {min(times):.1f}, 1 CPU thread)")
    if args.out:
        args.out.write_text(json.dumps({"threads": 1, "cases": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
