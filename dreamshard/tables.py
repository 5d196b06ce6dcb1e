"""Embedding tables: the `Table` type, table-statistics artifacts and user tables files.

A table's statistics (what DreamShard's features are made of) are its rows, its
pooling factor (mean lookups per sample) and a 17-bin histogram of how often its
rows are accessed: bin 0 holds the fraction of the table's distinct accessed rows
seen once, bin k (1..15) those seen (2^(k-1), 2^k] times, bin 16 those seen more
than 2^15 times. Its dimension is chosen per task.
"""
from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from dreamshard.errors import DataFormatError
from dreamshard.io import check_names, read_csv_cells
from dreamshard.limits import MAX_DIM, MAX_POOLING_FACTOR, MAX_ROWS

NUM_BINS = 17
BIN_COLUMNS = [f"bin_{i}" for i in range(NUM_BINS)]
# a table's bins are fractions of its accessed rows: they sum to 1 within this (two-decimal rounding passes), or
# are all 0 (a table nobody looked up, as `dreamshard profile` writes it)
BINS_SUM_TOLERANCE = 0.01
# a user's tables file: its columns, required and optional
REQUIRED_COLUMNS = ("name", "rows", "dim", "pooling_factor")
CONSTRAINT_COLUMNS = ("group", "pin", "avoid", "whole")  # placement constraints, read by dreamshard.data.cluster
PROFILE_COLUMNS = ("batch_size", "num_lookups", "num_unique")  # what `dreamshard profile` measured the bins on
TABLES_FILE_COLUMNS = (*REQUIRED_COLUMNS, *BIN_COLUMNS, *CONSTRAINT_COLUMNS, *PROFILE_COLUMNS)
_EXPECTED_COLUMNS = (f"{', '.join(REQUIRED_COLUMNS)}[, bin_0..bin_16][, {', '.join(CONSTRAINT_COLUMNS)}]"
                     f"[, {', '.join(PROFILE_COLUMNS)}]")
# how a missing number may be written (pandas' and R's spellings); names and group labels have no such spelling
MISSING_NUMBER = frozenset({"", "na", "n/a", "#n/a", "nan", "null", "none", "<na>"})

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
    features: int = 1  # features whose ids look this table up (TorchRec: one pooled output each per sample)
    # a row-wise block of a table (sharders/pieces.py): that table's pooling factor, by which TorchRec sizes
    # the block's buffers (the ids of every sample, a partial sum for every sample); None for a table
    block_of_pooling: float | None = None
    # its weights' precision when it differs from the task's (a TorchRec module mixing fp32 and fp16 tables)
    precision: str | None = None
    # looked up by an EmbeddingCollection (sequence embeddings): every id returns its row, nothing is pooled
    sequence: bool = False
    # UVM caching (dreamshard.caching): weights in host memory, this share of its rows cached in HBM; None: in HBM
    cache_load_factor: float | None = None

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError(f"table {self.name!r}: rows must be >= 1, got {self.rows}")
        if self.dim < 4 or self.dim % 4:
            raise ValueError(f"table {self.name!r}: dim must be a positive multiple of 4 (FBGEMM), got {self.dim}")
        if not self.pooling_factor >= 0 or math.isinf(self.pooling_factor):
            raise ValueError(f"table {self.name!r}: pooling_factor must be finite and >= 0, got {self.pooling_factor}")
        if isinstance(self.features, bool) or not isinstance(self.features, int) or self.features < 1:
            raise ValueError(f"table {self.name!r}: features must be an integer >= 1, got {self.features!r}")
        if not isinstance(self.sequence, bool):
            raise ValueError(f"table {self.name!r}: sequence must be true or false, got {self.sequence!r}")
        if self.cache_load_factor is not None and not 0 <= self.cache_load_factor <= 1:
            raise ValueError(f"table {self.name!r}: cache_load_factor must be in [0, 1] (0: wholly in host memory), "
                             f"got {self.cache_load_factor!r}")
        if self.bins is not None and len(self.bins) != NUM_BINS:
            raise ValueError(f"table {self.name!r}: expected {NUM_BINS} access-count bins, got {len(self.bins)}")

    def with_dim(self, dim: int) -> Table:
        return replace(self, dim=dim)

    def block(self, row_start: int, row_end: int, width: int | None = None) -> Table:
        """Rows [row_start, row_end) of this table (`width` columns of it, all by default) as a table of its own:
        its rows' share of the lookups (pooling x block rows / rows: hot rows are scattered over a table), the
        table's bins, and `block_of_pooling` by which TorchRec sizes a row-wise shard's buffers. The one rule by
        which every cost model, memory count and sharder prices a row piece."""
        width = self.dim if width is None else width
        rows = row_end - row_start
        if not 0 <= row_start < row_end <= self.rows:
            raise ValueError(f"table {self.name!r}: rows [{row_start}, {row_end}) are not a block of its {self.rows}")
        return replace(self, name=f"{self.name}[rows {row_start}:{row_end}]", rows=rows, dim=width,
                       pooling_factor=self.pooling_factor * rows / self.rows, block_of_pooling=self.pooling_factor)

    def piece(self, row_start: int, row_end: int, width: int) -> Table:
        """Rows [row_start, row_end) x `width` columns of this table as the cost models see it: the table itself
        at that width when the rows are all of them, its `block` otherwise."""
        if (row_start, row_end) == (0, self.rows):
            return replace(self, dim=width)
        return self.block(row_start, row_end, width)


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


def missing_number(value: Any) -> bool:
    """A cell of a numeric column (a bin, pin, avoid, whole) left empty: a missing value, not a number."""
    if isinstance(value, str):
        return value.strip().lower() in MISSING_NUMBER
    return value is None or (pd.api.types.is_scalar(value) and bool(pd.isna(value)))


def read_tables_file(path: str | Path) -> list[Table]:
    """Read a user's tables file (CSV or Parquet): name, rows, dim, pooling_factor[, bin_0..bin_16].

    A table whose 17 bins are all empty (NaN, null) has no bins, as in a file without bin
    columns: `dreamshard profile` measures them, dreamshard.data.bins estimates them.
    """
    df, places = read_tables_frame(path)
    return tables_from_frame(df, str(path), places)


def read_tables_frame(path: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """The cells of a tables file, and where each row is in it ("line 3" of a CSV, the header being line 1;
    "row 1" of a Parquet file). Names and group labels are strings exactly as written (a CSV is read without
    NA or number parsing: `NA`, `007` and `1e3` stay names); an unknown column, a table name that is empty or
    (in Parquet) not a string is a DataFormatError naming the file, the column and the line or row."""
    path = Path(path)
    if not path.exists():
        raise DataFormatError(f"{path}: no such file")
    if path.suffix == ".csv":
        header, records = read_csv_cells(path, "tables file")
        check_names(header, TABLES_FILE_COLUMNS, str(path), expected=_EXPECTED_COLUMNS)
        df = pd.DataFrame([cells for _, cells in records], columns=header, dtype=object)
        places = [f"line {line}" for line, _ in records]
    elif path.suffix == ".parquet":
        try:
            df = pd.read_parquet(path)
        except Exception as exc:  # pandas/pyarrow raise many types for unreadable files
            raise DataFormatError(f"{path}: cannot read tables file: {exc}") from exc
        check_names([str(c) for c in df.columns], TABLES_FILE_COLUMNS, str(path), expected=_EXPECTED_COLUMNS)
        places = [f"row {i}" for i in range(1, len(df) + 1)]
    else:
        raise DataFormatError(f"{path}: expected a .csv or .parquet tables file")
    if "name" in df.columns:
        spelt: dict[str, tuple[str, str]] = {}  # NFC name -> the first spelling of it, and where
        for name, place in zip(df["name"], places):
            if not isinstance(name, str) and not missing_number(name):
                raise DataFormatError(f"{path}: {place}: column 'name': expected a string (a table name), got "
                                      f"{type(name).__name__} {name!r}; write table names as strings")
            if not isinstance(name, str) or not name.strip():
                raise DataFormatError(f"{path}: {place}: column 'name': the table name is empty; every table needs "
                                      "one")
            first = spelt.setdefault(unicodedata.normalize("NFC", name), (name, place))
            if first[0] != name:
                raise DataFormatError(f"{path}: column 'name': {first[0]!r} ({first[1]}) and {name!r} ({place}) are "
                                      "one name in two Unicode spellings (NFC, NFD); rename one of the tables")
        df = df.assign(name=[unicodedata.normalize("NFC", n) for n in df["name"]])  # one spelling everywhere
    return df, places


def tables_from_frame(df: pd.DataFrame, origin: str, places: list[str] | None = None) -> list[Table]:
    """The tables of a tables file's cells (read_tables_frame); `places` says where each row is, for errors."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise DataFormatError(f"{origin}: missing column(s) {', '.join(missing)}; expected {', '.join(REQUIRED_COLUMNS)}")
    present_bins = [c for c in BIN_COLUMNS if c in df.columns]
    if present_bins and len(present_bins) != NUM_BINS:
        absent = [c for c in BIN_COLUMNS if c not in df.columns]
        raise DataFormatError(f"{origin}: has some access-count bins but lacks {', '.join(absent)}; give all 17 or none")
    if df.empty:
        raise DataFormatError(f"{origin}: no tables")
    places = places or [f"row {i}" for i in range(1, len(df) + 1)]
    seen: dict[str, str] = {}
    for name, place in zip(df["name"], places):
        if name in seen:
            raise DataFormatError(f"{origin}: column 'name': table name {name!r} appears more than once ({seen[name]} "
                                  f"and {place})")
        seen[name] = place
    tables = []
    for place, rec in zip(places, df.to_dict("records")):
        where = f"{origin}: table {rec['name']!r} ({place})"
        try:
            rows = _as_int(rec["rows"], "rows", MAX_ROWS)
            dim = _as_int(rec["dim"], "dim", MAX_DIM)
            pooling = _as_float(rec["pooling_factor"], "pooling_factor")
            if not 0 <= pooling <= MAX_POOLING_FACTOR:  # NaN too
                raise ValueError(f"column 'pooling_factor': expected a mean number of lookups per sample in "
                                 f"[0, {MAX_POOLING_FACTOR}], got {pooling:g}")
            bins = tuple(math.nan if missing_number(rec[c]) else _as_float(rec[c], c) for c in BIN_COLUMNS) \
                if present_bins else None
        except (TypeError, ValueError) as exc:
            raise DataFormatError(f"{where}: {exc}") from None
        if bins is not None and all(math.isnan(b) for b in bins):
            bins = None  # this table's bins left empty: unknown, like a file without bin columns
        if bins is not None and any(math.isnan(b) for b in bins):
            empty = [c for c, b in zip(BIN_COLUMNS, bins) if math.isnan(b)]
            raise DataFormatError(f"{where}: access-count bins {', '.join(empty)} empty; give all 17 or leave all empty")
        if bins is not None and any(not (0.0 <= b <= 1.0) for b in bins):
            bad = next(f"{c} = {b:g}" for c, b in zip(BIN_COLUMNS, bins) if not 0.0 <= b <= 1.0)
            raise DataFormatError(f"{where}: access-count bins must be fractions in [0, 1], got {bad}")
        if bins is not None and abs(sum(bins) - 1) > BINS_SUM_TOLERANCE and any(bins):
            raise DataFormatError(f"{where}: access-count bins sum to {sum(bins):g}; expected fractions of the "
                                  f"table's accessed rows that sum to 1 (within {BINS_SUM_TOLERANCE:g}), or all 0 "
                                  "for a table never looked up")
        try:
            tables.append(Table(str(rec["name"]), rows, dim, pooling, bins))
        except ValueError as exc:
            raise DataFormatError(f"{origin}: {exc}") from None
    return tables


def _as_float(value: Any, field: str) -> float:
    if isinstance(value, bool) or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"column {field!r}: expected a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"column {field!r}: expected a number, got {value!r}") from None


def _as_int(value: Any, field: str, limit: int) -> int:
    """An integer cell of column `field`, at most `limit` (dreamshard.limits: each column its own)."""
    f = _as_float(value, field)
    if abs(f) > limit:  # before is_integer: inf is no integer, but the limit is what to say
        raise ValueError(f"column {field!r}: {f:g} is more than {limit}, the most this tool accepts "
                         "(dreamshard.limits)")
    if not f.is_integer():
        raise ValueError(f"column {field!r}: expected an integer, got {value!r}")
    return int(f)
