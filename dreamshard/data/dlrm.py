"""The DLRM embedding_bag dataset format, per-table statistics and a synthetic generator.

A file is a tuple `(indices, offsets, lengths)` saved by `torch.save`, plain `.pt` or
gzipped `.pt.gz` (facebookresearch/dlrm_datasets, 2021 and 2022 releases):
  lengths  [T, B]   lookups of sample b in table t
  offsets  [T*B+1]  table-major absolute positions into indices: table t, sample b
                    reads indices[offsets[t*B+b] : offsets[t*B+b+1]]
  indices  [N]      table-local row ids
"""
from __future__ import annotations

import gzip
import math
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import numpy as np
import torch

from dreamshard.errors import DataFormatError
from dreamshard.io import atomic_path
from dreamshard.tables import access_count_bins

MIN_ROWS = 100
DATASET_SUFFIXES = (".pt", ".pt.gz")
MANIFEST = "manifest.json"  # written by the download stage beside the files: where they came from


@dataclass(frozen=True)
class EmbeddingBagBatch:
    """One batch of lookups for T tables, as numpy int64 arrays."""

    indices: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray

    @property
    def num_tables(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[1])

    def table(self, t: int, batch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Table t's (indices, lengths) for its first `batch` samples (all when None)."""
        b = self.batch_size if batch is None else min(batch, self.batch_size)
        start = self.offsets[t * self.batch_size]
        end = self.offsets[t * self.batch_size + b]
        return self.indices[start:end], self.lengths[t, :b]


def is_dataset_file(path: Path) -> bool:
    return path.name.endswith(DATASET_SUFFIXES)


def load_dlrm_file(path: str | Path) -> EmbeddingBagBatch:
    """Load and check one dataset file; any violation names the file and the field."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file")
    if not is_dataset_file(path):
        raise DataFormatError(f"{path}: expected a .pt or .pt.gz file")
    try:
        with warnings.catch_warnings():  # torch warns of a foreign pickle's protocol: the error below says more
            warnings.simplefilter("ignore")
            if path.name.endswith(".gz"):
                with gzip.open(path, "rb") as fh:
                    obj = torch.load(cast(IO[bytes], fh), weights_only=True)
            else:
                obj = torch.load(path, weights_only=True)
    except Exception as exc:  # corrupt gzip, pickle, truncated file, ...: torch's advice on weights_only is no help
        raise DataFormatError(f"{path}: cannot be read as a torch.save file ({type(exc).__name__}); expected a DLRM "
                              "lookups file: a tuple (indices, offsets, lengths) of integer tensors") from None
    if not isinstance(obj, (tuple, list)) or len(obj) != 3:
        what = f"{type(obj).__name__} of {len(obj)}" if isinstance(obj, (tuple, list)) else type(obj).__name__
        raise DataFormatError(f"{path}: expected a tuple of 3 (indices, offsets, lengths), got {what}")
    arrays = {}
    for name, value in zip(("indices", "offsets", "lengths"), obj):
        if not isinstance(value, torch.Tensor):
            raise DataFormatError(f"{path}: {name}: expected a tensor, got {type(value).__name__}")
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise DataFormatError(f"{path}: {name}: expected an integer tensor, got {value.dtype}")
        arrays[name] = value.numpy().astype(np.int64, copy=False)
    return check_batch(EmbeddingBagBatch(**arrays), str(path))


def check_batch(batch: EmbeddingBagBatch, origin: str) -> EmbeddingBagBatch:
    indices, offsets, lengths = batch.indices, batch.offsets, batch.lengths
    if indices.ndim != 1:
        raise DataFormatError(f"{origin}: indices: expected 1-D, got shape {list(indices.shape)}")
    if lengths.ndim != 2:
        raise DataFormatError(f"{origin}: lengths: expected 2-D [T, B], got shape {list(lengths.shape)}")
    t, b = lengths.shape
    if t == 0 or b == 0:
        raise DataFormatError(f"{origin}: lengths: expected T >= 1 tables and B >= 1 samples, got [{t}, {b}]")
    if offsets.shape != (t * b + 1,):
        raise DataFormatError(
            f"{origin}: offsets: expected T*B+1 = {t * b + 1} entries for lengths [{t}, {b}], got shape {list(offsets.shape)}"
        )
    if (lengths < 0).any():
        raise DataFormatError(f"{origin}: lengths: negative entries")
    if offsets[0] != 0:
        raise DataFormatError(f"{origin}: offsets: expected offsets[0] = 0, got {offsets[0]}")
    if not np.array_equal(np.diff(offsets), lengths.reshape(-1)):
        bad = int(np.flatnonzero(np.diff(offsets) != lengths.reshape(-1))[0])
        raise DataFormatError(
            f"{origin}: offsets: offsets[{bad + 1}] - offsets[{bad}] = {offsets[bad + 1] - offsets[bad]} "
            f"but lengths[{bad // b}, {bad % b}] = {lengths.reshape(-1)[bad]}"
        )
    if offsets[-1] != indices.shape[0]:
        raise DataFormatError(f"{origin}: offsets: last offset {offsets[-1]} != number of indices {indices.shape[0]}")
    if indices.size and indices.min() < 0:
        raise DataFormatError(f"{origin}: indices: negative row ids (min {indices.min()})")
    return batch


def save_dlrm_file(batch: EmbeddingBagBatch, path: str | Path) -> None:
    """Write `batch` in the dataset format (gzipped when the name ends in .gz), atomically."""
    path = Path(path)
    obj = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in (batch.indices, batch.offsets, batch.lengths))
    with atomic_path(path) as tmp:
        if path.name.endswith(".gz"):
            # no name, mtime=0: the same batch gives the same bytes, so DVC sees no change on reruns;
            # level 1: level 9 takes a minute for 12M indices and saves little on random ids
            with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0, compresslevel=1) as fh:
                torch.save(obj, cast(IO[bytes], fh))
        else:
            torch.save(obj, tmp)


@dataclass(frozen=True)
class TableStatistics:
    rows: int
    pooling_factor: float
    num_lookups: int
    num_unique: int
    bins: list[float]


def table_statistics(indices: np.ndarray, lengths: np.ndarray) -> TableStatistics:
    """rows = max(100, max index + 1); pooling = mean length (float); 17 access-count bins."""
    if indices.size:
        uniques, counts = np.unique(indices, return_counts=True)
        rows = max(MIN_ROWS, int(uniques[-1]) + 1)
    else:
        counts = np.zeros(0, dtype=np.int64)
        rows = MIN_ROWS
    return TableStatistics(
        rows=rows,
        pooling_factor=float(lengths.mean()),
        num_lookups=int(indices.size),
        num_unique=int(counts.size),
        bins=access_count_bins(counts),
    )


# ---------------------------------------------------------------- synthetic data


@dataclass(frozen=True)
class SyntheticConfig:
    """Heavy-tailed tables shaped like the published DLRM statistics.

    Hash sizes: log10(rows) ~ Normal(rows_log10_mean, rows_log10_std) clipped to
    [log10(min_rows), log10(max_rows)]. Pooling factors: lognormal with median
    `pooling_median` and log-std `pooling_sigma` (mean about 15 by default; a few
    tables near 0, a few above 100), clipped to max_pooling; per-sample lengths are
    Poisson. Index skew: Zipf exponent uniform in [zipf_min, zipf_max] per table. Then `heavy_tables` more, alike
    but pooled log-uniformly in [heavy_pooling_min, max_pooling]: the heavy tail a holdout family draws from
    (tasks.holdout), in numbers enough for disjoint test tasks; the first `num_tables` do not depend on them.
    """

    num_tables: int = 240
    batch_size: int = 4096
    min_rows: int = 100
    max_rows: int = 1_000_000
    rows_log10_mean: float = 4.0
    rows_log10_std: float = 1.2
    pooling_median: float = 7.0
    pooling_sigma: float = 1.25
    max_pooling: float = 250.0
    zipf_min: float = 0.2
    zipf_max: float = 1.4
    heavy_tables: int = 0
    heavy_pooling_min: float = 50.0
    seed: int = 0


@dataclass(frozen=True)
class TableProfile:
    """What the generator needs to make a table's lookups."""

    hash_size: int
    pooling_factor: float
    zipf_alpha: float


def sample_table_profiles(cfg: SyntheticConfig) -> list[TableProfile]:
    rng = np.random.default_rng(cfg.seed)
    log_rows = rng.normal(cfg.rows_log10_mean, cfg.rows_log10_std, cfg.num_tables)
    log_rows = np.clip(log_rows, math.log10(cfg.min_rows), math.log10(cfg.max_rows))
    pooling = np.minimum(rng.lognormal(math.log(cfg.pooling_median), cfg.pooling_sigma, cfg.num_tables), cfg.max_pooling)
    alphas = rng.uniform(cfg.zipf_min, cfg.zipf_max, cfg.num_tables)
    if cfg.heavy_tables:  # a stream of their own: the tables above stay as they were
        if not 0 < cfg.heavy_pooling_min <= cfg.max_pooling:
            raise ValueError(f"heavy_pooling_min: expected a pooling factor in (0, max_pooling = {cfg.max_pooling}], "
                             f"got {cfg.heavy_pooling_min}")
        heavy = np.random.default_rng([cfg.seed, 1])
        log_rows = np.concatenate([log_rows, np.clip(heavy.normal(cfg.rows_log10_mean, cfg.rows_log10_std, cfg.heavy_tables),
                                                     math.log10(cfg.min_rows), math.log10(cfg.max_rows))])
        pooling = np.concatenate([pooling, np.exp(heavy.uniform(math.log(cfg.heavy_pooling_min), math.log(cfg.max_pooling),
                                                                cfg.heavy_tables))])
        alphas = np.concatenate([alphas, heavy.uniform(cfg.zipf_min, cfg.zipf_max, cfg.heavy_tables)])
    return [
        TableProfile(int(round(10**lr)), float(p), float(a)) for lr, p, a in zip(log_rows, pooling, alphas)
    ]


def generate_lookups(profile: TableProfile, batch_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (indices, lengths) for one table: Poisson lengths, Zipf-ranked rows.

    Popularity rank r (0 = hottest) has probability proportional to (r + 1)^-alpha;
    ranks map to row ids by a seeded bijection (multiply by a unit mod hash_size,
    add a shift) so that hot rows are scattered over the table as in real data.
    """
    rng = np.random.default_rng(seed)
    lengths = rng.poisson(profile.pooling_factor, batch_size).astype(np.int64)
    n = profile.hash_size
    weights = np.arange(1, n + 1, dtype=np.float64) ** -profile.zipf_alpha
    cdf = np.cumsum(weights)
    ranks = np.searchsorted(cdf, rng.random(int(lengths.sum())) * cdf[-1], side="right")
    ranks = np.minimum(ranks, n - 1)
    mult = int(rng.integers(1, n)) if n > 1 else 1
    while math.gcd(mult, n) != 1:
        mult += 1
    shift = int(rng.integers(0, n))
    indices = (ranks * mult + shift) % n
    return indices.astype(np.int64), lengths


def synthetic_pooling(cfg: SyntheticConfig) -> list[float]:
    """Each generated table's pooling factor as `table_statistics` will measure it (the mean of the lengths
    generate_lookups draws first), without drawing the indices: which tables a pool split leaves out is known
    before generating them (benchmarks/dmp_fidelity.py)."""
    return [float(np.random.default_rng(table_seed(cfg.seed, f"t{i}")).poisson(p.pooling_factor, cfg.batch_size).mean())
            for i, p in enumerate(sample_table_profiles(cfg))]


def table_seed(seed: int, key: str) -> int:
    """A stable per-table seed: independent of the order tables are generated in."""
    return (seed * 1_000_003 + zlib.crc32(key.encode())) % 2**32


def generate_synthetic(cfg: SyntheticConfig) -> EmbeddingBagBatch:
    profiles = sample_table_profiles(cfg)
    per_table = [generate_lookups(p, cfg.batch_size, table_seed(cfg.seed, f"t{i}")) for i, p in enumerate(profiles)]
    lengths = np.stack([lg for _, lg in per_table])
    indices = np.concatenate([ix for ix, _ in per_table])
    offsets = np.concatenate([[0], np.cumsum(lengths.reshape(-1))]).astype(np.int64)
    return EmbeddingBagBatch(indices=indices, offsets=offsets, lengths=lengths)
