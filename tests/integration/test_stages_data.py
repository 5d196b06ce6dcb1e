"""The download and process stages: the tiny project's synthetic dataset, and special input written in tmp_path."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from dreamshard.data.dlrm import load_dlrm_file, table_statistics
from dreamshard.data.requests import REQUESTS_SCHEMA, read_requests
from dreamshard.errors import DataFormatError
from dreamshard.project.params import ParamsError
from dreamshard.tables import BIN_COLUMNS, TABLE_STATS_SCHEMA
from stages import download, process

NUM_TABLES, BATCH, SAMPLE = 6, 64, 16


def make_params(tmp_path, **overrides):
    params = {
        "paths": {
            "raw": str(tmp_path / "data/raw"),
            "tables": str(tmp_path / "data/tables.parquet"),
            "requests": str(tmp_path / "data/requests.parquet"),
            "tasks": str(tmp_path / "data/tasks"),
        },
        "data": {
            "source": "synthetic",
            "dlrm_paths": [],
            "synthetic": {"num_tables": NUM_TABLES, "batch_size": BATCH, "max_rows": 5000, "seed": 1},
        },
        "process": {"sample_batch": SAMPLE},
    }
    for group, values in overrides.items():
        params[group].update(values)
    return params


@pytest.fixture(scope="module")
def processed(tiny_project):
    """(root, params) of the tiny project after download and process (read-only)."""
    level = tiny_project("processed")
    return level.root, level.params


def sizes(params) -> tuple[int, int, int]:
    """(tables, batch, sample batch) of synthetic params."""
    synthetic = params["data"]["synthetic"]
    return synthetic["num_tables"], synthetic["batch_size"], params["process"]["sample_batch"]


def test_download_writes_the_synthetic_file_and_a_manifest(processed):
    tmp_path, params = processed
    num_tables, batch_size, _ = sizes(params)
    raw = tmp_path / "data/raw"
    name = f"synthetic_t{num_tables}_bs{batch_size}.pt.gz"
    assert sorted(p.name for p in raw.iterdir()) == sorted([name, "manifest.json"])
    manifest = json.loads((raw / "manifest.json").read_text())
    assert manifest["source"] == "synthetic"
    assert manifest["files"] == [name]
    assert manifest["config"] == params["data"]["synthetic"]
    batch = load_dlrm_file(raw / name)
    assert batch.lengths.shape == (num_tables, batch_size)


def test_tables_parquet_schema_and_provenance(processed):
    tmp_path, params = processed
    num_tables, batch_size, _ = sizes(params)
    path = tmp_path / "data/tables.parquet"
    schema = pq.read_schema(path)
    assert schema.remove_metadata().equals(TABLE_STATS_SCHEMA), schema
    df = pd.read_parquet(path)
    assert list(df.columns) == TABLE_STATS_SCHEMA.names
    assert len(df) == num_tables
    assert df["table_id"].tolist() == list(range(num_tables))
    assert df["file_table_index"].tolist() == list(range(num_tables))
    assert set(df["source"]) == {"synthetic"}
    assert set(df["source_file"]) == {f"synthetic_t{num_tables}_bs{batch_size}.pt.gz"}
    assert df["name"].is_unique
    assert (df["batch_size"] == batch_size).all()
    assert (df["rows"] >= 100).all() and (df["rows"] <= params["data"]["synthetic"]["max_rows"]).all()
    bins = df[BIN_COLUMNS].to_numpy()
    assert ((bins >= 0) & (bins <= 1)).all()
    looked_up = df["num_unique"] > 0
    np.testing.assert_allclose(bins[looked_up].sum(axis=1), 1.0)


def test_tables_parquet_statistics_match_the_raw_file(processed):
    tmp_path, params = processed
    num_tables, batch_size, _ = sizes(params)
    df = pd.read_parquet(tmp_path / "data/tables.parquet")
    batch = load_dlrm_file(tmp_path / f"data/raw/synthetic_t{num_tables}_bs{batch_size}.pt.gz")
    for t, row in df.iterrows():
        # independent of EmbeddingBagBatch.table: slice by the table-major offsets directly
        start, end = batch.offsets[t * batch_size], batch.offsets[(t + 1) * batch_size]
        indices, lengths = batch.indices[start:end], batch.lengths[t]
        assert row["num_lookups"] == end - start == lengths.sum()
        assert row["pooling_factor"] == pytest.approx(lengths.mean())
        assert row["rows"] == max(100, int(indices.max()) + 1)
        assert row["num_unique"] == len(np.unique(indices))
        s = table_statistics(indices, lengths)
        assert row[BIN_COLUMNS].tolist() == pytest.approx(s.bins)


def test_requests_hold_each_tables_first_samples_exactly(processed):
    tmp_path, params = processed
    num_tables, batch_size, sample = sizes(params)
    path = tmp_path / "data/requests.parquet"
    assert pq.read_schema(path).remove_metadata().equals(REQUESTS_SCHEMA)
    requests = read_requests(path)
    batch = load_dlrm_file(tmp_path / f"data/raw/synthetic_t{num_tables}_bs{batch_size}.pt.gz")
    assert sorted(requests) == list(range(num_tables))
    for t in range(num_tables):
        r = requests[t]
        start = batch.offsets[t * batch_size]
        end = batch.offsets[t * batch_size + sample]
        assert r.batch_size == sample
        np.testing.assert_array_equal(r.lengths, batch.lengths[t, :sample])
        np.testing.assert_array_equal(r.indices, batch.indices[start:end])


def test_sample_batch_larger_than_the_batch_keeps_all_samples(tmp_path):
    params = make_params(tmp_path, process={"sample_batch": 10 * BATCH},
                         data={"synthetic": {"num_tables": 2, "batch_size": 8, "max_rows": 200, "seed": 0}})
    download.run(params)
    process.run(params)
    requests = read_requests(tmp_path / "data/requests.parquet")
    batch = load_dlrm_file(tmp_path / "data/raw/synthetic_t2_bs8.pt.gz")
    for t in range(2):
        assert requests[t].batch_size == 8
        np.testing.assert_array_equal(requests[t].indices, batch.table(t)[0])


def test_download_rerun_keeps_only_the_new_configurations_file(tmp_path):
    small = {"num_tables": 2, "batch_size": 8, "max_rows": 200, "seed": 0}
    download.run(make_params(tmp_path, data={"synthetic": small}))
    download.run(make_params(tmp_path, data={"synthetic": {**small, "num_tables": 3}}))
    assert sorted(p.name for p in (tmp_path / "data/raw").iterdir()) == ["manifest.json", "synthetic_t3_bs8.pt.gz"]


def test_download_dlrm_source_copies_checked_files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    lengths = torch.tensor([[1, 2], [0, 1]])
    offsets = torch.tensor([0, 1, 3, 3, 4])
    torch.save((torch.tensor([3, 4, 4, 150]), offsets, lengths), src / "fbgemm_t2_bs2.pt")
    params = make_params(tmp_path, data={"source": "dlrm", "dlrm_paths": [str(src)]})
    download.run(params)
    process.run(params)
    manifest = json.loads((tmp_path / "data/raw/manifest.json").read_text())
    assert manifest["source"] == "dlrm" and manifest["files"] == ["fbgemm_t2_bs2.pt"]
    df = pd.read_parquet(tmp_path / "data/tables.parquet")
    assert df["source"].tolist() == ["dlrm", "dlrm"]
    assert df["rows"].tolist() == [100, 151]
    assert df["pooling_factor"].tolist() == [1.5, 0.5]


def test_download_rejects_a_malformed_dlrm_file(tmp_path):
    src = tmp_path / "bad.pt"
    torch.save((torch.tensor([1.0]), torch.tensor([0, 1]), torch.tensor([[1]])), src)
    params = make_params(tmp_path, data={"source": "dlrm", "dlrm_paths": [str(src)]})
    with pytest.raises(DataFormatError, match=r"bad\.pt: indices"):
        download.run(params)


def test_download_rejects_an_unknown_source_and_unknown_keys(tmp_path):
    with pytest.raises(ParamsError, match="data.source"):
        download.run(make_params(tmp_path, data={"source": "kaggle"}))
    with pytest.raises(ParamsError, match="num_tabels"):
        download.run(make_params(tmp_path, data={"synthetic": {"num_tabels": 3}}))
