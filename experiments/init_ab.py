"""Does the way the fbgemm backend initialises weights change what it measures? An A/B benchmark.

    python -m experiments.init_ab [--devices 8] [--tables 80] [--repeats 8] [--modes tiled,read]

The kernels' work (lookups, pooling, the SGD update) does not depend on the weights' values, so every way
should time alike, and the cheapest is the one to build with. Modes: drawn (every weight from a seeded
generator), tiled (a seeded block repeated over every weight), zeros (the weights as FBGEMM's constructor
leaves them), read (the backend's own, dreamshard.hardware.fbgemm.fill_read_rows: the block repeated over
the rows the lookups read, the others left zero). This measures it: one plan of N tables (reference-like
tables, benchmarks/cpu_kernels.py) on D devices, measured R times each way, interleaved (each mode first in
turn), on FBGEMM's CPU kernels with 1 thread; prints the medians, each ratio to the first mode with a 95%
bootstrap interval over the paired repeats, and the wall time per measurement. CPU figures, labelled with
the CPU's name; huge pages as the process's THP_MEM_ALLOC_ENABLE says.
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


def draw_every_weight(weights, rows, block) -> None:
    """Every weight drawn from a seeded generator (the first way)."""
    import torch

    weights.uniform_(-fbgemm.INIT_RANGE, fbgemm.INIT_RANGE, generator=torch.Generator().manual_seed(0))


def fill_tiled(weights, rows, block) -> None:
    """Every weight: `block` repeated in order over the whole table (the second way)."""
    flat = weights.view(-1)
    step = block.numel()
    for start in range(0, flat.numel(), step):
        end = min(start + step, flat.numel())
        flat[start:end].copy_(block[: end - start])


def leave_zeros(weights, rows, block) -> None:
    """No fill: the weights stay as FBGEMM's constructor wrote them (zeros)."""


FILLS = {"drawn": draw_every_weight, "tiled": fill_tiled, "zeros": leave_zeros}  # "read": the backend's own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--tables", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--modes", default="tiled,read", help="comma-separated: drawn, tiled, zeros, read (the first "
                                                                "is the reference)")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - {"drawn", "tiled", "zeros", "read"})
    if unknown or len(modes) < 2:
        parser.error(f"--modes: two or more of drawn, tiled, zeros, read, got {args.modes!r}")
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
                with mock.patch.object(fbgemm, "fill_read_rows", FILLS[mode]):
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
