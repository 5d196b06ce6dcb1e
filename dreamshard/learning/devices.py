"""Single-device measurements for the cost models: random sets of tables, each measured as one fused operator.

A sample is a set of 1..max_tables training tables, each at a dim drawn from `dims`, that fits in
`memory_cap_gb` under the tasks' memory model: the augmentation NeuroShard trains its compute model
on. A device's compute cost does not depend on how many other devices there are, so these
measurements teach a cost network about devices of every size, whatever the device counts of
the training tasks. No communication is measured (one device exchanges nothing).

Measured rows are journaled chunk by chunk (`DeviceJournal`, one Parquet file per chunk, written
atomically): an interrupted run keeps what it measured, and a rerun measures only the missing
samples. The merged rows (`merge`) follow the samples' order, whoever measured them when.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from dreamshard.errors import DataFormatError
from dreamshard.hardware.base import CostBackend, measure_rounds
from dreamshard.hardware.comm import shard_traffic
from dreamshard.io import write_parquet
from dreamshard.learning.cost_model import CostData
from dreamshard.learning.features import NUM_FEATURES, shard_features
from dreamshard.memory import GB
from dreamshard.plan import Plan, Shard
from dreamshard.tables import Table
from dreamshard.tasks import Task

COLUMNS = ("sample", "tables", "dims", "fwd_ms", "bwd_ms")


@dataclass(frozen=True)
class DeviceSample:
    index: int
    tables: tuple[Table, ...]  # at the sample's dims


def device_samples(pool: Sequence[Table], count: int, max_tables: int, memory_cap_gb: float,
                   dims: Sequence[int], template: Task, seed: int) -> list[DeviceSample]:
    """`count` random table sets (seeded): 1..max_tables tables of `pool` at dims drawn from `dims`, fitting in
    `memory_cap_gb` under `template`'s memory model; a draw where no table fits is skipped."""
    if not pool:
        raise ValueError("no tables to draw device samples from")
    rng = np.random.default_rng(seed)
    cap = memory_cap_gb * GB
    out = []
    for k in range(count):
        size_wanted = int(rng.integers(1, max_tables + 1))
        chosen: list[Table] = []
        used = 0
        for i in rng.permutation(len(pool))[: size_wanted * 3]:
            t = pool[int(i)].with_dim(int(rng.choice(dims)))
            size = template.memory.shard_bytes(t.rows, t.dim)
            if used + size <= cap and len(chosen) < size_wanted:
                chosen.append(t)
                used += size
        if chosen:
            out.append(DeviceSample(k, tuple(chosen)))
    return out


def sample_task(sample: DeviceSample, template: Task) -> Task:
    """The one-device task a sample is measured in: its tables on the template's first device."""
    return Task(f"device-sample/{sample.index}", sample.tables, template.devices[:1], template.memory)


def measure_samples(backend: CostBackend, samples: Sequence[DeviceSample], template: Task, extra: dict,
                    rounds: int = 1, on_sample: Callable[[], None] | None = None) -> list[dict]:
    """One row per sample: its tables, their dims, the measured fused operator's costs, the backend and
    device that measured it and `extra` (e.g. batch size, seed); writes nothing.

    Each sample is measured `rounds` times in turns (measure_rounds), so that a slow spell of the machine hits
    them alike; fwd_ms and bwd_ms are the medians of the rounds, and the rows keep
    every round (fwd_ms_rounds, bwd_ms_rounds)."""
    tasks = [sample_task(s, template) for s in samples]
    plans = [Plan(1, tuple(Shard(t.name, 0, 0, t.dim) for t in s.tables)) for s in samples]
    readings = measure_rounds(backend, tasks, plans, rounds, list, on_plan=on_sample)
    measured = [[r.compute[0] for r in rs] for rs in readings]
    rows = []
    for s, costs in zip(samples, measured, strict=True):
        fwd, bwd = [c.fwd_ms for c in costs], [c.bwd_ms for c in costs]
        rows.append({"sample": s.index, "tables": [t.name for t in s.tables], "dims": [t.dim for t in s.tables],
                     "fwd_ms": statistics.median(fwd), "bwd_ms": statistics.median(bwd),
                     "fwd_ms_rounds": fwd, "bwd_ms_rounds": bwd, "backend": backend.name,
                     "device_name": backend.device_name(), "measured": backend.measured, **extra})
    return rows


def cost_data_of(samples: Sequence[DeviceSample], fwd_bwd_ms: Sequence[tuple[float, float]],
                 template: Task) -> CostData:
    """CostData of measured samples: each one device (and one "plan" of that device), communication 0."""
    raw, shard_dev, outs = [], [], []
    for k, s in enumerate(samples):
        for t in s.tables:
            raw.append(shard_features(t, t.dim, template.memory))
            outs.append(shard_traffic(t, t.dim))
            shard_dev.append(k)
    dev = np.asarray([(f, b, 0.0) for f, b in fwd_bwd_ms], dtype=np.float64).reshape(-1, 3)
    return CostData(np.asarray(raw).reshape(-1, NUM_FEATURES), np.asarray(shard_dev, np.int64),
                    np.arange(len(dev), dtype=np.int64), dev, dev[:, :2].sum(axis=1),
                    np.asarray(outs, np.float64).reshape(-1, 2), np.zeros(len(raw), np.int64))  # whole tables


def cost_data_from_device_rows(rows: pd.DataFrame, pool: Sequence[Table], template: Task, origin: str) -> CostData:
    """CostData of the rows `merge` wrote, the tables looked up in `pool` by name (at the rows' dims)."""
    missing = [c for c in COLUMNS if c not in rows.columns]
    if missing:
        raise DataFormatError(f"{origin}: missing column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)}")
    by_name = {t.name: t for t in pool}
    samples, costs = [], []
    for r in rows.itertuples(index=False):
        unknown = [n for n in r.tables if n not in by_name]
        if unknown:
            raise DataFormatError(f"{origin}: sample {r.sample}: table(s) {', '.join(unknown[:3])} are not among the "
                                  "training tables; the samples were drawn from another pool")
        samples.append(DeviceSample(int(r.sample), tuple(by_name[n].with_dim(int(d)) for n, d in zip(r.tables, r.dims))))
        costs.append((float(r.fwd_ms), float(r.bwd_ms)))
    return cost_data_of(samples, costs, template)


class DeviceJournal:
    """Measured sample rows, one Parquet file per chunk (atomic), named by the chunk's first and last sample."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def _parts(self) -> list[Path]:
        return sorted(self.folder.glob("samples-*.parquet"))

    def done(self) -> set[int]:
        return {int(i) for p in self._parts() for i in pd.read_parquet(p, columns=["sample"])["sample"]}

    def write_chunk(self, rows: list[dict]) -> None:
        if rows:
            name = f"samples-{rows[0]['sample']:06d}-{rows[-1]['sample']:06d}.parquet"
            write_parquet(pa.Table.from_pylist(rows), self.folder / name)

    def read(self, samples: Sequence[DeviceSample]) -> pd.DataFrame:
        """The journal's rows of `samples`, in their order; each sample once."""
        frames = [pd.read_parquet(p) for p in self._parts()]
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({c: [] for c in COLUMNS})
        wanted = {s.index for s in samples}
        df = df[df["sample"].isin(wanted)].drop_duplicates(subset=["sample"])
        return df.sort_values("sample").reset_index(drop=True)


def pending(samples: Sequence[DeviceSample], done: set[int], chunk_size: int) -> list[list[DeviceSample]]:
    """The samples not yet journaled, cut in order into chunks of `chunk_size`."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size: expected an integer >= 1, got {chunk_size!r}")
    todo = [s for s in samples if s.index not in done]
    return [todo[i:i + chunk_size] for i in range(0, len(todo), chunk_size)]
