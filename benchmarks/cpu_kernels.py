"""CPU kernel benchmark: is a fused FBGEMM operator's cost the sum of its tables' costs?

    python -m benchmarks.cpu_kernels [--tables N] [--repeats R] [--batch-size B] [--iterations I] [--large]

Builds N tables (default 20) with log-uniform rows in [300, 300k], dims in {8..128},
Poisson pooling and Zipf lookups (dreamshard.data.lookups.GeneratedLookups, seed 0), then,
R times, side by side in one run on FBGEMM's CPU kernels with 1 thread:
  fused:  one operator holding all N tables (forward + backward with the optimizer update)
  singles: N one-table operators, costs summed
Prints the medians over the R repeats, their ratio, the fusion regime it implies
(dreamshard.evaluation.bounds.regime_of over the per-repeat ratios: super_additive, sub_additive or
mixed) and the measurement noise: the coefficient of variation (std / mean) of the fused
cost across the repeats. These are CPU figures, labelled with the CPU's name: not GPU figures.

The direction differs between processors, so it is measured here and by the evaluate
stage, never asserted by a test: 1.5-1.8x on an Intel Xeon, 0.96x on an AMD EPYC so far.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from dreamshard.project.data import DEFAULT_ZIPF_ALPHA, GeneratedLookups
from dreamshard.project.domain import Shard, Table, Task
from dreamshard.project.evaluation import regime_of
from dreamshard.project.hardware import FbgemmBackend, FbgemmConfig, pin_threads
from dreamshard.project.kernels import cv, reference_tables

LARGE_ROWS = (300_000, 200_000, 150_000, 100_000, 80_000, 60_000, 50_000, 40_000, 30_000, 20_000)
LARGE_DIMS = (64, 128, 32, 64, 128, 64, 32, 128, 64, 32)


def large_tables() -> list[Table]:
    return [Table(f"big{i}", r, d, 10.0) for i, (r, d) in enumerate(zip(LARGE_ROWS, LARGE_DIMS))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cpu_kernels", description=__doc__.split("\n")[0])
    ap.add_argument("--tables", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--iterations", type=int, default=FbgemmConfig().iterations)
    ap.add_argument("--warmup", type=int, default=FbgemmConfig().warmup)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--large", action="store_true", help="the 10 large tables instead of --tables N reference tables")
    args = ap.parse_args(argv)
    if args.tables < 1 or args.repeats < 1:
        ap.error("--tables and --repeats must be >= 1")

    tables = large_tables() if args.large else reference_tables(args.tables, args.seed)
    task = Task.uniform("cpu-kernels", tables, 1, 64.0)
    config = FbgemmConfig(batch_size=args.batch_size, warmup=args.warmup, iterations=args.iterations, threads=1,
                          device="cpu", memory_budget_gb=16.0)
    backend = FbgemmBackend(GeneratedLookups(seed=args.seed), config)
    pin_threads(backend)
    everything = [Shard(t.name, 0, 0, t.dim) for t in tables]
    size_mb = sum(task.memory.shard_bytes(t.rows, t.dim) for t in tables) / 2**20

    print("FBGEMM CPU kernel benchmark — CPU figures, not GPU figures")
    print(f"device:   {backend.device_name()}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in backend.versions().items()))
    print(f"tables:   {len(tables)} (rows {min(t.rows for t in tables)}..{max(t.rows for t in tables)}, "
          f"dims {min(t.dim for t in tables)}..{max(t.dim for t in tables)}, pooling "
          f"{min(t.pooling_factor for t in tables):.1f}..{max(t.pooling_factor for t in tables):.1f}, "
          f"Zipf alpha {DEFAULT_ZIPF_ALPHA}), {size_mb:.0f} MiB of fp32 weights, exact_sgd")
    print(f"setup:    batch {config.batch_size}, {config.warmup} warm-up + {config.iterations} timed iterations "
          f"(median), {args.repeats} repeats, 1 thread")
    sys.stdout.flush()

    fused, singles, fused_fwd, fused_bwd, single_fwd, single_bwd, spikes = [], [], [], [], [], [], []
    start = time.perf_counter()
    for r in range(args.repeats):
        samples = backend.compute_samples(task, everything)
        f = samples.median()
        parts = [backend.compute_cost(task, [s]) for s in everything]
        fused.append(f.total_ms)
        fused_fwd.append(f.fwd_ms)
        fused_bwd.append(f.bwd_ms)
        singles.append(sum(p.total_ms for p in parts))
        single_fwd.append(sum(p.fwd_ms for p in parts))
        single_bwd.append(sum(p.bwd_ms for p in parts))
        spikes.append(max(samples.fwd_ms) / f.fwd_ms)
        print(f"  repeat {r + 1}/{args.repeats}: fused {f.total_ms:7.2f} ms (fwd {f.fwd_ms:6.2f}, bwd {f.bwd_ms:6.2f})"
              f"   sum of singles {singles[-1]:7.2f} ms   ratio {f.total_ms / singles[-1]:.3f}")
        sys.stdout.flush()
    elapsed = time.perf_counter() - start

    med = statistics.median
    per_repeat = [a / b for a, b in zip(fused, singles)]
    print()
    print(f"(1) fused vs sum of single-table costs, CPU ({backend.device_name()}), median over {args.repeats} repeats:")
    print(f"    fused (1 operator, {len(tables)} tables):   {med(fused):8.2f} ms   "
          f"(fwd {med(fused_fwd):.2f}, bwd {med(fused_bwd):.2f})")
    print(f"    sum of {len(tables)} single-table operators: {med(singles):8.2f} ms   "
          f"(fwd {med(single_fwd):.2f}, bwd {med(single_bwd):.2f})")
    print(f"    ratio fused / sum:                {med(fused) / med(singles):8.3f}   "
          f"(fwd {med(fused_fwd) / med(single_fwd):.3f}, bwd {med(fused_bwd) / med(single_bwd):.3f}; "
          f"per-repeat ratios {min(per_repeat):.3f}..{max(per_repeat):.3f})")
    print(f"    fusion regime on this machine:    {regime_of(per_repeat)}")
    print(f"(2) noise of the fused cost across {args.repeats} repeats at {config.iterations} iterations, CPU:")
    print(f"    coefficient of variation (std/mean): total {cv(fused):.3f}, fwd {cv(fused_fwd):.3f}, "
          f"bwd {cv(fused_bwd):.3f}; sum of singles {cv(singles):.3f}")
    print(f"    largest single forward iteration / its median: {max(spikes):.2f}x")
    print(f"wall time {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
