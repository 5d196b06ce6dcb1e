"""Each table's lookups (a sample of the batch) as the kernels consume them: data/requests.parquet."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dreamshard.errors import DataFormatError

REQUESTS_SCHEMA = pa.schema(
    [
        pa.field("table_id", pa.int32(), nullable=False),
        pa.field("batch_size", pa.int32(), nullable=False),
        pa.field("lengths", pa.list_(pa.int32()), nullable=False),
        pa.field("indices", pa.list_(pa.int64()), nullable=False),
    ]
)


@dataclass(frozen=True)
class TableRequests:
    """One table's lookups: sample b reads indices[offsets[b]:offsets[b+1]]."""

    indices: np.ndarray
    lengths: np.ndarray

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])


def _list_array(arrays: Sequence[np.ndarray], value_type: pa.DataType) -> pa.ListArray:
    offsets = np.concatenate([[0], np.cumsum([len(a) for a in arrays])]).astype(np.int32)
    values = np.concatenate(arrays) if arrays else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=value_type))


def requests_to_arrow(table_ids: Sequence[int], requests: Sequence[TableRequests]) -> pa.Table:
    return pa.Table.from_arrays(
        [
            pa.array(table_ids, pa.int32()),
            pa.array([r.batch_size for r in requests], pa.int32()),
            _list_array([r.lengths for r in requests], pa.int32()),
            _list_array([r.indices for r in requests], pa.int64()),
        ],
        schema=REQUESTS_SCHEMA,
    )


def list_column(column: pa.ChunkedArray, name: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(values as int64, per-row offsets into them) of a list-of-integers column, checked for nulls: its only chunk
    as it is (combine_chunks would copy even that), or the chunks joined."""
    arr: Any = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if arr.null_count:
        raise DataFormatError(f"{where}: {name}: null lists; expected a list in every row")
    if arr.values.null_count:
        raise DataFormatError(f"{where}: {name}: null entries; expected integers")
    values = arr.values.to_numpy(zero_copy_only=False)
    if values.dtype == np.uint64 and values.size and values.max() > np.iinfo(np.int64).max:
        raise DataFormatError(f"{where}: {name}: values beyond int64")
    # each row's bounds in .values (absolute, a sliced array's too)
    return values.astype(np.int64, copy=False), arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)


def read_requests(path: str | Path) -> dict[int, TableRequests]:
    """Each table's lookups, by table id. A table's indices are a read-only view of the column read once, not a copy
    per table: copying every table's ids was most of a measuring stage's start (results/make-run-time)."""
    table = pq.read_table(path)
    missing = [n for n in REQUESTS_SCHEMA.names if n not in table.column_names]
    if missing:
        raise DataFormatError(f"{path}: missing column(s) {', '.join(missing)}")
    for name in ("lengths", "indices"):
        kind = table.schema.field(name).type
        if not pa.types.is_list(kind) or not pa.types.is_integer(kind.value_type):
            raise DataFormatError(f"{path}: column {name!r} is {kind}, expected a list of integers")
    ids = table.column("table_id").to_numpy()
    index_values, io = list_column(table.column("indices"), "indices", str(path))
    length_values, lo = list_column(table.column("lengths"), "lengths", str(path))
    for values in (length_values, index_values):
        values.flags.writeable = False  # a copy (from narrower ints) too: a table's recorded lookups are read-only
    out = {}
    for row, table_id in enumerate(ids):
        r = TableRequests(index_values[io[row]:io[row + 1]], length_values[lo[row]:lo[row + 1]])
        if r.lengths.sum() != len(r.indices):
            raise DataFormatError(f"{path}: table {table_id}: lengths sum to {r.lengths.sum()}, {len(r.indices)} indices")
        out[int(table_id)] = r
    return out
