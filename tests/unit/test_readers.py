"""Inputs users really write (issue 36): tables, devices and constraints files read exactly as written, or refused.

Names and labels are strings as written (a table `NA`, `null`, `007` or `1e3`, a group `NA`); an empty
name, an unknown column or key is a one-line error naming the file, the place and what was expected, never
a silent fallback. Small real files in tmp_path, through the `dreamshard` command where the plan shows it.
"""
from __future__ import annotations

import csv
import json
import unicodedata
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dreamshard.cli import main
from dreamshard.data.cluster import Constraints, read_constraints_file, read_devices_file, read_table_constraints
from dreamshard.errors import DataFormatError
from dreamshard.tables import BIN_COLUMNS, read_tables_file

HEADER = "name,rows,dim,pooling_factor"


def plan(tmp_path: Path, tables: Path, capsys, *extra: str, devices: int = 2, memory_gb: float = 1.0) -> dict:
    """Plan `tables` with `dreamshard plan`; the plan file's object."""
    out = tmp_path / "plan.json"
    rc = main(["plan", "--tables", str(tables), "--devices", str(devices), "--memory-gb", str(memory_gb),
               "--algo", "size_greedy", "-o", str(out), *extra])
    assert rc == 0, capsys.readouterr().err
    return json.loads(out.read_text())


def fails(argv: list[str], capsys) -> str:
    """The one line `dreamshard` prints on stderr for a bad input."""
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dreamshard: error: "), err
    return lines[0]


def plan_argv(tmp_path: Path, tables: Path, *extra: str) -> list[str]:
    return ["plan", "--tables", str(tables), "--devices", "2", "--memory-gb", "1", "--algo", "size_greedy",
            "-o", str(tmp_path / "plan.json"), *extra]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---------------------------------------------------------------- names and labels, through the command


def test_tables_named_na_and_null_keep_their_names(tmp_path, capsys):
    tables = write(tmp_path / "t.csv", f"{HEADER}\nNA,100,8,1\nnull,100,8,1\nNaN,100,8,1\nN/A,100,8,1\n")
    assert {s["table"] for s in plan(tmp_path, tables, capsys)["shards"]} == {"NA", "null", "NaN", "N/A"}


def test_names_that_look_numeric_are_not_rewritten(tmp_path, capsys):
    tables = write(tmp_path / "t.csv", f"{HEADER}\n01,100,8,1\n02,100,8,1\n03,100,8,1\n007,100,8,1\n1e3,100,8,1\n")
    obj = plan(tmp_path, tables, capsys)
    assert sorted(s["table"] for s in obj["shards"]) == ["007", "01", "02", "03", "1e3"]
    assert set(obj["table_shapes"]) == {"007", "01", "02", "03", "1e3"}


def test_an_empty_table_name_is_an_error_naming_file_and_line(tmp_path, capsys):
    tables = write(tmp_path / "t.csv", f"{HEADER}\na,100,8,1\n,100,8,1\n")
    line = fails(plan_argv(tmp_path, tables), capsys)
    assert f"{tables}: line 3: column 'name': the table name is empty" in line
    # a quoted name over two lines: the empty one after it is still found on the line a user counts
    tables = write(tmp_path / "t.csv", f'{HEADER}\n"two\nlines",100,8,1\n  ,100,8,1\n')
    assert f"{tables}: line 4: column 'name'" in fails(plan_argv(tmp_path, tables), capsys)


def test_a_group_labelled_na_shares_one_device(tmp_path, capsys):
    # two alike tables: size_greedy alone puts them on different devices
    tables = write(tmp_path / "t.csv", f"{HEADER},group\na,1000,8,1,NA\nb,1000,8,1,NA\n")
    obj = plan(tmp_path, tables, capsys)
    assert obj["constraints"] == {"group": [["a", "b"]]}
    assert len({s["device"] for s in obj["shards"]}) == 1


def test_group_labels_that_look_numeric_stay_apart(tmp_path):
    # 1 and 1.0 (or 01) are different labels as written; a number parser would merge them
    tables = write(tmp_path / "t.csv", f"{HEADER},group\na,10,8,1,1\nb,10,8,1,1\nc,10,8,1,1.0\nd,10,8,1,1.0\n"
                                       "e,10,8,1,01\nf,10,8,1,01\n")
    assert read_table_constraints(tables).groups == (("a", "b"), ("c", "d"), ("e", "f"))


@pytest.mark.parametrize("column, near", [("Pin", "pin"), ("avoids", "avoid"), ("Group", "group"),
                                          ("pooling factor", "pooling_factor"), ("bin0", "bin_0")])
def test_a_misspelt_column_is_an_error_suggesting_the_known_one(tmp_path, capsys, column, near):
    tables = write(tmp_path / "t.csv", f"{HEADER},{column}\na,100,8,1,0\nb,100,8,1,\n")
    line = fails(plan_argv(tmp_path, tables), capsys)
    assert f"{tables}: unknown column {column!r}; did you mean {near!r}?" in line
    assert not (tmp_path / "plan.json").exists()


def test_a_pandas_index_column_is_an_error_not_ignored(tmp_path, capsys):
    tables = tmp_path / "t.csv"
    pd.DataFrame({"name": ["a"], "rows": [10], "dim": [8], "pooling_factor": [1.0]}).to_csv(tables)  # index too
    assert "column 1 has no name (an index written without index=False?)" in fails(plan_argv(tmp_path, tables), capsys)


def test_every_column_of_the_known_formats_is_accepted(tmp_path):
    # `dreamshard profile` output (bins and what they were measured on) with every constraint column
    cols = {"name": ["a", "b"], "rows": [10, 20], "dim": [8, 8], "pooling_factor": [1.0, 2.0],
            **{c: [1.0 if c == "bin_0" else 0.0] * 2 for c in BIN_COLUMNS},
            "batch_size": [64, 64], "num_lookups": [64, 128], "num_unique": [5, 9],
            "group": ["", ""], "pin": ["", "1"], "avoid": ["0", ""], "whole": ["true", ""]}
    for path in (tmp_path / "t.csv", tmp_path / "t.parquet"):
        frame = pd.DataFrame(cols)
        frame.to_csv(path, index=False) if path.suffix == ".csv" else frame.to_parquet(path)
        assert [t.name for t in read_tables_file(path)] == ["a", "b"]
        assert read_table_constraints(path) == Constraints({"b": 1}, {"a": (0,)}, (), ("a",))


def test_missing_numbers_written_as_na_still_leave_bins_and_constraints_empty(tmp_path):
    bins = ",".join(BIN_COLUMNS)
    tables = write(tmp_path / "t.csv", f"{HEADER},{bins},pin\na,10,8,1,{','.join(['NA'] * 17)},NA\n"
                                       f"b,10,8,1,{','.join(['null'] * 17)},1\n")
    assert [t.bins for t in read_tables_file(tables)] == [None, None]
    assert read_table_constraints(tables) == Constraints({"b": 1})


@pytest.mark.parametrize("text, words", [
    (f"{HEADER},name\na,1,4,1,b\n", "line 1: column 'name' appears twice in the header"),
    (f"{HEADER}\na,1,4,1,extra\n", "line 2: 5 cells, but the header has 4 columns"),
    (f"{HEADER}\na,1,4\n", "line 2: 3 cells, but the header has 4 columns"),
    ("", "empty file; expected a tables file with a header line"),
])
def test_csv_shapes_that_pandas_would_guess_at_are_errors(tmp_path, text, words):
    path = write(tmp_path / "t.csv", text)
    with pytest.raises(DataFormatError, match=f"{path}: {words}"):
        read_tables_file(path)


def test_bad_bytes_are_a_data_format_error(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(HEADER.encode() + b"\n\xff\xfe,1,4,1\n")
    with pytest.raises(DataFormatError, match="cannot read tables file as UTF-8 CSV"):
        read_tables_file(path)


# ---------------------------------------------------------------- Parquet tables files


def test_parquet_names_must_be_strings(tmp_path, capsys):
    path = tmp_path / "t.parquet"
    pd.DataFrame({"name": [1, 2], "rows": [10, 10], "dim": [8, 8], "pooling_factor": [1.0, 1.0]}).to_parquet(path)
    line = fails(plan_argv(tmp_path, path), capsys)
    assert f"{path}: row 1: column 'name': expected a string (a table name), got int 1" in line


def test_parquet_null_name_and_unknown_column_are_errors(tmp_path, capsys):
    path = tmp_path / "t.parquet"
    pd.DataFrame({"name": ["a", None], "rows": [10, 10], "dim": [8, 8], "pooling_factor": [1.0, 1.0]}).to_parquet(path)
    assert f"{path}: row 2: column 'name': the table name is empty" in fails(plan_argv(tmp_path, path), capsys)
    pd.DataFrame({"name": ["a", "b"], "rows": [10, 10], "dim": [8, 8], "pooling_factor": [1.0, 1.0],
                  "Pin": [0, 1]}).to_parquet(path)
    assert f"{path}: unknown column 'Pin'; did you mean 'pin'?" in fails(plan_argv(tmp_path, path), capsys)


def test_parquet_names_and_group_na_through_the_command(tmp_path, capsys):
    path = tmp_path / "t.parquet"
    pd.DataFrame({"name": ["NA", "007", "1e3"], "rows": [1000] * 3, "dim": [8] * 3, "pooling_factor": [1.0] * 3,
                  "group": ["NA", "NA", None]}).to_parquet(path)
    obj = plan(tmp_path, path, capsys)
    assert obj["constraints"] == {"group": [["NA", "007"]]}
    where = {s["table"]: s["device"] for s in obj["shards"]}
    assert set(where) == {"NA", "007", "1e3"} and where["NA"] == where["007"]


# ---------------------------------------------------------------- devices and constraints files


def test_devices_csv_kinds_and_hosts_as_written(tmp_path):
    path = write(tmp_path / "d.csv", "memory_gb,kind,host\n16,NA,007\n16,1e3,null\n")
    assert [(d.kind, d.host) for d in read_devices_file(path)] == [("NA", "007"), ("1e3", "null")]


@pytest.mark.parametrize("header, near", [("Speed", "speed"), ("memory", "memory_gb"), ("hosts", "host")])
def test_a_misspelt_devices_column_is_an_error_suggesting_the_known_one(tmp_path, capsys, header, near):
    path = write(tmp_path / "d.csv", f"memory_gb,{header}\n16,1\n" if header != "memory" else "memory\n16\n")
    argv = ["plan", "--tables", str(write(tmp_path / "t.csv", f"{HEADER}\na,10,8,1\n")), "--devices-file", str(path),
            "--algo", "size_greedy", "-o", str(tmp_path / "plan.json")]
    assert f"{path}: unknown column {header!r}; did you mean {near!r}?" in fails(argv, capsys)


def test_devices_json_field_names_and_kinds(tmp_path):
    path = write(tmp_path / "d.json", json.dumps([{"memory_gb": 16, "Kind": "h100"}]))
    with pytest.raises(DataFormatError, match=rf"{path}: device 0: unknown field 'Kind'; did you mean 'kind'\?"):
        read_devices_file(path)
    write(path, json.dumps({"device": [{"memory_gb": 16}]}))
    with pytest.raises(DataFormatError, match=rf"{path}: unknown key 'device'; did you mean 'devices'\?"):
        read_devices_file(path)
    write(path, json.dumps([{"memory_gb": 16, "kind": 7}]))  # not the name "7": a number where a name belongs
    with pytest.raises(DataFormatError, match=rf"{path}: device 0: field 'kind': expected a string \(a name\), got 7"):
        read_devices_file(path)


@pytest.mark.parametrize("key, near", [("pins", "pin"), ("avoids", "avoid"), ("groups", "group"), ("Whole", "whole")])
def test_a_misspelt_constraints_key_is_an_error_suggesting_the_known_one(tmp_path, key, near):
    path = write(tmp_path / "c.json", json.dumps({key: {}}))
    with pytest.raises(DataFormatError, match=rf"{path}: unknown key {key!r}; did you mean {near!r}\?"):
        read_constraints_file(path)


# ---------------------------------------------------------------- properties

SPECIAL = ["NA", "null", "NULL", "NaN", "nan", "None", "N/A", "007", "01", "1e3", "-0", "1_000", "TRUE", "#N/A",
           " padded ", 'say "hi"', "a,b", "é", "表", "🙂"]
NAMES = st.one_of(st.sampled_from(SPECIAL), st.text(min_size=1, max_size=12)).filter(lambda s: s.strip())


@st.composite
def tables_frames(draw) -> pd.DataFrame:
    """A valid tables frame: distinct names from SPECIAL or any text; with four tables or more, the first two
    in one group and the next two in another, labelled from the same names."""
    names = draw(st.lists(NAMES, min_size=1, max_size=6, unique=True))
    n = len(names)
    frame = pd.DataFrame({"name": names, "rows": draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n)),
                          "dim": [4 * draw(st.integers(1, 64)) for _ in names], "pooling_factor": [1.5] * n})
    if n >= 4:
        a, b = draw(st.lists(NAMES, min_size=2, max_size=2, unique_by=str.strip))
        frame["group"] = [a, a, b, b] + [""] * (n - 4)
    return frame


def write_frame(frame: pd.DataFrame, path: Path, writer: str) -> None:
    if writer == "csv module":
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(frame.columns)
            w.writerows(frame.itertuples(index=False))
    elif writer == "to_csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)


@pytest.mark.parametrize("writer, suffix", [("csv module", ".csv"), ("to_csv", ".csv"), ("to_parquet", ".parquet")])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frame=tables_frames())
def test_valid_tables_files_read_back_exactly_as_written(tmp_path, writer, suffix, frame):
    # pandas writes a bare carriage return unquoted: no CSV reader can read that back
    assume(writer != "to_csv" or not frame.map(lambda v: "\r" in str(v)).any().any())
    names = [unicodedata.normalize("NFC", n) for n in frame["name"]]  # one spelling of each name (NFC)
    assume(len(set(names)) == len(names))  # two spellings of one name are an error (test_two_spellings_...)
    path = tmp_path / f"t{suffix}"
    write_frame(frame, path, writer)
    tables = read_tables_file(path)
    assert [t.name for t in tables] == names
    assert [(t.rows, t.dim) for t in tables] == list(zip(frame["rows"], frame["dim"]))
    groups = read_table_constraints(path).groups
    if "group" in frame:
        assert groups == (tuple(names[:2]), tuple(names[2:4]))
    else:
        assert groups == ()


ANY_CELL = st.one_of(st.sampled_from(["", "NA", "1", "1.5", "-1", "1e400", "nan", "inf", "0;1", '"', '""', ",", "\n",
                                      "\r", "\x00", " ", "1" * 400]), st.text(max_size=8))
GOOD_CELL = {"name": NAMES, "rows": st.sampled_from(["1", "100", "1e3"]), "dim": st.sampled_from(["4", "8", "16.0"]),
             "pooling_factor": st.sampled_from(["0", "1.5"]), "group": st.sampled_from(["", "g", "NA"]),
             "pin": st.sampled_from(["", "0", "NA"]), "avoid": st.sampled_from(["", "1", "0;1"]),
             "whole": st.sampled_from(["", "true", "no"]), "batch_size": st.sampled_from(["", "64"])}
EXTRA_COLUMNS = ["group", "pin", "avoid", "whole", "batch_size", "bin_0", "Pin", "", "name"]


@st.composite
def tables_file_bytes(draw) -> bytes:
    """Arbitrary bytes, or CSV-shaped text: mostly the required columns and some others, known or not, and
    rows of mostly the header's length with cells mostly fit for their column, the others of every kind."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=200))
    header = ["name", "rows", "dim", "pooling_factor"] if draw(st.integers(0, 4)) else []
    header += draw(st.lists(st.sampled_from(EXTRA_COLUMNS), max_size=3, unique=True))
    width = st.one_of(st.just(len(header)), st.just(len(header)), st.integers(max(len(header) - 1, 0), len(header) + 1))
    rows = []
    for n in draw(st.lists(width, max_size=5)):
        cols = header + [""] * max(n - len(header), 0)
        rows.append([draw(ANY_CELL if draw(st.integers(0, 9)) == 0 else GOOD_CELL.get(c, ANY_CELL)) for c in cols[:n]])
    sep = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    return sep.join(",".join(r) for r in [header, *rows]).encode("utf-8", "surrogatepass")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=tables_file_bytes())
def test_any_bytes_read_cleanly_or_raise_data_format_error(tmp_path, data):
    path = tmp_path / "fuzz.csv"
    path.write_bytes(data)
    try:
        tables = read_tables_file(path)
        read_table_constraints(path)
    except DataFormatError:
        return
    assert tables and all(isinstance(t.name, str) and t.name.strip() for t in tables)


# ---------------------------------------------------------------- each file checked as a whole (issue 53)


def binned(tmp_path: Path, *rows: list[float]) -> Path:
    lines = [f"{HEADER},{','.join(BIN_COLUMNS)}"]
    lines += [f"t{i},100,8,1,{','.join(f'{b:g}' for b in bins)}" for i, bins in enumerate(rows)]
    return write(tmp_path / "binned.csv", "\n".join(lines) + "\n")


def test_bins_are_fractions_that_sum_to_one(tmp_path, capsys):
    """0.9 in each of the 17 columns (sum 15.3) is no histogram; within 0.01 of 1 is (rounding), all 0 is a table
    nobody looked up (as `dreamshard profile` writes it)."""
    err = fails(plan_argv(tmp_path, binned(tmp_path, [0.9] * 17)), capsys)
    assert "binned.csv: table 't0' (line 2): access-count bins sum to 15.3" in err
    assert "sum to 1 (within 0.01)" in err and "all 0" in err
    tables = read_tables_file(binned(tmp_path, [0.333, 0.333, 0.333] + [0.0] * 14, [0.0] * 17, [0.5, 0.5] + [0] * 15))
    assert [sum(t.bins or ()) for t in tables] == pytest.approx([0.999, 0.0, 1.0])
    with pytest.raises(DataFormatError, match="sum to 0.98"):
        read_tables_file(binned(tmp_path, [0.49, 0.49] + [0.0] * 15))


@pytest.mark.parametrize("column, value, words", [
    ("dim", "1e30", "column 'dim': 1e+30 is more than 65536"),
    ("dim", "70000", "column 'dim': 70000 is more than 65536"),
    ("rows", "1e30", "column 'rows': 1e+30 is more than 1099511627776"),
    ("pooling_factor", "1e30", "column 'pooling_factor': expected a mean number of lookups per sample in "
                               "[0, 1048576], got 1e+30"),
    ("pooling_factor", "1e300", "got 1e+300"),
    ("pooling_factor", "-1", "got -1"),
    ("pooling_factor", "nan", "got nan"),
])
def test_each_number_has_its_own_limit_and_message(tmp_path, capsys, column, value, words):
    cells = {"name": "big", "rows": "1000", "dim": "16", "pooling_factor": "2", column: value}
    path = write(tmp_path / "t.csv", f"{HEADER}\n{','.join(cells[c] for c in HEADER.split(','))}\n")
    err = fails(plan_argv(tmp_path, path), capsys)
    assert words in err and len(err) < 300  # %g: never a number of 300 digits


def test_two_spellings_of_one_name_are_an_error(tmp_path, capsys):
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    path = write(tmp_path / "t.csv", f"{HEADER}\n{nfc},100,8,1\n{nfd},200,8,1\n")
    err = fails(plan_argv(tmp_path, path), capsys)
    assert f"{nfc!r} (line 2) and {nfd!r} (line 3) are one name in two Unicode spellings" in err


def test_names_are_read_in_one_spelling(tmp_path, capsys):
    """A table written NFD is the table a constraints file or a plan names NFC, and the other way round."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    tables = write(tmp_path / "t.csv", f"{HEADER}\n{nfd},100,8,1\nother,200,8,1\n")
    assert [t.name for t in read_tables_file(tables)] == [nfc, "other"]
    constraints = write(tmp_path / "c.json", json.dumps({"pin": {nfd: 1}}))
    obj = plan(tmp_path, tables, capsys, "--constraints", str(constraints))
    assert {s["table"]: s["device"] for s in obj["shards"]}[nfc] == 1
    for s in obj["shards"]:
        s["table"] = unicodedata.normalize("NFD", s["table"])
    written_nfd = write(tmp_path / "nfd.json", json.dumps(obj))
    assert main(["measure", "--tables", str(tables), "--plan", str(written_nfd), "--backend", "analytic"]) == 0


def test_requests_read_alike_from_one_chunk_several_chunks_and_narrower_ints(tmp_path):
    """data/requests.parquet: each table's lookups as written, whether the file holds one row group or several, int64
    or int32 ids; the arrays are read-only views (nothing may rewrite a table's recorded lookups); a column of
    non-integers is an error naming the file and the column."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dreamshard.data.requests import TableRequests, read_requests, requests_to_arrow

    rng = np.random.default_rng(0)
    written = {i: TableRequests(rng.integers(0, 50, size=n).astype(np.int64), np.array(lens, dtype=np.int64))
               for i, (n, lens) in enumerate([(6, [1, 2, 3]), (0, [0, 0]), (5, [5])])}
    table = requests_to_arrow(list(written), list(written.values()))
    narrow = table.set_column(3, "indices", table.column("indices").cast(pa.list_(pa.int32())))
    for name, data, row_group in (("one", table, None), ("groups", table, 1), ("narrow", narrow, None)):
        pq.write_table(data, tmp_path / f"{name}.parquet", row_group_size=row_group)
        read = read_requests(tmp_path / f"{name}.parquet")
        assert sorted(read) == sorted(written)
        for i, r in written.items():
            assert read[i].indices.dtype == read[i].lengths.dtype == np.int64
            np.testing.assert_array_equal(read[i].indices, r.indices)
            np.testing.assert_array_equal(read[i].lengths, r.lengths)
        with pytest.raises(ValueError):
            read[0].indices[0] = 1
    floats = table.set_column(3, "indices", table.column("indices").cast(pa.list_(pa.float64())))
    pq.write_table(floats, tmp_path / "floats.parquet")
    with pytest.raises(DataFormatError, match=r"floats\.parquet: column 'indices' is list<.*double>"):
        read_requests(tmp_path / "floats.parquet")
