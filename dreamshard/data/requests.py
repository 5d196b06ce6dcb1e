"""Each table's lookups (a sample of the batch) as the kernels consume them: data/requests.parquet."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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


def read_requests(path: str | Path) -> dict[int, TableRequests]:
    table = pq.read_table(path)
    missing = [n for n in REQUESTS_SCHEMA.names if n not in table.column_names]
    if missing:
        raise DataFormatError(f"{path}: missing column(s) {', '.join(missing)}")
    out = {}
    ids = table.column("table_id").to_numpy()
    lengths = table.column("lengths").combine_chunks()
    indices = table.column("indices").combine_chunks()
    for row, table_id in enumerate(ids):
        r = TableRequests(indices[row].values.to_numpy().astype(np.int64),
                          lengths[row].values.to_numpy().astype(np.int64))
        if r.lengths.sum() != len(r.indices):
            raise DataFormatError(f"{path}: table {table_id}: lengths sum to {r.lengths.sum()}, {len(r.indices)} indices")
        out[int(table_id)] = r
    return out
