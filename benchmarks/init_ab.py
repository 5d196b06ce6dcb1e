"""Does the way the fbgemm backend initialises weights change what it measures? An A/B benchmark.

    python -m benchmarks.init_ab [--devices 8] [--tables 80] [--repeats 8]

The backend fills each operator's weights with a seeded block of uniform values repeated over the
table (dreamshard.hardware.fbgemm.fill_tiled): drawing every weight from the generator took a third of
a measurement's wall time. The kernels' work (lookups, pooling, the SGD update) does not depend on
the values, so both ways should time alike. This measures it: one plan of N tables (reference-like
tables, benchmarks/cpu_kernels.py) on D devices, measured R times with each initialisation,
interleaved (A B, B A, ...), on FBGEMM's CPU kernels with 1 thread; prints both medians, their ratio
with a 95% bootstrap interval over the paired repeats, and the wall time per measurement. CPU figures,
labelled with the CPU's name.
"""
from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import numpy as np

from benchmarks.cpu_kernels import reference_tables
from dreamshard.data.lookups import GeneratedLookups
from dreamshard.evaluation.summary import bootstrap_ci
from dreamshard.hardware import fbgemm
from dreamshard.hardware.fbgemm import FbgemmBackend, FbgemmConfig, pin_threads
from dreamshard.sharders import make_sharder
from dreamshard.tasks import Task


def draw_every_weight(weights, block) -> None:
    """The former initialisation: every weight drawn from a seeded generator."""
    import torch

    weights.uniform_(-fbgemm.INIT_RANGE, fbgemm.INIT_RANGE, generator=torch.Generator().manual_seed(0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--tables", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=2048)
    args = parser.parse_args(argv)
    backend = FbgemmBackend(GeneratedLookups(seed=0), FbgemmConfig(batch_size=args.batch_size, warmup=3, iterations=10))
    pin_threads(backend)
    task = Task.uniform("init-ab", reference_tables(args.tables), args.devices, 64.0)
    plan = make_sharder("size_lookup_greedy").shard(task)
    costs: dict[str, list[float]] = {"tiled": [], "drawn": []}
    wall: dict[str, list[float]] = {"tiled": [], "drawn": []}
    for r in range(args.repeats):
        for mode in (("tiled", "drawn") if r % 2 == 0 else ("drawn", "tiled")):
            start = time.perf_counter()
            if mode == "drawn":
                with mock.patch.object(fbgemm, "fill_tiled", draw_every_weight):
                    costs[mode].append(backend.plan_cost(task, plan).cost_ms)
            else:
                costs[mode].append(backend.plan_cost(task, plan).cost_ms)
            wall[mode].append(time.perf_counter() - start)
    ratios = np.array(costs["tiled"]) / np.array(costs["drawn"])
    low, high = bootstrap_ci(ratios, seed=0)
    print(f"{backend.device_name()}: {args.tables} tables on {args.devices} devices, batch {args.batch_size}, "
          f"{args.repeats} interleaved repeats (measured, CPU)")
    for mode in ("drawn", "tiled"):
        print(f"  {mode:>5}: median plan cost {statistics.median(costs[mode]):.3f} ms "
              f"(min {min(costs[mode]):.3f}, max {max(costs[mode]):.3f}); "
              f"{statistics.median(wall[mode]):.2f} s per measurement")
    print(f"  tiled / drawn, paired: mean {ratios.mean():.3f}, 95% interval [{low:.3f}, {high:.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
