"""Access-count bins estimated from a table's rows and pooling factor, for tables without histograms.

The learned sharders' features include each table's 17 access-count bins; where none were measured they
are estimated here, exactly and without sampling, under one fitted assumption: a Zipf law of row popularity
with one exponent for every table. A model carries the estimator fitted on its own training tables. The
model, the fit and its accuracy: docs/profile.md.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from dreamshard.errors import DataFormatError
from dreamshard.tables import BIN_COLUMNS, NUM_BINS, Table
from dreamshard.tasks import Task

META_KEY = "bin_estimator"  # where a model checkpoint's metadata holds its estimator (BinEstimator.to_dict())
STATS_COLUMNS = ("rows", "pooling_factor", "batch_size", *BIN_COLUMNS)
# bin k >= 1 holds counts in (2^(k-1), 2^k]; P(count > 2^j) for j = 0..15 gives them all
_TAIL_THRESHOLDS = np.array([2.0**j for j in range(NUM_BINS - 1)])


@dataclass(frozen=True)
class BinFitConfig:
    """How the Zipf exponent is fitted.

    exponent_min, exponent_max: the range searched (s = 0 is uniform popularity; the
        synthetic data's per-table exponents lie in 0.2..1.4, real tables rarely beyond 2).
    grid_step: spacing of the first, coarse search.
    tolerance: the golden-section search around the best grid point stops when its bracket
        is narrower than this.
    rank_group_ratio: the estimator's rank grouping (see the module); 1.01 keeps the bins
        within about 1e-4 (L1) of evaluating every rank.
    """

    exponent_min: float = 0.0
    exponent_max: float = 3.0
    grid_step: float = 0.1
    tolerance: float = 1e-3
    rank_group_ratio: float = 1.01

    def __post_init__(self) -> None:
        if not 0 <= self.exponent_min < self.exponent_max:
            raise ValueError(f"bin fit: need 0 <= exponent_min < exponent_max, got {self.exponent_min}, {self.exponent_max}")
        if not 0 < self.grid_step <= self.exponent_max - self.exponent_min:
            raise ValueError(f"bin fit: grid_step must be in (0, exponent_max - exponent_min], got {self.grid_step}")
        if not 0 < self.tolerance < self.grid_step:
            raise ValueError(f"bin fit: tolerance must be in (0, grid_step), got {self.tolerance}")
        _check_ratio(self.rank_group_ratio)


@dataclass(frozen=True)
class BinEstimator:
    """Expected access-count bins of a table under one fitted Zipf exponent (see the module).

    zipf_exponent: s, fitted to measured histograms.
    batch_size: B, the samples per histogram the estimates are made for: the batch the
        fitting tables' bins were measured at (the most common one when they differ, the
        largest among equally common ones).
    fitted_on: what it was fitted on, for the record (a file and a table count).
    l1_error: the mean L1 distance (0..2) between estimated and measured bins over the
        fitting tables at `zipf_exponent`: how far off an estimate is, on average.
    rank_group_ratio: the rank grouping of the computation (see the module).
    """

    zipf_exponent: float
    batch_size: int
    fitted_on: str
    l1_error: float
    rank_group_ratio: float = BinFitConfig.rank_group_ratio

    def __post_init__(self) -> None:
        if not (math.isfinite(self.zipf_exponent) and self.zipf_exponent >= 0):
            raise ValueError(f"bin estimator: zipf_exponent must be finite and >= 0, got {self.zipf_exponent}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"bin estimator: batch_size must be a positive integer, got {self.batch_size!r}")
        if not (math.isfinite(self.l1_error) and 0 <= self.l1_error <= 2):
            raise ValueError(f"bin estimator: l1_error must be in [0, 2], got {self.l1_error}")
        _check_ratio(self.rank_group_ratio)

    # ------------------------------------------------------------ estimating

    def estimate(self, rows: int, pooling_factor: float, batch_size: int | None = None) -> tuple[float, ...]:
        """The 17 expected bins of a table (at `batch_size` samples, default the estimator's)."""
        b = self.batch_size if batch_size is None else batch_size
        bins = expected_bins(rows, pooling_factor, b, self.zipf_exponent, self.rank_group_ratio)
        return tuple(float(x) for x in bins)

    def with_estimated_bins(self, tables: Iterable[Table]) -> tuple[list[Table], tuple[str, ...]]:
        """(tables, names of those estimated): the bins of tables lacking them filled in, the others kept."""
        out, estimated = [], []
        for t in tables:
            if t.bins is None:
                t = replace(t, bins=self.estimate(t.rows, t.pooling_factor))
                estimated.append(t.name)
            out.append(t)
        return out, tuple(estimated)

    # ------------------------------------------------------------ fitting

    @classmethod
    def fit(cls, stats: pd.DataFrame, config: BinFitConfig | None = None, fitted_on: str = "table statistics") -> BinEstimator:
        """Fit the exponent to measured histograms: `stats` has one row per table with columns
        rows, pooling_factor, batch_size and bin_0..bin_16 (data/tables.parquet has them)."""
        cfg = config or BinFitConfig()
        rows, pooling, batch, measured = _stats_arrays(stats, fitted_on)
        problem = _FitProblem(rows, pooling, batch, measured, cfg.rank_group_ratio)
        exponent, error = _minimise(problem.mean_l1, cfg)
        values, counts = np.unique(batch, return_counts=True)
        common = int(values[counts == counts.max()].max())
        return cls(float(exponent), common, f"{fitted_on} ({len(rows)} tables)", float(error), cfg.rank_group_ratio)

    def mean_l1(self, stats: pd.DataFrame, origin: str = "table statistics") -> float:
        """Mean L1 distance between this estimator's bins and the measured ones of `stats` (each at its batch size)."""
        rows, pooling, batch, measured = _stats_arrays(stats, origin)
        return _FitProblem(rows, pooling, batch, measured, self.rank_group_ratio).mean_l1(self.zipf_exponent)

    # ------------------------------------------------------------ checkpoint metadata

    def to_dict(self) -> dict[str, Any]:
        """Plain values (what a checkpoint's metadata can hold)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], origin: str = "bin estimator") -> BinEstimator:
        fields = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(d, Mapping):
            raise DataFormatError(f"{origin}: expected a mapping of {', '.join(sorted(fields))}, got {type(d).__name__}")
        unknown, missing = sorted(set(d) - fields), sorted(fields - set(d))
        if unknown or missing:
            raise DataFormatError(f"{origin}: bin estimator fields: unknown {unknown or 'none'}, missing {missing or 'none'}")
        try:
            return cls(**d)
        except (TypeError, ValueError) as exc:
            raise DataFormatError(f"{origin}: {exc}") from None

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], origin: str = "model metadata") -> BinEstimator | None:
        """The estimator a model's metadata carries under META_KEY; None when it carries none."""
        entry = meta.get(META_KEY)
        return None if entry is None else cls.from_dict(entry, f"{origin}: {META_KEY}")


def fit_tables_file(path: str | Path, names: Collection[str] | None = None,
                    config: BinFitConfig | None = None) -> BinEstimator:
    """The estimator fitted on the tables of a table-statistics file (data/tables.parquet, or a CSV with
    the same columns); `names`: only those tables (e.g. a model's training pool), each of which must be there."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file")
    try:
        stats = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
    except Exception as exc:  # pandas/pyarrow raise many types for unreadable files
        raise DataFormatError(f"{path}: cannot read table statistics: {exc}") from exc
    origin = str(path)
    if names is not None:
        if "name" not in stats.columns:
            raise DataFormatError(f"{path}: no column 'name' to select tables by")
        wanted = set(names)
        absent = sorted(wanted - set(stats["name"].astype(str)))
        if absent:
            raise DataFormatError(f"{path}: column 'name': no table(s) {', '.join(map(repr, absent[:5]))}"
                                  + (f" and {len(absent) - 5} more" if len(absent) > 5 else ""))
        stats = stats[stats["name"].astype(str).isin(wanted)]
        origin = f"{path}, selected tables"
    return BinEstimator.fit(stats, config, origin)


def task_with_estimated_bins(task: Task, estimator: BinEstimator | None, sharder: str) -> Task:
    """`task`, with the bins of its tables that lack them estimated by `estimator`; an error naming
    the first such table when there are some and no estimator (what a learned sharder calls first)."""
    lacking = [t.name for t in task.tables if t.bins is None]
    if not lacking:
        return task
    if estimator is None:
        more = f" (and {len(lacking) - 1} more tables)" if len(lacking) > 1 else ""
        raise DataFormatError(
            f"table {lacking[0]!r}{more}: sharder {sharder!r} needs the 17 access-count bins (bin_0..bin_16) and its "
            "model carries no bin estimator to estimate them; measure them with `dreamshard profile`")
    tables, _ = estimator.with_estimated_bins(task.tables)
    return replace(task, tables=tuple(tables))


# ---------------------------------------------------------------- the computation


def rank_groups(rows: int, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """(first rank, rank count) of each group of consecutive ranks 1..rows (see the module)."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    _check_ratio(ratio)
    singles = min(rows, math.ceil(1 / (ratio - 1)))  # below this, consecutive ranks differ by more than ratio
    steps = max(0, math.ceil(math.log((rows + 1) / (singles + 1)) / math.log(ratio))) + 1
    grouped = np.floor((singles + 1) * ratio ** np.arange(steps + 1, dtype=np.float64))
    edges = np.unique(np.concatenate([np.arange(1, singles + 1, dtype=np.float64), grouped]))
    edges = np.concatenate([edges[edges < rows + 1], [rows + 1.0]])
    return edges[:-1], np.diff(edges)


def expected_bins(rows: int, pooling_factor: float, batch_size: int, zipf_exponent: float,
                  rank_group_ratio: float = BinFitConfig.rank_group_ratio) -> np.ndarray:
    """The 17 expected access-count bins of a table (see the module); all zero when nothing is looked up."""
    if not (math.isfinite(pooling_factor) and pooling_factor >= 0):
        raise ValueError(f"pooling_factor must be finite and >= 0, got {pooling_factor}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    first, size = rank_groups(rows, rank_group_ratio)
    weight = _group_weights(first, size, zipf_exponent)
    lam = batch_size * pooling_factor * weight / float(np.dot(size, weight))
    return _normalised(size @ _bin_probabilities(lam))


def _group_weights(first: np.ndarray, size: np.ndarray, s: float) -> np.ndarray:
    """Mean Zipf weight r^-s of each group's ranks: exact for one rank, the midpoint integral otherwise."""
    u, v = first - 0.5, first + size - 0.5
    one_minus = 1.0 - s
    log_ratio = np.log(v / u)
    if abs(one_minus) < 1e-12:
        integral = log_ratio
    else:  # (v^(1-s) - u^(1-s)) / (1-s), without cancellation near s = 1
        integral = u**one_minus * np.expm1(one_minus * log_ratio) / one_minus
    return np.where(size == 1, first**-s, integral / size)


def _bin_probabilities(lam: np.ndarray) -> np.ndarray:
    """[n, 17]: P(Poisson(lam) falls in bin k) for each rate; P(X > t) is the regularised lower gamma P(t + 1, lam)."""
    rates = torch.from_numpy(np.asarray(lam, dtype=np.float64))
    tails = torch.special.gammainc(torch.from_numpy(_TAIL_THRESHOLDS + 1.0)[None, :], rates[:, None]).numpy()
    out = np.empty((rates.shape[0], NUM_BINS))
    out[:, 0] = lam * np.exp(-lam)  # exactly once
    out[:, 1:NUM_BINS - 1] = tails[:, :-1] - tails[:, 1:]  # (2^(k-1), 2^k]
    out[:, NUM_BINS - 1] = tails[:, -1]  # more than 2^15
    return np.maximum(out, 0.0)


def _normalised(expected: np.ndarray) -> np.ndarray:
    """Expected counts per bin -> fractions of the expected accessed rows (all zero when none is)."""
    total = expected.sum(axis=-1, keepdims=True)
    return np.divide(expected, total, out=np.zeros_like(expected), where=total > 0)


class _FitProblem:
    """The mean L1 distance over tables as a function of the exponent, the rank groups computed once."""

    def __init__(self, rows: np.ndarray, pooling: np.ndarray, batch: np.ndarray, measured: np.ndarray,
                 ratio: float) -> None:
        groups = [rank_groups(int(r), ratio) for r in rows]
        self.table = np.concatenate([np.full(len(f), i) for i, (f, _) in enumerate(groups)])
        self.first = np.concatenate([f for f, _ in groups])
        self.size = np.concatenate([n for _, n in groups])
        self.lookups = (batch * pooling)[self.table]
        self.measured = measured
        self.num_tables = len(rows)

    def estimates(self, s: float) -> np.ndarray:
        weight = _group_weights(self.first, self.size, s)
        norm = np.bincount(self.table, weights=self.size * weight, minlength=self.num_tables)
        lam = self.lookups * weight / norm[self.table]
        probs = _bin_probabilities(lam) * self.size[:, None]
        expected = np.stack([np.bincount(self.table, weights=probs[:, k], minlength=self.num_tables)
                             for k in range(NUM_BINS)], axis=1)
        return _normalised(expected)

    def mean_l1(self, s: float) -> float:
        return float(np.abs(self.estimates(s) - self.measured).sum(axis=1).mean())


def _minimise(f, cfg: BinFitConfig) -> tuple[float, float]:
    """(argmin, min) of f over [exponent_min, exponent_max]: a grid, then golden-section around its best point."""
    steps = int(math.floor((cfg.exponent_max - cfg.exponent_min) / cfg.grid_step + 1e-9))
    grid = [cfg.exponent_min + i * cfg.grid_step for i in range(steps + 1)]
    values = [f(s) for s in grid]
    best = int(np.argmin(values))
    lo = grid[max(best - 1, 0)]
    hi = grid[min(best + 1, len(grid) - 1)]
    invphi = (math.sqrt(5) - 1) / 2
    c, d = hi - invphi * (hi - lo), lo + invphi * (hi - lo)
    fc, fd = f(c), f(d)
    while hi - lo > cfg.tolerance:
        if fc <= fd:
            hi, d, fd = d, c, fc
            c = hi - invphi * (hi - lo)
            fc = f(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + invphi * (hi - lo)
            fd = f(d)
    candidates = [(values[best], grid[best]), (fc, c), (fd, d)]
    value, s = min(candidates)
    return s, value


def _stats_arrays(stats: pd.DataFrame, origin: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rows, pooling, batch, bins [n, 17]) of a table-statistics frame, checked."""
    missing = [c for c in STATS_COLUMNS if c not in stats.columns]
    if missing:
        raise DataFormatError(f"{origin}: missing column(s) {', '.join(missing)}; fitting bins needs "
                              f"rows, pooling_factor, batch_size and {BIN_COLUMNS[0]}..{BIN_COLUMNS[-1]}")
    if stats.empty:
        raise DataFormatError(f"{origin}: no tables to fit the bins on")
    arrays = {}
    for c in STATS_COLUMNS:
        try:
            a = pd.to_numeric(stats[c], errors="raise").to_numpy(dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise DataFormatError(f"{origin}: column {c!r}: expected numbers: {exc}") from None
        if not np.isfinite(a).all():
            raise DataFormatError(f"{origin}: column {c!r}: missing or infinite values")
        arrays[c] = a
    for c, low in (("rows", 1), ("batch_size", 1)):
        bad = (arrays[c] < low) | (arrays[c] != np.round(arrays[c]))
        if bad.any():
            raise DataFormatError(f"{origin}: column {c!r}: expected integers >= {low}, got {arrays[c][bad][0]!r}")
    if (arrays["pooling_factor"] < 0).any():
        raise DataFormatError(f"{origin}: column 'pooling_factor': expected values >= 0")
    bins = np.stack([arrays[c] for c in BIN_COLUMNS], axis=1)
    if ((bins < 0) | (bins > 1)).any():
        raise DataFormatError(f"{origin}: access-count bins must be fractions in [0, 1]")
    return arrays["rows"].astype(np.int64), arrays["pooling_factor"], arrays["batch_size"].astype(np.int64), bins


def _check_ratio(ratio: float) -> None:
    if not (math.isfinite(ratio) and ratio > 1):
        raise ValueError(f"rank_group_ratio must be a finite number > 1, got {ratio}")
