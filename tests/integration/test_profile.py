"""`dreamshard profile`: statistics measured from lookup files equal the process stage's, for the DLRM format
and for the Parquet lookup format; bad input is an error naming the file and the field."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dreamshard.cli.profile import add_parser
from dreamshard.data.dlrm import EmbeddingBagBatch, TableProfile, generate_lookups, save_dlrm_file
from dreamshard.data.profile import LOOKUPS_SCHEMA, OUTPUT_COLUMNS, ProfileConfig, profile_lookups, write_lookups_parquet
from dreamshard.errors import DataFormatError, DreamShardError
from dreamshard.tables import BIN_COLUMNS, read_tables_file
from stages import process

BATCH = 64
STEM = "lookups"


def make_batch() -> EmbeddingBagBatch:
    """Six tables of one batch: Zipf-skewed ones, one never looked up, one with ids below 100 (rows = 100),
    one with a row seen more than 2^15 times (the last bin)."""
    per_table = [
        generate_lookups(TableProfile(5000, 8.0, 0.9), BATCH, 1),
        generate_lookups(TableProfile(300, 3.0, 0.2), BATCH, 2),
        (np.zeros(0, dtype=np.int64), np.zeros(BATCH, dtype=np.int64)),
        generate_lookups(TableProfile(40, 2.0, 1.0), BATCH, 4),
        (np.concatenate([np.full(BATCH * 600 - 64, 7), np.arange(64) * 11]).astype(np.int64),
         np.full(BATCH, 600, dtype=np.int64)),
        generate_lookups(TableProfile(200_000, 30.0, 1.3), BATCH, 5),
    ]
    lengths = np.stack([lg for _, lg in per_table])
    indices = np.concatenate([ix for ix, _ in per_table])
    offsets = np.concatenate([[0], np.cumsum(lengths.reshape(-1))]).astype(np.int64)
    return EmbeddingBagBatch(indices, offsets, lengths)


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory) -> tuple[Path, EmbeddingBagBatch, pd.DataFrame]:
    """A DLRM-format file and the process stage's statistics of it."""
    root = tmp_path_factory.mktemp("profile")
    raw = root / "raw"
    raw.mkdir()
    batch = make_batch()
    path = raw / f"{STEM}.pt.gz"
    save_dlrm_file(batch, path)
    (raw / "manifest.json").write_text(json.dumps({"source": "dlrm", "files": [path.name]}))
    params = {"paths": {"raw": str(raw), "tables": str(root / "tables.parquet"),
                        "requests": str(root / "requests.parquet")},
              "process": {"sample_batch": 16}}
    process.run(params)
    return path, batch, pd.read_parquet(root / "tables.parquet")


def parquet_lookups(batch: EmbeddingBagBatch, path: Path, seed: int = 0) -> Path:
    """The batch in the Parquet lookup format: each table's samples cut into batches at random points (one of
    them empty), the batches of all tables interleaved, three rows a row group."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(batch.num_tables):
        indices, lengths = batch.table(t)
        cuts = np.sort(rng.choice(np.arange(1, BATCH), size=3, replace=False))
        bounds = [0, *cuts.tolist(), cuts[-1], BATCH]  # cuts[-1] twice: one batch of no samples
        starts = np.concatenate([[0], np.cumsum(lengths)])
        for a, b in zip(bounds[:-1], bounds[1:]):
            rows.append((f"{STEM}/t{t:04d}", indices[starts[a]:starts[b]], starts[a:b + 1] - starts[a]))
    order = rng.permutation(len(rows))
    write_lookups_parquet(path, [rows[i] for i in order], rows_per_group=3)
    return path


def same_statistics(profiled, processed: pd.DataFrame) -> None:
    assert [t.name for t in profiled] == processed["name"].tolist()
    for t, (_, row) in zip(profiled, processed.iterrows()):
        assert t.rows == row["rows"], t.name
        assert t.pooling_factor == row["pooling_factor"], t.name  # exactly: the same float
        assert t.batch_size == row["batch_size"] and t.num_lookups == row["num_lookups"], t.name
        assert t.num_unique == row["num_unique"], t.name
        assert list(t.bins) == [row[c] for c in BIN_COLUMNS], t.name


def test_the_test_batch_covers_the_edge_cases(dlrm):
    _, _, stats = dlrm
    assert (stats["num_lookups"] == 0).any()  # a table never looked up
    assert (stats["rows"] == 100).any()  # rows = max(100, max index + 1)
    assert (stats["bin_16"] > 0).any()  # a row seen more than 2^15 times
    assert stats["pooling_factor"].map(lambda p: not float(p).is_integer()).any()


def test_dlrm_profile_equals_the_process_stage(dlrm):
    path, _, stats = dlrm
    same_statistics(profile_lookups([path], ProfileConfig(progress=False)), stats)


def test_parquet_profile_equals_the_process_stage(dlrm, tmp_path):
    _, batch, stats = dlrm
    path = parquet_lookups(batch, tmp_path / "lookups.parquet")
    assert pq.ParquetFile(path).num_row_groups > 5  # several row groups, tables spread over them
    profiled = profile_lookups([path], ProfileConfig(progress=False))
    by_name = {t.name: t for t in profiled}
    same_statistics([by_name[n] for n in stats["name"]], stats)


def test_a_table_split_over_two_parquet_files_is_counted_once(dlrm, tmp_path):
    _, batch, stats = dlrm
    whole = pq.read_table(parquet_lookups(batch, tmp_path / "all.parquet"))
    half = whole.num_rows // 2
    pq.write_table(whole.slice(0, half), tmp_path / "a.parquet", row_group_size=2)
    pq.write_table(whole.slice(half), tmp_path / "b.parquet", row_group_size=4)
    profiled = {t.name: t for t in profile_lookups([tmp_path / "a.parquet", tmp_path / "b.parquet"],
                                                   ProfileConfig(progress=False))}
    same_statistics([profiled[n] for n in stats["name"]], stats)


# ---------------------------------------------------------------- the command (its own parser, dreamshard/cli/profile.py)


def run_profile(argv: list[str]) -> None:
    """`dreamshard profile ARGV` through the subcommand's own parser (the one dreamshard.cli.main wires in)."""
    parser = argparse.ArgumentParser(prog="dreamshard")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["profile", *argv])
    args.func(args)


def test_command_writes_csv_and_parquet_tables_files(dlrm, tmp_path, capsys):
    path, _, stats = dlrm
    for out in (tmp_path / "tables.csv", tmp_path / "tables.parquet"):
        run_profile(["--lookups", str(path), "--dim", "16", "-o", str(out)])
        written = pd.read_csv(out) if out.suffix == ".csv" else pd.read_parquet(out)
        assert list(written.columns) == list(OUTPUT_COLUMNS)
        tables = read_tables_file(out)
        assert [t.name for t in tables] == stats["name"].tolist()
        assert all(t.dim == 16 for t in tables)
        for t, (_, row) in zip(tables, stats.iterrows()):  # CSV floats round-trip exactly
            assert (t.rows, t.pooling_factor, list(t.bins)) == (row["rows"], row["pooling_factor"],
                                                              [row[c] for c in BIN_COLUMNS])
    captured = capsys.readouterr()
    assert f"profile: 6 tables from 1 file(s), {BATCH} samples per table -> {out}" in captured.out
    assert f"{STEM}.pt.gz" in captured.err and "table" in captured.err  # the progress bar, on stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tables.csv", "tables.parquet"]  # no temporary files left


def test_dims_and_rows_per_table_from_csv_files(dlrm, tmp_path):
    path, _, stats = dlrm
    names = stats["name"].tolist()
    pd.DataFrame({"name": names, "dim": [4, 8, 12, 16, 32, 64]}).to_csv(tmp_path / "dims.csv", index=False)
    pd.DataFrame({"name": names, "rows": [10**6] * 6}).to_csv(tmp_path / "rows.csv", index=False)
    out = tmp_path / "t.csv"
    run_profile(["--lookups", str(path), "--dim", str(tmp_path / "dims.csv"), "--rows", str(tmp_path / "rows.csv"),
                 "-o", str(out), "--no-progress"])
    tables = read_tables_file(out)
    assert [t.dim for t in tables] == [4, 8, 12, 16, 32, 64]
    assert [t.rows for t in tables] == [10**6] * 6
    run_profile(["--lookups", str(path), "--dim", "8", "--rows", "250000", "-o", str(out), "--no-progress"])
    assert [t.rows for t in read_tables_file(out)] == [250_000] * 6
    below = rf"{STEM}.pt.gz: table 'lookups/t0000': indices: row id \d+ is not below its 1000 rows"
    with pytest.raises(DataFormatError, match=below):
        run_profile(["--lookups", str(path), "--dim", "8", "--rows", "1000", "-o", str(out), "--no-progress"])
    pd.DataFrame({"name": names[:5], "dim": [8] * 5}).to_csv(tmp_path / "few.csv", index=False)
    with pytest.raises(DataFormatError, match=r"--dim: table 'lookups/t0005' has no dim"):
        run_profile(["--lookups", str(path), "--dim", str(tmp_path / "few.csv"), "-o", str(out), "--no-progress"])
    pd.DataFrame({"name": [*names, "extra"], "dim": [8] * 7}).to_csv(tmp_path / "more.csv", index=False)
    with pytest.raises(DataFormatError, match=r"--dim: table\(s\) 'extra' not in the lookups"):
        run_profile(["--lookups", str(path), "--dim", str(tmp_path / "more.csv"), "-o", str(out), "--no-progress"])


@pytest.mark.parametrize(("argv", "words"), [
    (["--dim", "6"], ["--dim", "multiple of 4", "6"]),
    (["--dim", "nope.csv"], ["--dim", "integer or a CSV"]),
    (["--rows", "0"], ["--rows", "0"]),
    (["--max-memory-gb", "0"], ["--max-memory-gb"]),
    (["-o", "OUT.json"], ["t.json", ".csv or .parquet"]),
])
def test_bad_options_are_refused_before_any_output(dlrm, tmp_path, argv, words):
    path, _, _ = dlrm
    base = {"--dim": "8", "-o": str(tmp_path / "t.csv")}
    for k, v in zip(argv[::2], argv[1::2]):
        base[k] = v.replace("OUT", str(tmp_path / "t"))
    with pytest.raises(DreamShardError) as err:
        run_profile(["--lookups", str(path), "--no-progress", *[x for kv in base.items() for x in kv]])
    for w in words:
        assert w in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_the_count_memory_bound_is_an_error_not_an_allocation(dlrm):
    path, _, _ = dlrm
    with pytest.raises(DataFormatError, match=r"lookups.pt.gz: table 'lookups/t0000'.*more than --max-memory-gb 1e-06"):
        profile_lookups([path], ProfileConfig(max_memory_gb=1e-6, progress=False))
    # a DLRM file's tables are finished one at a time: the bound holds the largest table, not their sum
    profile_lookups([path], ProfileConfig(max_memory_gb=7000 * 16 / 2**30, progress=False))


# ---------------------------------------------------------------- malformed Parquet lookups


def write_rows(path: Path, rows: list[dict], schema: pa.Schema | None = None) -> Path:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


GOOD = {"table": "a", "indices": [1, 2, 3], "offsets": [0, 1, 3]}


@pytest.mark.parametrize(("rows", "schema", "words"), [
    ([{"table": "a", "indices": [1]}], None, ["missing column(s) offsets"]),
    ([{**GOOD, "indices": [1.0, 2.0, 3.0]}], None, ["indices", "list of integers", "double"]),
    ([{**GOOD, "table": 3}], None, ["table", "string"]),
    ([GOOD, {**GOOD, "offsets": [1, 2, 3]}], None, ["row 1 (table 'a')", "offsets", "offsets[0] = 0, got 1"]),
    ([GOOD, {**GOOD, "table": "b", "offsets": [0, 2, 1, 3]}], None, ["row 1 (table 'b')", "non-decreasing"]),
    ([{**GOOD, "offsets": [0, 1, 2]}], None, ["row 0", "last offset 2 != number of indices 3"]),
    ([{**GOOD, "offsets": []}], LOOKUPS_SCHEMA, ["row 0", "offsets: empty"]),
    ([{**GOOD, "indices": [1, -4, 3]}], None, ["table 'a'", "negative row id -4"]),
    ([{**GOOD, "table": None}], pa.schema([("table", pa.string()), ("indices", pa.list_(pa.int64())),
                                           ("offsets", pa.list_(pa.int64()))]), ["table: null names"]),
    ([{**GOOD, "offsets": None}], pa.schema([("table", pa.string()), ("indices", pa.list_(pa.int64())),
                                             ("offsets", pa.list_(pa.int64()))]), ["offsets: null lists"]),
    ([{"table": "a", "indices": [], "offsets": [0]}] * 2, LOOKUPS_SCHEMA, ["table 'a'", "no samples"]),
])
def test_malformed_parquet_lookups_name_the_file_and_the_field(tmp_path, rows, schema, words):
    path = write_rows(tmp_path / "bad.parquet", rows, schema)
    with pytest.raises(DataFormatError) as err:
        profile_lookups([path], ProfileConfig(progress=False))
    assert str(path) in str(err.value)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_other_integer_list_types_are_accepted(tmp_path):
    schema = pa.schema([("table", pa.large_string()), ("indices", pa.large_list(pa.int32())),
                        ("offsets", pa.list_(pa.uint16()))])
    path = write_rows(tmp_path / "ok.parquet", [GOOD, {**GOOD, "indices": [3, 3, 3]}], schema)
    (t,) = profile_lookups([path], ProfileConfig(progress=False))
    assert (t.name, t.rows, t.pooling_factor, t.batch_size, t.num_lookups, t.num_unique) == ("a", 100, 1.5, 4, 6, 3)
    assert t.bins[:3] == (2 / 3, 0.0, 1 / 3)  # rows 1 and 2 once, row 3 four times: (2, 4]


def test_unreadable_and_unknown_inputs(tmp_path):
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataFormatError, match="junk.parquet: cannot be read as Parquet"):
        profile_lookups([tmp_path / "junk.parquet"], ProfileConfig(progress=False))
    (tmp_path / "x.txt").write_text("1,2")
    with pytest.raises(DataFormatError, match=r"x.txt: expected lookups as a DLRM .pt / .pt.gz file or a .parquet"):
        profile_lookups([tmp_path / "x.txt"], ProfileConfig(progress=False))
    with pytest.raises(DataFormatError, match="absent.pt: no such file"):
        profile_lookups([tmp_path / "absent.pt"], ProfileConfig(progress=False))


def test_a_dlrm_table_seen_in_another_input_is_an_error(dlrm, tmp_path):
    path, _, _ = dlrm
    write_rows(tmp_path / "more.parquet", [{**GOOD, "table": f"{STEM}/t0001"}])
    with pytest.raises(DataFormatError, match=r"more.parquet.*'lookups/t0001' appears in an earlier DLRM input"):
        profile_lookups([path, tmp_path / "more.parquet"], ProfileConfig(progress=False))


# ---------------------------------------------------------------- through dreamshard.cli.main


def test_cli_profile_then_plan(dlrm, tmp_path, capsys):
    from dreamshard.cli import main

    path, _, stats = dlrm
    out = tmp_path / "tables.csv"
    assert main(["profile", "--lookups", str(path), "--dim", "8", "-o", str(out), "--no-progress"]) == 0
    assert read_tables_file(out)[0].bins == tuple(stats.loc[0, BIN_COLUMNS])
    assert main(["plan", "--tables", str(out), "--devices", "2", "--memory-gb", "1", "--algo", "lookup_greedy",
                 "-o", str(tmp_path / "plan.json")]) == 0
    bad = write_rows(tmp_path / "bad.parquet", [{**GOOD, "offsets": [0, 1, 2]}])
    capsys.readouterr()
    assert main(["profile", "--lookups", str(bad), "--dim", "8", "-o", str(tmp_path / "b.csv"), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("dreamshard: error:") and "\n" not in err and "bad.parquet" in err and "offsets" in err
    assert not (tmp_path / "b.csv").exists()
