"""What the kernel measurements share (benchmarks/cpu_kernels on the CPU, tools/gpu_run's fusion step and
tools/gpu_profile on a GPU): the reference tables they measure, and the noise figure they report."""
from __future__ import annotations

import statistics

import numpy as np

from dreamshard.tables import Table

DIMS = (8, 16, 32, 64, 128)


def reference_tables(n: int, seed: int = 0) -> list[Table]:
    """N tables shaped like REFERENCE.md's CPU measurement: rows 300..300k, dims 8..128."""
    rng = np.random.default_rng(seed)
    rows = np.round(10 ** rng.uniform(np.log10(300), np.log10(300_000), n)).astype(int)
    if n >= 2:  # span the whole range
        rows[0], rows[1] = 300, 300_000
    dims = rng.choice(DIMS, n)
    pooling = rng.uniform(1.0, 30.0, n)
    return [Table(f"t{i}", int(r), int(d), float(p)) for i, (r, d, p) in enumerate(zip(rows, dims, pooling))]


def cv(values: list[float]) -> float:
    """The coefficient of variation (std / mean) of repeated measurements; nan for fewer than two."""
    return statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else float("nan")
