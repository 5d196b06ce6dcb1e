"""`dreamshard profile`: a tables file whose statistics are measured from a sample of the user's own lookups.

Reads DLRM `.pt`/`.pt.gz` files and Parquet lookups (table, indices, offsets), streamed, and computes the
process stage's statistics per table (pooling factor, access-count bins, rows) within a memory bound. Input
formats, statistics and memory: docs/profile.md; the command: dreamshard/cli/profile.py.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from dreamshard.data.requests import list_column
from dreamshard.errors import DataFormatError, DreamShardError
from dreamshard.io import atomic_path, is_stdout
from dreamshard.limits import MAX_ROWS
from dreamshard.memory import GB
from dreamshard.tables import (
    BIN_COLUMNS,
    PROFILE_COLUMNS,
    REQUIRED_COLUMNS,
    Table,
    access_count_bins,
)

LOOKUP_COLUMNS = ("table", "indices", "offsets")
LOOKUPS_SCHEMA = pa.schema([
    pa.field("table", pa.string(), nullable=False),
    pa.field("indices", pa.list_(pa.int64()), nullable=False),
    pa.field("offsets", pa.list_(pa.int64()), nullable=False),
])
# the tables file written: what read_tables_file reads, then what the statistics were measured on
OUTPUT_COLUMNS = (*REQUIRED_COLUMNS, *BIN_COLUMNS, *PROFILE_COLUMNS)
OUTPUT_SUFFIXES = (".csv", ".parquet")
BYTES_PER_DISTINCT_ROW = 16  # an int64 row id and an int64 count


@dataclass(frozen=True)
class ProfileConfig:
    """max_memory_gb: bound on the count arrays of the tables being counted (see the module);
    progress: a progress bar on stderr."""

    max_memory_gb: float = 4.0
    progress: bool = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_memory_gb) and self.max_memory_gb > 0):
            raise ValueError(f"max_memory_gb must be a positive number, got {self.max_memory_gb}")


@dataclass(frozen=True)
class ProfiledTable:
    """One table's measured statistics (the fields of data/tables.parquet the process stage computes)."""

    name: str
    rows: int
    pooling_factor: float
    batch_size: int  # samples profiled
    num_lookups: int
    num_unique: int
    bins: tuple[float, ...]


# ---------------------------------------------------------------- counting


@dataclass
class _Counts:
    """A table's distinct rows seen so far (sorted) and their access counts."""

    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    samples: int = 0
    lookups: int = 0


class LookupCounter:
    """Per-table access counts with a bound on their memory; tables are finished one by one or at the end."""

    def __init__(self, config: ProfileConfig, rows: int | dict[str, int] | None = None) -> None:
        given = rows.items() if isinstance(rows, dict) else [("every table", rows)] if rows is not None else []
        for name, value in given:
            if not 1 <= value <= MAX_ROWS:
                raise DataFormatError(f"--rows: {name}: expected an integer in [1, {MAX_ROWS}], got {value}")
        self.config = config
        self.rows = rows
        self.max_tracked = int(config.max_memory_gb * GB) // BYTES_PER_DISTINCT_ROW
        self.tracked = 0
        self.open: dict[str, _Counts] = {}
        self.done: dict[str, ProfiledTable] = {}

    def add(self, name: str, indices: np.ndarray, lengths: np.ndarray, origin: str) -> None:
        """Count one batch of table `name`: `indices` its row ids, `lengths` its samples' lookup counts."""
        if name in self.done:
            raise DataFormatError(f"{origin}: table {name!r} was already profiled from an earlier input")
        if indices.size and indices.min() < 0:
            raise DataFormatError(f"{origin}: table {name!r}: indices: negative row id {int(indices.min())}")
        limit = self._given_rows(name, origin)
        if limit is not None and indices.size and indices.max() >= limit:
            raise DataFormatError(f"{origin}: table {name!r}: indices: row id {int(indices.max())} "
                                  f"is not below its {limit} rows (--rows)")
        c = self.open.setdefault(name, _Counts())
        c.samples += int(lengths.size)
        c.lookups += int(indices.size)
        if not indices.size:
            return
        uniq, cnt = np.unique(indices, return_counts=True)
        pos = np.searchsorted(c.ids, uniq)
        hit = pos < c.ids.size
        hit[hit] = c.ids[pos[hit]] == uniq[hit]
        new = ~hit
        num_new = int(new.sum())
        if self.tracked + num_new > self.max_tracked:
            raise DataFormatError(
                f"{origin}: table {name!r}: counting {self.tracked + num_new:,} distinct rows of {len(self.open)} "
                f"table(s) needs more than --max-memory-gb {self.config.max_memory_gb:g} "
                f"({BYTES_PER_DISTINCT_ROW} bytes a row); profile fewer lookups, or raise --max-memory-gb")
        c.counts[pos[hit]] += cnt[hit]  # uniq is unique: no position repeats
        if num_new:
            c.ids = np.insert(c.ids, pos[new], uniq[new])
            c.counts = np.insert(c.counts, pos[new], cnt[new])
        self.tracked += num_new

    def finish(self, name: str, origin: str) -> ProfiledTable:
        c = self.open.pop(name)
        self.tracked -= int(c.ids.size)
        if c.samples == 0:
            raise DataFormatError(f"{origin}: table {name!r}: no samples (every offsets list is [0]); "
                                  "its pooling factor is undefined")
        given = self._given_rows(name, origin)
        seen = int(c.ids[-1]) + 1 if c.ids.size else 0
        if seen > MAX_ROWS:
            raise DataFormatError(f"{origin}: table {name!r}: indices: row id {seen - 1} is beyond any embedding "
                                  f"table (at most {MAX_ROWS} rows)")
        from dreamshard.data.dlrm import MIN_ROWS  # imports torch: only when profiling

        table = ProfiledTable(
            name=name,
            rows=given if given is not None else max(MIN_ROWS, seen),
            pooling_factor=c.lookups / c.samples,
            batch_size=c.samples,
            num_lookups=c.lookups,
            num_unique=int(c.ids.size),
            bins=tuple(access_count_bins(c.counts)),
        )
        self.done[name] = table
        return table

    def finish_all(self, origin: str) -> None:
        for name in list(self.open):
            self.finish(name, origin)

    def _given_rows(self, name: str, origin: str) -> int | None:
        if isinstance(self.rows, dict):
            if name not in self.rows:
                raise DataFormatError(f"{origin}: table {name!r} has no rows in the --rows file")
            return self.rows[name]
        return self.rows


# ---------------------------------------------------------------- inputs


def profile_lookups(paths: Sequence[str | Path], config: ProfileConfig | None = None,
                    rows: int | dict[str, int] | None = None) -> list[ProfiledTable]:
    """The statistics of every table in the lookup files `paths` (DLRM .pt/.pt.gz or Parquet, see the module),
    in the order tables first appear. `rows`: each table's row count (one for all, or by name); None:
    max(100, max index + 1)."""
    cfg = config or ProfileConfig()
    if not paths:
        raise DreamShardError("profile: no lookup files given")
    from dreamshard.data.dlrm import is_dataset_file  # imports torch: only when profiling, not with the CLI's parser

    counter = LookupCounter(cfg, rows)
    order: list[str] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise DataFormatError(f"{path}: no such file")
        if is_dataset_file(path):
            names = _count_dlrm(path, counter, cfg)
        elif path.suffix == ".parquet":
            names = _count_parquet(path, counter, cfg)
        else:
            raise DataFormatError(f"{path}: expected lookups as a DLRM .pt / .pt.gz file or a .parquet file")
        order.extend(n for n in names if n not in order)
    counter.finish_all(", ".join(map(str, paths)))
    if isinstance(rows, dict):
        unused = sorted(set(rows) - set(order))
        if unused:
            raise DataFormatError(f"--rows: table(s) {', '.join(map(repr, unused[:5]))} not in the lookups")
    return [counter.done[n] for n in order]


def _count_dlrm(path: Path, counter: LookupCounter, cfg: ProfileConfig) -> list[str]:
    from dreamshard.data.dlrm import load_dlrm_file

    batch = load_dlrm_file(path)
    stem = path.name.split(".pt")[0]
    names = []
    for t in tqdm(range(batch.num_tables), desc=path.name, unit="table", file=sys.stderr, disable=not cfg.progress):
        name = f"{stem}/t{t:04d}"
        if name in counter.open or name in counter.done:
            raise DataFormatError(f"{path}: table {name!r} appears in an earlier input too")
        indices, lengths = batch.table(t)
        counter.add(name, indices, lengths, str(path))
        counter.finish(name, str(path))
        names.append(name)
    return names


def _count_parquet(path: Path, counter: LookupCounter, cfg: ProfileConfig) -> list[str]:
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for files that are not Parquet
        raise DataFormatError(f"{path}: cannot be read as Parquet: {exc}") from exc
    _check_lookup_schema(pf.schema_arrow, path)
    names: list[str] = []
    groups = range(pf.num_row_groups)
    for g in tqdm(groups, desc=path.name, unit="row group", file=sys.stderr, disable=not cfg.progress):
        try:
            data = pf.read_row_group(g, columns=list(LOOKUP_COLUMNS))
        except Exception as exc:  # corrupt pages
            raise DataFormatError(f"{path}: row group {g}: cannot be read: {exc}") from exc
        where = f"{path}: row group {g}"
        for name, indices, lengths in _row_group_batches(data, where):
            if name in counter.done:
                raise DataFormatError(f"{where}: table {name!r} appears in an earlier DLRM input too")
            counter.add(name, indices, lengths, where)
            if name not in names:
                names.append(name)
    return names


def _check_lookup_schema(schema: pa.Schema, path: Path) -> None:
    missing = [c for c in LOOKUP_COLUMNS if c not in schema.names]
    if missing:
        raise DataFormatError(f"{path}: missing column(s) {', '.join(missing)}; expected table (string), "
                              "indices (list<int64>), offsets (list<int64>)")
    kind = schema.field("table").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataFormatError(f"{path}: table: expected a string column, got {kind}")
    for c in ("indices", "offsets"):
        kind = schema.field(c).type
        ok = (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type)
        if not ok:
            raise DataFormatError(f"{path}: {c}: expected a list of integers (list<int64>), got {kind}")


def _row_group_batches(data: pa.Table, where: str) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(table, indices, lengths) per table of a row group, its rows of one table concatenated in order, checked."""
    tables = data.column("table")
    if tables.null_count:
        raise DataFormatError(f"{where}: table: null names; expected a name in every row")
    if data.num_rows == 0:
        return
    names = tables.to_numpy()
    idx_values, idx_pos = list_column(data.column("indices"), "indices", where)
    off_values, off_pos = list_column(data.column("offsets"), "offsets", where)

    def bad_row(rows: np.ndarray, what: Callable[[int], str]) -> DataFormatError:
        r = int(np.flatnonzero(rows)[0])
        return DataFormatError(f"{where}, row {r} (table {names[r]!r}): offsets: {what(r)}")

    off_sizes = np.diff(off_pos)
    if (off_sizes == 0).any():
        raise bad_row(off_sizes == 0, lambda r: "empty; expected B + 1 >= 1 entries, the first 0")
    first = off_values[off_pos[:-1]]
    if (first != 0).any():
        raise bad_row(first != 0, lambda r: f"expected offsets[0] = 0, got {first[r]}")
    steps = np.diff(off_values[off_pos[0]:off_pos[-1]])
    within = np.ones(steps.size, dtype=bool)
    within[off_pos[1:-1] - off_pos[0] - 1] = False  # from one row's last offset to the next row's first
    step_row = np.repeat(np.arange(len(names)), off_sizes - 1)  # the row of each step within a row
    falling = np.zeros(len(names), dtype=bool)
    falling[step_row[steps[within] < 0]] = True
    if falling.any():
        raise bad_row(falling, lambda r: "expected non-decreasing offsets")
    idx_sizes = np.diff(idx_pos)
    last = off_values[off_pos[1:] - 1]
    if (last != idx_sizes).any():
        raise bad_row(last != idx_sizes, lambda r: f"last offset {last[r]} != number of indices {idx_sizes[r]}")
    indices = idx_values[idx_pos[0]:idx_pos[-1]]
    lengths = steps[within]
    codes, uniques = pd.factorize(names)
    if len(uniques) == 1:
        yield str(uniques[0]), indices, lengths
        return
    by_index = _split_by(indices, np.repeat(codes, idx_sizes), len(uniques))
    by_length = _split_by(lengths, np.repeat(codes, off_sizes - 1), len(uniques))
    yield from ((str(n), i, g) for n, i, g in zip(uniques, by_index, by_length))


def _split_by(values: np.ndarray, codes: np.ndarray, n: int) -> list[np.ndarray]:
    """values grouped by code 0..n-1, each group in its original order."""
    order = np.argsort(codes, kind="stable")
    return np.split(values[order], np.cumsum(np.bincount(codes, minlength=n))[:-1])


def write_lookups_parquet(path: str | Path, batches: Iterable[tuple[str, np.ndarray, np.ndarray]],
                          rows_per_group: int = 64) -> None:
    """Write (table, indices, offsets) batches in the Parquet lookup format, atomically; a row group
    every `rows_per_group` batches."""
    if rows_per_group < 1:
        raise ValueError(f"rows_per_group must be >= 1, got {rows_per_group}")
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, LOOKUPS_SCHEMA) as writer:
        rows: list[dict[str, Any]] = []
        for name, indices, offsets in batches:
            rows.append({"table": name, "indices": np.asarray(indices, dtype=np.int64),
                         "offsets": np.asarray(offsets, dtype=np.int64)})
            if len(rows) == rows_per_group:
                writer.write_table(pa.Table.from_pylist(rows, schema=LOOKUPS_SCHEMA))
                rows = []
        if rows:
            writer.write_table(pa.Table.from_pylist(rows, schema=LOOKUPS_SCHEMA))


# ---------------------------------------------------------------- output


def check_dims(dims: int | dict[str, int]) -> None:
    """Every dim a positive multiple of 4 (what FBGEMM and Table require)."""
    for name, dim in (dims.items() if isinstance(dims, dict) else [("every table", dims)]):
        if dim < 4 or dim % 4:
            raise DataFormatError(f"--dim: {name}: expected a positive multiple of 4, got {dim}")


def write_profile(tables: Sequence[ProfiledTable], dims: int | dict[str, int], path: str | Path) -> list[Table]:
    """Write the tables file (CSV or Parquet by suffix) atomically; `dims`: one for all, or by name.
    Returns the tables as read_tables_file will read them."""
    path = Path(path)
    check_output_suffix(path)
    check_dims(dims)
    records, out = [], []
    for t in tables:
        if isinstance(dims, dict):
            if t.name not in dims:
                raise DataFormatError(f"--dim: table {t.name!r} has no dim in the --dim file")
            dim = dims[t.name]
        else:
            dim = dims
        out.append(Table(t.name, t.rows, dim, t.pooling_factor, t.bins))
        records.append({"name": t.name, "rows": t.rows, "dim": dim, "pooling_factor": t.pooling_factor,
                        **dict(zip(BIN_COLUMNS, t.bins)), "batch_size": t.batch_size,
                        "num_lookups": t.num_lookups, "num_unique": t.num_unique})
    if isinstance(dims, dict):
        unused = sorted(set(dims) - {t.name for t in tables})
        if unused:
            raise DataFormatError(f"--dim: table(s) {', '.join(map(repr, unused[:5]))} not in the lookups")
    frame = pd.DataFrame.from_records(records, columns=list(OUTPUT_COLUMNS))
    with atomic_path(path, "-o", stdout=True) as tmp:  # `-`: CSV on standard output
        if path.suffix == ".csv" or is_stdout(path):
            frame.to_csv(tmp, index=False)
        else:
            frame.to_parquet(tmp, index=False)
    return out


def check_output_suffix(path: Path) -> None:
    """The output is a tables file: .csv or .parquet, or `-` (CSV on standard output)."""
    if path.suffix not in OUTPUT_SUFFIXES and not is_stdout(path):
        raise DreamShardError(f"-o/--output {path}: expected a .csv or .parquet tables file")
