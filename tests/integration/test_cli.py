"""The `dreamshard plan` command: in-process through main(argv), and the installed script once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dreamshard.cli import main
from dreamshard.memory import MemoryModel
from dreamshard.plan import Plan, validate_plan
from dreamshard.sharders import HEURISTICS
from dreamshard.tables import BIN_COLUMNS, read_tables_file
from dreamshard.tasks import Task

# 12 tables; at fp32 the biggest (200k x 128) takes 0.095 GB, all of them 0.115 GB
TABLES = pd.DataFrame({
    "name": [f"emb_{i}" for i in range(12)],
    "rows": [200_000, 100, 5_000, 70_000, 1_000, 30_000, 100, 250, 9_999, 120_000, 40, 3_000],
    "dim": [128, 4, 16, 32, 64, 8, 128, 12, 48, 16, 4, 96],
    "pooling_factor": [1.0, 0.2, 15.5, 3.0, 40.0, 7.25, 1.0, 100.0, 2.5, 0.0, 9.0, 12.0],
})


@pytest.fixture
def tables_csv(tmp_path) -> Path:
    path = tmp_path / "tables.csv"
    TABLES.to_csv(path, index=False)
    return path


def plan_args(tables: Path, out: Path, algo: str = "size_greedy", devices: int = 4, memory_gb: float = 0.1, *extra):
    return ["plan", "--tables", str(tables), "--devices", str(devices), "--memory-gb", str(memory_gb),
            "--algo", algo, "-o", str(out), *extra]


CLI_MEMORY = MemoryModel("fp32", "exact_sgd", batch_size=512, reservation=0.15)  # the command's defaults


def check_plan_file(path: Path, tables_file: Path, devices: int, memory_gb: float, memory: MemoryModel | None = None) -> Plan:
    obj = json.loads(path.read_text())
    assert obj["num_devices"] == devices
    assert isinstance(obj["shards"], list)
    for s in obj["shards"]:
        assert set(s) == {"table", "device", "col_start", "col_end"}
    plan = Plan.from_dict(obj)
    task = Task.uniform("check", read_tables_file(tables_file), devices, memory_gb, memory or CLI_MEMORY)
    validate_plan(task, plan)
    assert sorted(s["table"] for s in obj["shards"]) == sorted(t.name for t in task.tables)
    return plan


@pytest.mark.parametrize("algo", sorted(HEURISTICS))
def test_plan_csv_with_every_heuristic(tmp_path, tables_csv, capsys, algo):
    out = tmp_path / "plan.json"
    assert main(plan_args(tables_csv, out, algo, 4, 0.15)) == 0  # every table fits whole
    check_plan_file(out, tables_csv, 4, 0.15)
    assert json.loads(out.read_text())["algorithm"] == algo
    stdout = capsys.readouterr().out
    assert f"{algo}: 12 tables on 4 devices" in stdout
    # heading, estimated cost, memory model, column names, one line per device, what the columns mean
    assert len(stdout.strip().splitlines()) == 4 + 4 + 1


def test_plan_uses_memory_options(tmp_path, tables_csv, capsys):
    # with adam (12 B per fp32 weight) everything takes 3x: 0.115 GB of tables -> 0.346 GB, over 4 x 0.05 GB
    out = tmp_path / "plan.json"
    no_extra = ("--reservation", "0", "--batch-size", "1")  # weights and state alone (buffers of one sample)
    assert main(plan_args(tables_csv, out, "size_greedy", 4, 0.05, "--optimizer", "adam", *no_extra)) == 1
    assert "tables need 0.346 GB in total, the 4 devices hold 0.200 GB" in capsys.readouterr().err
    assert not out.exists()
    assert main(plan_args(tables_csv, out, "size_greedy", 4, 0.3, "--optimizer", "adam", *no_extra)) == 0
    check_plan_file(out, tables_csv, 4, 0.3, MemoryModel("fp32", "adam", 1, 0.0))


def test_plan_is_reproducible_by_seed(tmp_path, tables_csv):
    def planned(seed: int, name: str) -> Plan:
        out = tmp_path / name
        assert main(plan_args(tables_csv, out, "random", 4, 0.15, "--seed", str(seed))) == 0
        return check_plan_file(out, tables_csv, 4, 0.15)

    first = planned(5, "a.json")
    assert planned(5, "b.json") == first  # same seed, same plan
    others = {seed: planned(seed, f"seed{seed}.json") for seed in range(6, 11)}
    assert any(p != first for p in others.values()), "five other seeds all gave seed 5's plan: the seed is ignored"


def test_plan_parquet_with_bins(tmp_path, capsys):
    df = TABLES.copy()
    bins = np.random.default_rng(0).dirichlet(np.ones(len(BIN_COLUMNS)), size=len(df))
    for i, c in enumerate(BIN_COLUMNS):
        df[c] = bins[:, i]
    path = tmp_path / "tables.parquet"
    df.to_parquet(path)
    tables = read_tables_file(path)
    assert tables[0].bins == pytest.approx(tuple(bins[0]))
    out = tmp_path / "plan.json"
    assert main(plan_args(path, out, "lookup_greedy", 4, 0.15)) == 0
    check_plan_file(out, path, 4, 0.15)


def bad_csv(tmp_path, fname="bad.csv", **changes) -> Path:
    df = TABLES.copy()
    for col, value in changes.items():
        if value is None:
            df = df.drop(columns=[col])
        else:
            df[col] = df[col].astype(object)
            df.loc[3, col] = value
    path = tmp_path / fname
    df.to_csv(path, index=False)
    return path


def run_failing(argv, capsys, out: Path) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dreamshard: error: ")
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize(
    "make, words",
    [
        pytest.param(lambda p: bad_csv(p, pooling_factor=None), ["bad.csv", "missing column", "pooling_factor"],
                     id="missing-column"),
        pytest.param(lambda p: bad_csv(p, rows=None, dim=None), ["bad.csv", "rows, dim"], id="missing-columns"),
        pytest.param(lambda p: bad_csv(p, rows=1.5), ["bad.csv", "emb_3", "'rows'", "integer", "1.5"], id="rows-not-integer"),
        pytest.param(lambda p: bad_csv(p, rows="many"), ["bad.csv", "emb_3", "many"], id="rows-not-a-number"),
        pytest.param(lambda p: bad_csv(p, rows=0), ["bad.csv", "emb_3", "rows must be >= 1"], id="rows-zero"),
        pytest.param(lambda p: bad_csv(p, dim=6), ["bad.csv", "emb_3", "dim", "multiple of 4"], id="dim-not-multiple-of-4"),
        pytest.param(lambda p: bad_csv(p, dim=0), ["emb_3", "dim"], id="dim-zero"),
        pytest.param(lambda p: bad_csv(p, pooling_factor=-1.0), ["emb_3", "pooling_factor"], id="negative-pooling"),
        pytest.param(lambda p: bad_csv(p, name="emb_0"), ["bad.csv", "'emb_0'", "more than once"], id="duplicate-name"),
        pytest.param(lambda p: p / "absent.csv", ["absent.csv", "no such file"], id="missing-file"),
        pytest.param(lambda p: bad_csv(p, fname="tables.txt"), ["tables.txt", ".csv or .parquet"], id="wrong-suffix"),
    ],
)
def test_bad_tables_file_is_one_line_on_stderr(tmp_path, capsys, make, words):
    out = tmp_path / "plan.json"
    line = run_failing(plan_args(make(tmp_path), out), capsys, out)
    for word in words:
        assert word in line, f"{word!r} not in {line!r}"


def test_empty_and_unreadable_tables_files(tmp_path, capsys):
    out = tmp_path / "plan.json"
    empty = tmp_path / "empty.csv"
    empty.write_text("name,rows,dim,pooling_factor\n")
    assert "no tables" in run_failing(plan_args(empty, out), capsys, out)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    assert "garbage.parquet: cannot read tables file" in run_failing(plan_args(garbage, out), capsys, out)


def test_partial_bins(tmp_path, capsys):
    df = TABLES.copy()
    for c in BIN_COLUMNS[:5]:
        df[c] = 0.2
    path = tmp_path / "partial.parquet"
    df.to_parquet(path)
    out = tmp_path / "plan.json"
    line = run_failing(plan_args(path, out), capsys, out)
    assert "partial.parquet" in line and "bin_5" in line and "bin_16" in line


def test_bins_outside_0_1(tmp_path, capsys):
    df = TABLES.copy()
    for c in BIN_COLUMNS:
        df[c] = 0.0
    df.loc[2, "bin_0"] = 1.5
    path = tmp_path / "bins.csv"
    df.to_csv(path, index=False)
    out = tmp_path / "plan.json"
    assert "emb_2" in run_failing(plan_args(path, out), capsys, out)


def test_infeasible_memory(tmp_path, tables_csv, capsys):
    out = tmp_path / "plan.json"
    no_extra = ("--reservation", "0", "--batch-size", "1")  # weights and state alone (buffers of one sample)
    line = run_failing(plan_args(tables_csv, out, "dim_greedy", 4, 0.02, *no_extra), capsys, out)
    assert "tables need 0.115 GB in total, the 4 devices hold 0.080 GB" in line  # even in row pieces
    line = run_failing(plan_args(tables_csv, out, "random", 1, 0.1, *no_extra), capsys, out)
    assert "tables need 0.115 GB in total" in line  # each fits 0.1 GB, all together do not


@pytest.mark.parametrize("devices, memory_gb, word", [(0, 1.0, "--devices"), (-2, 1.0, "--devices"),
                                                      (4, 0.0, "--memory-gb"), (4, -1.0, "--memory-gb"),
                                                      (4, float("nan"), "--memory-gb")])
def test_bad_device_options(tmp_path, tables_csv, capsys, devices, memory_gb, word):
    out = tmp_path / "plan.json"
    assert word in run_failing(plan_args(tables_csv, out, "size_greedy", devices, memory_gb), capsys, out)


def test_infinite_memory_is_a_one_line_error(tmp_path, tables_csv, capsys):
    out = tmp_path / "plan.json"
    assert "--memory-gb" in run_failing(plan_args(tables_csv, out, "size_greedy", 4, float("inf")), capsys, out)


def test_absurd_rows_is_a_one_line_error(tmp_path, capsys):
    out = tmp_path / "plan.json"
    run_failing(plan_args(bad_csv(tmp_path, rows=1e30), out), capsys, out)


def test_unknown_algo_is_rejected_by_argparse(tmp_path, tables_csv, capsys):
    with pytest.raises(SystemExit) as info:
        main(plan_args(tables_csv, tmp_path / "plan.json", "nope"))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("dreamshard plan: error: argument --algo: invalid choice: 'nope'")
    assert not (tmp_path / "plan.json").exists()


def test_installed_console_script(tmp_path, tables_csv):
    exe = Path(sys.executable).parent / "dreamshard"
    assert exe.exists(), "the `dreamshard` console script is not installed in the venv"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    helped = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert helped.returncode == 0, helped.stderr
    assert "plan" in helped.stdout and "plan a tables file onto N devices" in helped.stdout

    failed = subprocess.run([str(exe), *plan_args(tmp_path / "absent.csv", tmp_path / "x.json")],
                            capture_output=True, text=True, env=env, timeout=120)
    assert failed.returncode == 1
    assert "Traceback" not in failed.stderr
    assert failed.stderr.strip().splitlines() == [f"dreamshard: error: {tmp_path / 'absent.csv'}: no such file"]


def test_an_option_the_sharder_does_not_take_is_an_error(tmp_path, tables_csv, capsys):
    out = tmp_path / "plan.json"
    assert main(plan_args(tables_csv, out, "size_greedy", 4, 0.1, "--seed", "3")) == 1
    assert "--seed: sharder 'size_greedy' takes no seed" in capsys.readouterr().err
    assert main(plan_args(tables_csv, out, "random", 4, 0.1, "--model", str(tmp_path / "m.pt"))) == 1
    assert "--model: sharder 'random' takes no model" in capsys.readouterr().err
    assert not out.exists()


def test_a_table_larger_than_a_device_is_planned_in_pieces_and_shown_by_kind(tmp_path, capsys):
    # emb_0 (200k x 128 fp32 = 0.095 GB) on devices of 0.06 GB: two column slices of 64 (0.048 GB)
    path = tmp_path / "tables.csv"
    TABLES.to_csv(path, index=False)
    out = tmp_path / "plan.json"
    assert main(plan_args(path, out, "size_greedy", 4, 0.06)) == 0
    obj = json.loads(out.read_text())
    assert sorted((s["col_start"], s["col_end"]) for s in obj["shards"] if s["table"] == "emb_0") == [(0, 64), (64, 128)]
    assert obj["sharding"] == ["table", "column", "row"]
    task = Task.uniform("check", read_tables_file(path), 4, 0.06)
    validate_plan(task, Plan.from_dict(obj))
    stdout = capsys.readouterr().out
    assert "kinds" in stdout and "1 column" in stdout
    # --sharding table,row: TorchRec's row-wise layout, 50k rows on each of the 4 devices
    assert main(plan_args(path, out, "size_greedy", 4, 0.06, "--sharding", "table,row")) == 0
    obj = json.loads(out.read_text())
    rows = sorted((s["row_start"], s["row_end"], s["device"]) for s in obj["shards"] if s["table"] == "emb_0")
    assert rows == [(i * 50_000, (i + 1) * 50_000, i) for i in range(4)]
    assert "1 row" in capsys.readouterr().out
    # with data: tables of at most 2048 rows (1 feature x 512 x 4 devices a step) are copied to every device
    assert main(plan_args(path, out, "size_greedy", 4, 0.06, "--sharding", "table,column,row,data")) == 0
    obj = json.loads(out.read_text())
    replicated = {s["table"] for s in obj["shards"] if s.get("replica")}
    assert replicated == {"emb_1", "emb_4", "emb_6", "emb_7", "emb_10"}
    validate_plan(replace(task, sharding=("table", "column", "row", "data"),
                          memory=replace(task.memory, batch_size=512, reservation=0.15)), Plan.from_dict(obj))
    assert "5 data" in capsys.readouterr().out
    # table only: no plan, and the error says why
    assert main(plan_args(path, out, "size_greedy", 4, 0.06, "--sharding", "table")) == 1
    assert "table 'emb_0'" in capsys.readouterr().err
    for bad in ("column,row", "table,disk", "table,table"):
        with pytest.raises(SystemExit):
            main(plan_args(path, out, "size_greedy", 4, 0.06, "--sharding", bad))
        assert "--sharding" in capsys.readouterr().err


def test_plan_on_two_hosts_cuts_row_wise_over_one_host_and_exports_table_row_wise(tmp_path, capsys):
    pytest.importorskip("torchrec", reason="torchrec is not installed (see docs/torchrec.md)")
    import torch

    rows = [(1000, 64, 20), (1000, 128, 80), (200_000, 128, 5), (1000, 128, 1), (200_000, 128, 1),
            (4_000_000, 128, 20), (4_000_000, 64, 1), (200_000, 64, 1), (1000, 64, 80), (4_000_000, 64, 80),
            (4_000_000, 64, 5), (200_000, 128, 5)]
    tables = tmp_path / "tables.csv"
    tables.write_text("name,rows,dim,pooling_factor\n" + "".join(f"t{i},{r},{d},{p}\n" for i, (r, d, p) in
                                                                enumerate(rows)))
    devices = tmp_path / "devices.csv"
    devices.write_text("memory_gb,kind,speed,host\n" + "".join(f"4,h100,1.0,node-{i // 4}\n" for i in range(8)))
    common = ["plan", "--tables", str(tables), "--devices-file", str(devices), "--algo", "torchrec_model",
              "--sharding", "table,column,row,host"]
    assert main([*common, "-o", str(tmp_path / "plan.json")]) == 0
    assert main([*common, "--format", "torchrec", "-o", str(tmp_path / "plan.pt")]) == 0
    capsys.readouterr()
    shardings = next(iter(torch.load(tmp_path / "plan.pt", weights_only=False).plan.values()))
    host_wise = {n: ps.ranks for n, ps in shardings.items() if ps.sharding_type == "table_row_wise"}
    assert host_wise and all(ranks in ([0, 1, 2, 3], [4, 5, 6, 7]) for ranks in host_wise.values()), host_wise
    plan = json.loads((tmp_path / "plan.json").read_text())
    for name, ranks in host_wise.items():  # the plan file holds the same blocks
        assert sorted(s["device"] for s in plan["shards"] if s["table"] == name) == ranks
