"""process: per-table statistics (data/tables.parquet) and each table's lookups for the kernels.

The lookups kept are the first `process.sample_batch` samples of each table's batch
(all of them when the batch is smaller): statistics use the whole batch, kernels a
sample, so the requests file stays small for the real dataset's 65,536-sample batches.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from dreamshard.project.data import MANIFEST, TableRequests, load_dlrm_file, requests_to_arrow, table_statistics
from dreamshard.project.domain import BIN_COLUMNS, TABLE_STATS_SCHEMA, DataFormatError, write_parquet
from dreamshard.project.params import ParamsError, section


def run(params: dict[str, Any]) -> None:
    raw = Path(section(params, "paths.raw"))
    sample_batch = section(params, "process.sample_batch")
    if not isinstance(sample_batch, int) or sample_batch < 1:
        raise ParamsError(f"params.yaml: process.sample_batch: expected a positive integer, got {sample_batch!r}")
    try:
        manifest = json.loads((raw / MANIFEST).read_text())
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        raise DataFormatError(f"{raw / MANIFEST}: cannot read the download manifest: {exc}") from None
    stats_rows, requests = [], []
    for fname in manifest["files"]:
        batch = load_dlrm_file(raw / fname)
        stem = fname.split(".pt")[0]
        for t in range(batch.num_tables):
            table_id = len(stats_rows)
            indices, lengths = batch.table(t)
            s = table_statistics(indices, lengths)
            stats_rows.append({
                "table_id": table_id, "name": f"{stem}/t{t:04d}", "source": manifest["source"],
                "source_file": fname, "file_table_index": t, "rows": s.rows,
                "pooling_factor": s.pooling_factor, "batch_size": batch.batch_size,
                "num_lookups": s.num_lookups, "num_unique": s.num_unique,
                **dict(zip(BIN_COLUMNS, s.bins)),
            })
            sample_indices, sample_lengths = batch.table(t, sample_batch)
            requests.append(TableRequests(sample_indices, sample_lengths))
        print(f"process: {fname}: {batch.num_tables} tables, batch {batch.batch_size}")
    write_parquet(pa.Table.from_pylist(stats_rows, schema=TABLE_STATS_SCHEMA), section(params, "paths.tables"))
    write_parquet(requests_to_arrow(range(len(requests)), requests), section(params, "paths.requests"))
    print(f"process: {len(stats_rows)} tables -> {section(params, 'paths.tables')}")
