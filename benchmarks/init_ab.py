"""Does the way the fbgemm backend initialises weights change what it measures? An A/B benchmark.

    python -m benchmarks.init_ab [--devices 8] [--tables 80] [--repeats 8] [--modes drawn,tiled,zeros]

The backend fills each operator's weights with a seeded block of uniform values repeated over the
table (dreamshard.hardware.fbgemm.fill_tiled): drawing every weight from the generator took a third of
a measurement's wall time. The kernels' work (lookups, pooling, the SGD update) does not depend on
the values, so both ways should time alike. This measures it: one plan of N tables (reference-like
tables, benchmarks/cpu_kernels.py) on D devices, measured R times with each initialisation,
interleaved (A B, B A, ...), on FBGEMM's CPU kernels with 1 thread; prints both medians, their ratio
with a 95% bootstrap interval over the paired repeats, and the wall time per measurement. CPU figures,
labelled with the CPU's name; huge pages as the process's THP_MEM_ALLOC_ENABLE says. Modes: drawn (every
weight from the generator), tiled (the backend's own fill), zeros (the weights as FBGEMM's constructor
leaves them: no fill at all); the first mode named is the reference of the ratios.
"""
from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import numpy as np

from benchmarks.cpu_kernels import reference_tables
from dreamshard.allocator import huge_pages_enabled
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


def leave_zeros(weights, block) -> None:
    """No fill: the weights stay as FBGEMM's constructor wrote them (zeros)."""


FILLS = {"drawn": draw_every_weight, "zeros": leave_zeros}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--tables", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--modes", default="drawn,tiled", help="comma-separated: drawn, tiled, zeros (the first is "
                                                                 "the reference)")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - {"drawn", "tiled", "zeros"})
    if unknown or len(modes) < 2:
        parser.error(f"--modes: two or more of drawn, tiled, zeros, got {args.modes!r}")
    backend = FbgemmBackend(GeneratedLookups(seed=0), FbgemmConfig(batch_size=args.batch_size, warmup=3, iterations=10,
                                                                       huge_pages=huge_pages_enabled()))
    pin_threads(backend)
    task = Task.uniform("init-ab", reference_tables(args.tables), args.devices, 64.0)
    plan = make_sharder("size_lookup_greedy").shard(task)
    costs: dict[str, list[float]] = {m: [] for m in modes}
    wall: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.repeats):
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:  # each mode first in turn
            start = time.perf_counter()
            if mode in FILLS:
                with mock.patch.object(fbgemm, "fill_tiled", FILLS[mode]):
                    costs[mode].append(backend.plan_cost(task, plan).cost_ms)
            else:
                costs[mode].append(backend.plan_cost(task, plan).cost_ms)
            wall[mode].append(time.perf_counter() - start)
    print(f"{backend.device_name()}: {args.tables} tables on {args.devices} devices, batch {args.batch_size}, "
          f"{args.repeats} interleaved repeats (measured, CPU)")
    for mode in modes:
        print(f"  {mode:>5}: median plan cost {statistics.median(costs[mode]):.3f} ms "
              f"(min {min(costs[mode]):.3f}, max {max(costs[mode]):.3f}); "
              f"{statistics.median(wall[mode]):.2f} s per measurement")
    for mode in modes[1:]:
        ratios = np.array(costs[mode]) / np.array(costs[modes[0]])
        low, high = bootstrap_ci(ratios, seed=0)
        print(f"  {mode} / {modes[0]}, paired: mean {ratios.mean():.3f}, 95% interval [{low:.3f}, {high:.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
