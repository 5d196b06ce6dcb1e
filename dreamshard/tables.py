"""Embedding tables: the `Table` type, table-statistics artifacts and user tables files.

A table's statistics (what DreamShard's features are made of) are its rows, its
pooling factor (mean lookups per sample) and a 17-bin histogram of how often its
rows are accessed: bin 0 holds the fraction of the table's distinct accessed rows
seen once, bin k (1..15) those seen (2^(k-1), 2^k] times, bin 16 those seen more
than 2^15 times. Its dimension is chosen per task.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import pyarrow as pa

from dreamshard.errors import DataFormatError

NUM_BINS = 17
BIN_COLUMNS = [f"bin_{i}" for i in range(NUM_BINS)]

# data/tables.parquet: one row per table, with provenance.
TABLE_STATS_SCHEMA = pa.schema(
    [
        pa.field("table_id", pa.int32(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # "dlrm" or "synthetic"
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("file_table_index", pa.int32(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("pooling_factor", pa.float64(), nullable=False),
        pa.field("batch_size", pa.int64(), nullable=False),
        pa.field("num_lookups", pa.int64(), nullable=False),
        pa.field("num_unique", pa.int64(), nullable=False),
        *[pa.field(c, pa.float64(), nullable=False) for c in BIN_COLUMNS],
    ]
)


@dataclass(frozen=True)
class Table:
    """One embedding table as placed in a task: statistics plus its dimension."""

    name: str
    rows: int
    dim: int
    pooling_factor: float
    bins: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError(f"table {self.name!r}: rows must be >= 1, got {self.rows}")
        if self.dim < 4 or self.dim % 4:
            raise ValueError(f"table {self.name!r}: dim must be a positive multiple of 4 (FBGEMM), got {self.dim}")
        if not self.pooling_factor >= 0 or math.isinf(self.pooling_factor):
            raise ValueError(f"table {self.name!r}: pooling_factor must be finite and >= 0, got {self.pooling_factor}")
        if self.bins is not None and len(self.bins) != NUM_BINS:
            raise ValueError(f"table {self.name!r}: expected {NUM_BINS} access-count bins, got {len(self.bins)}")

    def with_dim(self, dim: int) -> Table:
        return replace(self, dim=dim)


def access_count_bins(counts) -> list[float]:
    """Fractions of distinct rows whose access count falls in each of the 17 bins."""
    import numpy as np

    counts = np.asarray(counts)
    counts = counts[counts > 0]
    if counts.size == 0:
        return [0.0] * NUM_BINS  # a table nobody looked up has no accessed rows
    idx = np.minimum(np.ceil(np.log2(counts)).astype(np.int64), NUM_BINS - 1)
    hist = np.bincount(idx, minlength=NUM_BINS)
    return (hist / counts.size).tolist()


def read_tables_file(path: str | Path) -> list[Table]:
    """Read a user's tables file (CSV or Parquet): name, rows, dim, pooling_factor[, bin_0..bin_16].

    A table whose 17 bins are all empty (NaN, null) has no bins, as in a file without bin
    columns: `dreamshard profile` measures them, dreamshard.data.bins estimates them.
    """
    path = Path(path)
    if not path.exists():
        raise DataFormatError(f"{path}: no such file")
    try:
        if path.suffix == ".parquet":
            df = pd.read_parquet(path)
        elif path.suffix == ".csv":
            df = pd.read_csv(path)
        else:
            raise DataFormatError(f"{path}: expected a .csv or .parquet tables file")
    except DataFormatError:
        raise
    except Exception as exc:  # pandas/pyarrow raise many types for unreadable files
        raise DataFormatError(f"{path}: cannot read tables file: {exc}") from exc
    return tables_from_frame(df, str(path))


def tables_from_frame(df: pd.DataFrame, origin: str) -> list[Table]:
    required = ["name", "rows", "dim", "pooling_factor"]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DataFormatError(f"{origin}: missing column(s) {', '.join(missing)}; expected {', '.join(required)}")
    present_bins = [c for c in BIN_COLUMNS if c in df.columns]
    if present_bins and len(present_bins) != NUM_BINS:
        absent = [c for c in BIN_COLUMNS if c not in df.columns]
        raise DataFormatError(f"{origin}: has some access-count bins but lacks {', '.join(absent)}; give all 17 or none")
    if df.empty:
        raise DataFormatError(f"{origin}: no tables")
    names = df["name"].astype(str)
    dup = names[names.duplicated()]
    if not dup.empty:
        raise DataFormatError(f"{origin}: column 'name': table name {dup.iloc[0]!r} appears more than once")
    tables = []
    for line, row in enumerate(df.itertuples(index=False), start=2):
        rec = row._asdict()
        where = f"{origin}: table {rec['name']!r} (row {line})"
        try:
            rows = _as_int(rec["rows"], "rows")
            dim = _as_int(rec["dim"], "dim")
            pooling = float(rec["pooling_factor"])
            bins = tuple(math.nan if pd.isna(rec[c]) else float(rec[c]) for c in BIN_COLUMNS) if present_bins else None
        except (TypeError, ValueError) as exc:
            raise DataFormatError(f"{where}: {exc}") from None
        if bins is not None and all(math.isnan(b) for b in bins):
            bins = None  # this table's bins left empty: unknown, like a file without bin columns
        if bins is not None and any(math.isnan(b) for b in bins):
            empty = [c for c, b in zip(BIN_COLUMNS, bins) if math.isnan(b)]
            raise DataFormatError(f"{where}: access-count bins {', '.join(empty)} empty; give all 17 or leave all empty")
        if bins is not None and any(not (0.0 <= b <= 1.0) for b in bins):
            raise DataFormatError(f"{where}: access-count bins must be fractions in [0, 1]")
        try:
            tables.append(Table(str(rec["name"]), rows, dim, pooling, bins))
        except ValueError as exc:
            raise DataFormatError(f"{origin}: {exc}") from None
    return tables


MAX_INT_FIELD = 2**40  # rows or dims beyond this are no embedding table, and would overflow byte counts


def _as_int(value, field: str) -> int:
    f = float(value)
    if not f.is_integer():
        raise ValueError(f"column {field!r}: expected an integer, got {value!r}")
    if abs(f) > MAX_INT_FIELD:
        raise ValueError(f"column {field!r}: {value!r} is out of range (at most {MAX_INT_FIELD})")
    return int(f)
