"""The 21 table features DreamShard's networks read, and the scaler fitted on training tables.

Features of a shard (a table, or a column slice of it): dim (the shard's width), rows,
pooling factor, size (bytes of the shard under the task's memory model) and the 17
access-count bins. dim, rows, pooling factor and size are heavy-tailed, so they enter
as log1p and are standardised with the mean and std of the training tables. The bins
are fractions in [0, 1] already and pass through unchanged: standardising them would
blow rare bins (few training tables access rows 2^10+ times) up into huge z-scores for
an unseen hot table, which the networks then extrapolate wildly. The scaler is fitted once and saved inside model
checkpoints, so a table has
the same features in every task (never re-normalised per task).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dreamshard.errors import DataFormatError
from dreamshard.memory import GB, MemoryModel
from dreamshard.tables import BIN_COLUMNS, Table

FEATURE_NAMES = ("dim", "rows", "pooling_factor", "size_gb", *BIN_COLUMNS)
NUM_FEATURES = len(FEATURE_NAMES)
_LOG_COLUMNS = 4  # the first four are log1p-transformed


def shard_features(table: Table, width: int, memory: MemoryModel) -> np.ndarray:
    """Raw features of `width` columns of `table`."""
    if table.bins is None:
        raise DataFormatError(
            f"table {table.name!r}: the learned cost models need the 17 access-count bins (bin_0..bin_16); "
            "measure them with `dreamshard profile`, or estimate them (dreamshard.data.bins)"
        )
    size = memory.shard_bytes(table.rows, width) / GB
    return np.array([width, table.rows, table.pooling_factor, size, *table.bins], dtype=np.float64)


def table_features(tables: Sequence[Table], memory: MemoryModel) -> np.ndarray:
    """[n, 21] raw features of whole tables."""
    return np.stack([shard_features(t, t.dim, memory) for t in tables])


# the features whose training range a learned sharder checks a task against (sharders/fallback.py): what a table
# is made of (its size follows from rows and dim; its bins are fractions, inside [0, 1] for every table); each is
# also the name of a Table attribute
RANGE_FEATURES = ("dim", "rows", "pooling_factor")
# beyond the training high by more than this share counts as outside: a table a few rows above the largest training
# table (the synthetic generator clips rows at max_rows) is no extrapolation
RANGE_SLACK = 0.1
FOLDABLE = ("dim", "pooling_factor")  # what FeatureScaler.fold can fold
FOLDED = ("dim",)  # what it folds by default


@dataclass(frozen=True)
class FeatureScaler:
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # the least and greatest raw value of each RANGE_FEATURES over the tables it was fitted on (the training
    # range); None in checkpoints written before they were recorded: no range is known
    low: tuple[float, ...] | None = None
    high: tuple[float, ...] | None = None
    # the features `fold` folds (FOLDABLE): dims, whose folding made plans cheaper on validation tables at holdout
    # dims, not pooling, whose folding made them dearer on fresh heavy tables (results/holdout/fold-probe); never
    # stored: benchmarks/fold_probe sets it to compare
    folds: tuple[str, ...] = FOLDED
    # a dim folded into k in-range slices weighs k ** fold_exponent: fitted with the network (cost_model.
    # fit_fold_exponent) so that folding inside the range reproduces its own rating; 1 in older checkpoints
    fold_exponent: float = 1.0

    def __post_init__(self) -> None:
        if not set(self.folds) <= set(FOLDABLE):
            raise ValueError(f"folds: expected features among {FOLDABLE}, got {self.folds!r}")
        e = self.fold_exponent
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0 < e <= 1:
            raise ValueError(f"fold_exponent: expected a number in (0, 1], got {e!r}")

    @classmethod
    def fit(cls, raw: np.ndarray) -> FeatureScaler:
        x = _log(raw)
        mean, std = np.zeros(NUM_FEATURES), np.ones(NUM_FEATURES)
        mean[:_LOG_COLUMNS] = x[:, :_LOG_COLUMNS].mean(axis=0)
        spread = x[:, :_LOG_COLUMNS].std(axis=0)
        std[:_LOG_COLUMNS] = np.where(spread > 1e-8, spread, 1.0)
        ranged = np.asarray(raw, dtype=np.float64)[:, [FEATURE_NAMES.index(f) for f in RANGE_FEATURES]]
        return cls(tuple(mean.tolist()), tuple(std.tolist()), tuple(ranged.min(axis=0).tolist()),
                   tuple(ranged.max(axis=0).tolist()))

    def outside(self, tables: Sequence[Table]) -> dict[str, tuple[float, float]]:
        """Each RANGE_FEATURES on which some table of `tables` exceeds the training range's high by more than
        RANGE_SLACK: (the greatest value, the high). Only the high side: a smaller, shorter or lighter table than any
        trained on costs less, where a network's error matters less. Empty when every table lies inside, or no range
        is known (an older checkpoint)."""
        if self.high is None or not tables:
            return {}
        values = np.array([[getattr(t, f) for f in RANGE_FEATURES] for t in tables], dtype=np.float64).max(axis=0)
        return {name: (float(v), hi) for name, v, hi in zip(RANGE_FEATURES, values, self.high)
                if v > hi * (1 + RANGE_SLACK)}

    def fold(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[n, 21] raw features -> (folded [n, 21], multiplicity [n]): a piece pooled or wider beyond the training
        range (as `outside` counts it) as k identical pieces inside it, whose encodings the cost network sums. A fused
        operator's work grows with lookups x width, which a sum of in-range pieces carries and a network reading
        log features beyond its range does not: pooling P is k = ceil(P / high) pieces pooled P / k; dim W is
        ceil(W / high) column slices (their size shrinks alike), weighing k ** fold_exponent. Only the features of
        `folds`; rows and bins stay. No range known: unchanged."""
        x = np.array(raw, dtype=np.float64, copy=True).reshape(-1, NUM_FEATURES)
        weight = np.ones(len(x))
        if self.high is None:
            return x, weight
        for name in self.folds:
            column, high = FEATURE_NAMES.index(name), self.high[RANGE_FEATURES.index(name)]
            beyond = x[:, column] > high * (1 + RANGE_SLACK)
            k = np.where(beyond, np.ceil(x[:, column] / high), 1.0)
            x[:, column] /= k
            if name == "dim":
                x[:, FEATURE_NAMES.index("size_gb")] /= k
            weight *= (k ** self.fold_exponent) if name == "dim" else k
        return x, weight

    def transform(self, raw: np.ndarray) -> np.ndarray:
        return ((_log(raw) - np.asarray(self.mean)) / np.asarray(self.std)).astype(np.float32)

    def to_dict(self) -> dict:
        d: dict = {"mean": list(self.mean), "std": list(self.std), "features": list(FEATURE_NAMES)}
        if self.low is not None and self.high is not None:
            d["range"] = {"features": list(RANGE_FEATURES), "low": list(self.low), "high": list(self.high),
                          "fold_exponent": self.fold_exponent}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> FeatureScaler:
        if list(d.get("features", [])) != list(FEATURE_NAMES):
            raise DataFormatError(f"feature scaler: expected features {FEATURE_NAMES}, got {d.get('features')}")
        ranged = d.get("range")
        if ranged is None:
            return cls(tuple(d["mean"]), tuple(d["std"]))
        n = len(RANGE_FEATURES)
        if (not isinstance(ranged, dict) or list(ranged.get("features", [])) != list(RANGE_FEATURES)
                or len(ranged.get("low", ())) != n or len(ranged.get("high", ())) != n):
            raise DataFormatError(f"feature scaler: range: expected features {list(RANGE_FEATURES)} with {n} low and "
                                  f"{n} high values, got {ranged!r}")
        exponent = ranged.get("fold_exponent", 1.0)
        try:
            return cls(tuple(d["mean"]), tuple(d["std"]), tuple(map(float, ranged["low"])),
                       tuple(map(float, ranged["high"])), fold_exponent=exponent)
        except ValueError as exc:
            raise DataFormatError(f"feature scaler: range: {exc}") from None


def _log(raw: np.ndarray) -> np.ndarray:
    x = np.array(raw, dtype=np.float64, copy=True)
    x[..., :_LOG_COLUMNS] = np.log1p(x[..., :_LOG_COLUMNS])
    return x
