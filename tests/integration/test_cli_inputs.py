"""Inputs users really write (issue 36), through the command: every limit ends in a one-line error within
seconds, a plan says what made it, and each mistake seen in the field is an error a person understands."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dreamshard import limits
from dreamshard.cli import main
from dreamshard.learning.cost_model import CostNetConfig
from dreamshard.learning.features import NUM_FEATURES, FeatureScaler
from dreamshard.learning.policy import LearnedModel, PolicyNetConfig
from dreamshard.tables import BIN_COLUMNS
from helpers import one_line_error

SECONDS = 20  # a limit's error comes at once; this bound only catches a hang (the machine is shared and slow)

TABLES = pd.DataFrame({
    "name": [f"emb_{i}" for i in range(6)],
    "rows": [20_000, 100, 5_000, 7_000, 1_000, 3_000],
    "dim": [32, 4, 16, 32, 64, 8],
    "pooling_factor": [1.0, 0.2, 15.5, 3.0, 40.0, 7.25],
})
HOT = [1.0] + [0.0] * 16  # access-count bins: every row seen once
MEASURE = ["--backend", "analytic", "--regime", "super_additive"]


def quick_error(argv: list[str], capsys) -> str:
    """The one-line error of `dreamshard ARGV`, which must come within SECONDS."""
    start = time.monotonic()
    line = one_line_error(argv, capsys)
    assert time.monotonic() - start < SECONDS, f"{argv}: {time.monotonic() - start:.1f} s"
    return line


@pytest.fixture
def tables(tmp_path) -> Path:
    path = tmp_path / "tables.csv"
    TABLES.to_csv(path, index=False)
    return path


def plan_argv(tables: Path, out: Path, *extra: str, devices: int = 3, algo: str = "size_greedy") -> list[str]:
    return ["plan", "--tables", str(tables), "--devices", str(devices), "--memory-gb", "0.05", "--algo", algo,
            "-o", str(out), *extra]


@pytest.fixture
def planned(tables, tmp_path, capsys) -> Path:
    out = tmp_path / "plan.json"
    assert main(plan_argv(tables, out)) == 0
    capsys.readouterr()
    return out


# ---------------------------------------------------------------- bounded work


def test_a_huge_dim_is_refused_at_once(tmp_path, capsys):
    path = tmp_path / "huge.csv"
    path.write_text(f"name,rows,dim,pooling_factor\nbig,100000,{2**40},2\n")
    err = quick_error(plan_argv(path, tmp_path / "p.json"), capsys)
    assert "huge.csv" in err and "'dim'" in err and str(limits.MAX_DIM) in err


def test_the_largest_dim_is_cut_in_seconds(tmp_path, capsys):
    """At MAX_DIM a table too large for a device is cut into column slices quickly (the cut search was quadratic)."""
    path = tmp_path / "wide.csv"
    path.write_text(f"name,rows,dim,pooling_factor\nwide,100000,{limits.MAX_DIM},2\nsmall,10,4,1\n")
    start = time.monotonic()
    assert main(["plan", "--tables", str(path), "--devices", "8", "--memory-gb", "4", "--algo", "size_greedy",
                 "-o", str(tmp_path / "p.json")]) == 0
    assert time.monotonic() - start < SECONDS
    assert "column" in capsys.readouterr().out


def test_too_many_rows_are_refused(tmp_path, capsys):
    path = tmp_path / "rows.csv"
    path.write_text(f"name,rows,dim,pooling_factor\nbig,{limits.MAX_ROWS + 4},4,2\n")
    err = quick_error(plan_argv(path, tmp_path / "p.json"), capsys)
    assert "rows.csv" in err and "'rows'" in err and str(limits.MAX_ROWS) in err


def test_too_many_devices_are_refused(tables, tmp_path, capsys):
    err = quick_error(plan_argv(tables, tmp_path / "p.json", devices=10**9), capsys)
    assert "--devices" in err and str(limits.MAX_DEVICES) in err
    many = tmp_path / "devices.json"
    many.write_text(json.dumps([{"memory_gb": 1}] * (limits.MAX_DEVICES + 1)))
    argv = ["plan", "--tables", str(tables), "--devices-file", str(many), "--algo", "size_greedy", "-o",
            str(tmp_path / "p.json")]
    err = quick_error(argv, capsys)
    assert "devices.json" in err and str(limits.MAX_DEVICES) in err


def test_a_plan_of_too_many_devices_is_not_measured(tables, planned, tmp_path, capsys):
    meta = json.loads(planned.read_text())
    meta["num_devices"] = 10**9
    meta.pop("devices")
    huge = tmp_path / "huge_plan.json"
    huge.write_text(json.dumps(meta))
    err = quick_error(["measure", "--tables", str(tables), "--plan", str(huge), *MEASURE], capsys)
    assert "huge_plan.json" in err and "num_devices" in err and str(limits.MAX_DEVICES) in err


@pytest.mark.parametrize("command", ["measure", "report"])
def test_measure_and_report_refuse_what_memory_cannot_hold(command, tmp_path, capsys, monkeypatch):
    """1,400 tables on 100,000 devices plan in seconds, but costing them takes arrays per table and device (the
    all-to-all model itself is linear in the devices): refused with the figure, before allocating (the machine is
    made to have 8 GiB available, so that the test means the same everywhere)."""
    monkeypatch.setattr(limits, "available_memory_bytes", lambda: 8 * 2**30)
    path = tmp_path / "small.csv"
    path.write_text("name,rows,dim,pooling_factor\n" + "".join(f"t{i},1000,16,2\n" for i in range(1400)))
    plan = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(path), "--devices", "100000", "--memory-gb", "1", "--algo", "size_greedy",
                 "--batch-size", "1", "-o", str(plan)]) == 0  # at batch 1 each table's buffers fit a device
    assert "estimated cost: not computed for 100000 devices x 1400 tables" in capsys.readouterr().out
    assert "estimate" not in json.loads(plan.read_text())
    extra = ["-o", str(tmp_path / "r.html")] if command == "report" else []
    err = quick_error([command, "--tables", str(path), "--plan", str(plan), *MEASURE, *extra], capsys)
    assert "plan.json" in err and "100000 devices" in err and "GiB" in err and "8.0 GiB are available" in err
    assert not (tmp_path / "r.html").exists()


def test_a_small_plan_is_measured_under_the_memory_check(tables, planned, capsys, monkeypatch):
    monkeypatch.setattr(limits, "available_memory_bytes", lambda: 8 * 2**30)
    assert main(["measure", "--tables", str(tables), "--plan", str(planned), *MEASURE]) == 0


def test_available_memory_is_read():
    assert 0 < limits.available_memory_bytes() < 2**60


def test_too_many_samples_are_refused(tables, tmp_path, capsys):
    model = checkpoint(tmp_path / "dreamshard.pt", "dreamshard")
    binned = with_bins(tables, tmp_path)
    err = quick_error(plan_argv(binned, tmp_path / "p.json", "--model", str(model), "--samples", "1000000000",
                                algo="dreamshard"), capsys)
    assert "--samples" in err and str(limits.MAX_SAMPLES) in err


# ---------------------------------------------------------------- a broken pipe


def test_a_closed_stdout_exits_0_once_the_plan_is_written(tables, tmp_path):
    """`dreamshard plan ... | head -1`: the reader goes away; the plan is written, and that is success."""
    out = tmp_path / "plan.json"
    argv = [sys.executable, "-m", "dreamshard.cli", *plan_argv(tables, out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command prints anything: its first write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert err == ""
    assert json.loads(out.read_text())["num_devices"] == 3


# ---------------------------------------------------------------- plans that say what made them


def checkpoint(path: Path, algorithm: str | None, **meta_extra) -> Path:
    """A tiny (untrained, seeded) DreamShard/AutoShard checkpoint, saved as training saves one."""
    gen = torch.Generator().manual_seed(0)
    scaler = FeatureScaler.fit(np.abs(np.random.default_rng(0).normal(size=(32, NUM_FEATURES))) * 10)
    meta = ({} if algorithm is None else {"algorithm": algorithm}) | meta_extra
    LearnedModel(CostNetConfig(hidden=16, embed=8, head_hidden=8).build(gen),
                 PolicyNetConfig(hidden=16, embed=8, head_hidden=8).build(gen), scaler, meta).save(path)
    return path


def with_bins(tables: Path, tmp_path: Path) -> Path:
    df = pd.read_csv(tables)
    for c, v in zip(BIN_COLUMNS, HOT):
        df[c] = v
    path = tmp_path / "binned.csv"
    df.to_csv(path, index=False)
    return path


def test_a_plan_records_the_sharder_checkpoint_bins_and_version(tables, tmp_path, capsys):
    model = checkpoint(tmp_path / "dreamshard.pt", "dreamshard")
    out = tmp_path / "plan.json"
    assert main(plan_argv(with_bins(tables, tmp_path), out, "--model", str(model), algo="dreamshard")) == 0
    made = json.loads(out.read_text())["made_by"]
    assert made["sharder"] == "dreamshard" and made["tool"] == "dreamshard" and made["version"]
    assert made["model"] == {"path": str(model), "sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
                             "kind": "policy", "algorithm": "dreamshard"}
    assert made["bins"] == {"source": "tables file", "in_file": 6, "estimated": 0}
    heuristic = tmp_path / "heuristic.json"
    assert main(plan_argv(tables, heuristic)) == 0
    made = json.loads(heuristic.read_text())["made_by"]
    assert made["model"] is None and made["bins"]["source"] == "not read by the sharder"


def test_a_checkpoint_of_other_hardware_is_refused_for_the_compute_device_given(tables, tmp_path, capsys):
    model = checkpoint(tmp_path / "cpu.pt", "dreamshard", backend="fbgemm", device="cpu: AMD EPYC (1 thread)")
    binned, out = with_bins(tables, tmp_path), tmp_path / "plan.json"
    argv = plan_argv(binned, out, "--model", str(model), algo="dreamshard")
    err = quick_error([*argv, "--compute-device", "cuda"], capsys)
    assert "trained on cpu kernel timings, but --compute-device is cuda" in err and "--force" in err
    assert not out.exists()
    assert main([*argv, "--compute-device", "cuda", "--force"]) == 0
    assert main([*argv, "--compute-device", "cpu"]) == 0 and main(argv) == 0


def test_a_checkpoint_of_another_algorithm_is_refused(tables, tmp_path, capsys):
    auto = checkpoint(tmp_path / "autoshard.pt", "autoshard")
    out = tmp_path / "plan.json"
    err = quick_error(plan_argv(with_bins(tables, tmp_path), out, "--model", str(auto), algo="dreamshard"), capsys)
    assert "autoshard.pt" in err and "'autoshard'" in err and "'dreamshard'" in err
    unlabelled = checkpoint(tmp_path / "unlabelled.pt", None)
    err = quick_error(plan_argv(with_bins(tables, tmp_path), out, "--model", str(unlabelled), algo="autoshard"),
                      capsys)
    assert "unlabelled.pt" in err and "records no algorithm" in err
    assert not out.exists()


def test_previous_plan_of_other_tables_needs_allow_new_tables(tables, planned, tmp_path, capsys):
    other = tmp_path / "other.csv"
    pd.DataFrame({"name": ["x", "y"], "rows": [100, 200], "dim": [8, 8], "pooling_factor": [1.0, 2.0]}).to_csv(
        other, index=False)
    out = tmp_path / "replan.json"
    argv = plan_argv(other, out, "--previous", str(planned), "--max-moved-gb", "1", *MEASURE)
    err = quick_error(argv, capsys)
    assert "plan.json" in err and "added 2 ('x', 'y')" in err and "removed 6" in err and "--allow-new-tables" in err
    assert not out.exists()
    assert main([*argv, "--allow-new-tables"]) == 0
    said = capsys.readouterr().out
    assert "added 2 ('x', 'y')" in said and "removed 6 ('emb_0'" in said
    rec = json.loads(out.read_text())["replan"]
    assert rec["added"] == ["x", "y"] and len(rec["removed"]) == 6
    assert "only with --previous" in quick_error(plan_argv(other, out, "--allow-new-tables"), capsys)


# ---------------------------------------------------------------- errors a person understands


@pytest.mark.parametrize("kind", ["text", "zip", "truncated", "empty", "pickle"])
def test_an_unreadable_checkpoint_is_a_clear_error(kind, tables, tmp_path, capsys):
    path = tmp_path / f"{kind}.pt"
    if kind == "text":
        path.write_text("epoch 3 loss 0.25\n")
    elif kind == "zip":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("notes.txt", "not a model")
    elif kind == "truncated":
        whole = checkpoint(tmp_path / "whole.pt", "dreamshard").read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    err = quick_error(plan_argv(with_bins(tables, tmp_path), tmp_path / "p.json", "--model", str(path),
                                algo="dreamshard"), capsys)
    assert f"{kind}.pt" in err and "model checkpoint" in err and "train" in err
    for cryptic in ("pop from empty list", "Errno", ": 101", "central directory"):
        assert cryptic not in err


def test_a_binary_plan_given_to_measure(tables, tmp_path, capsys):
    """A --format torchrec plan is a torch.save file; measure reads plan JSON."""
    for name, data in (("torchrec_plan.pt", None), ("pickled.pt", pickle.dumps({"plan": 1}))):
        path = tmp_path / name
        if data is None:
            torch.save({"ebc": {"emb_0": [0, 1]}}, path)
        else:
            path.write_bytes(data)
        err = quick_error(["measure", "--tables", str(tables), "--plan", str(path), *MEASURE], capsys)
        assert name in err and "plan JSON" in err and "--format json" in err and "utf-8" not in err


def test_a_table_resized_since_planning(tables, planned, capsys):
    TABLES.assign(dim=[32, 4, 32, 32, 64, 8]).to_csv(tables, index=False)  # emb_2: 16 -> 32
    err = quick_error(["measure", "--tables", str(tables), "--plan", str(planned), *MEASURE], capsys)
    assert "'emb_2'" in err and "dim 32" in err and "dim 16" in err and "plan.json" in err and "re-plan" in err
    assert "not placed" not in err


def test_a_plan_without_shapes_of_other_tables(tables, planned, tmp_path, capsys):
    """Plans written before table_shapes: the mismatch is still said with both files and what to do."""
    meta = json.loads(planned.read_text())
    del meta["table_shapes"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(meta))
    TABLES.assign(dim=[32, 4, 32, 32, 64, 8]).to_csv(tables, index=False)
    err = quick_error(["measure", "--tables", str(tables), "--plan", str(old), *MEASURE], capsys)
    assert "old.json" in err and "tables.csv" in err and "re-plan" in err


def test_output_naming_a_directory(tables, planned, tmp_path, capsys):
    folder = tmp_path / "adir"
    folder.mkdir()
    err = quick_error(plan_argv(tables, folder), capsys)
    assert "-o" in err and "adir" in err and "is a directory" in err and ".tmp" not in err
    err = quick_error(["report", "--tables", str(tables), "--plan", str(planned), *MEASURE, "-o", str(folder)],
                      capsys)
    assert "adir" in err and "is a directory" in err and ".tmp" not in err
    assert list(folder.iterdir()) == []


def test_regime_with_a_measuring_backend(tables, planned, capsys):
    err = quick_error(["measure", "--tables", str(tables), "--plan", str(planned), "--backend", "fbgemm",
                       "--regime", "sub_additive"], capsys)
    assert "--regime" in err and "analytic" in err


# ---------------------------------------------------------------- plan files checked as a whole (issue 53)


def edited(planned: Path, tmp_path: Path, name: str, edit) -> Path:
    """A copy of the plan file, `edit`ed (a function of its object)."""
    meta = json.loads(planned.read_text())
    edit(meta)
    path = tmp_path / name
    path.write_text(json.dumps(meta))
    return path


def replan_argv(tables: Path, previous: Path, out: Path) -> list[str]:
    return plan_argv(tables, out, "--previous", str(previous), "--max-moved-gb", "1", *MEASURE)


def test_a_device_out_of_range_is_said_so(tables, planned, tmp_path, capsys):
    def far(meta):
        meta["shards"][0]["device"] = 9

    bad = edited(planned, tmp_path, "far.json", far)
    for argv in (["measure", "--tables", str(tables), "--plan", str(bad), *MEASURE],
                 replan_argv(tables, bad, tmp_path / "new.json")):
        err = quick_error(argv, capsys)
        assert "far.json" in err and "device 9 out of range 0..2" in err and "exactly once" not in err
    assert not (tmp_path / "new.json").exists()


def test_previous_is_checked_like_measures_plan(tables, planned, tmp_path, capsys):
    """A shard of a table the plan does not record, or a recorded table without shards: errors, not
    "added [] removed []" nor a re-plan that takes the plan for whole."""
    def unknown(meta):
        meta["shards"].append({**meta["shards"][0], "table": "ghost"})

    def missing(meta):
        meta["shards"] = [s for s in meta["shards"] if s["table"] != "emb_3"]

    out = tmp_path / "new.json"
    err = quick_error(replan_argv(tables, edited(planned, tmp_path, "ghost.json", unknown), out), capsys)
    assert "--previous" in err and "ghost.json" in err and "'ghost'" in err and "table_shapes" in err
    err = quick_error(replan_argv(tables, edited(planned, tmp_path, "missing.json", missing), out), capsys)
    assert "missing.json" in err and "'emb_3'" in err and "no shard" in err
    for plan in ("ghost.json", "missing.json"):  # measure refuses them too
        err = quick_error(["measure", "--tables", str(tables), "--plan", str(tmp_path / plan), *MEASURE], capsys)
        assert plan in err
    assert not out.exists()


def test_unknown_keys_and_another_version_are_warned_of(tables, planned, tmp_path, capsys):
    def odd(meta):
        meta["colour"] = "blue"
        meta["shards"][1]["note"] = "moved by hand"
        meta["made_by"]["version"] = "0.0.1"

    path = edited(planned, tmp_path, "odd.json", odd)
    assert main(["measure", "--tables", str(tables), "--plan", str(path), *MEASURE]) == 0
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("dreamshard: warning: --plan ") for w in warnings)
    assert "unknown key(s) 'colour', 'shards[1].note' ignored" in warnings[0]
    assert "written by dreamshard 0.0.1" in warnings[1]
    assert main(["measure", "--tables", str(tables), "--plan", str(planned), *MEASURE]) == 0
    assert capsys.readouterr().err == ""  # a plan of this version, as written: no warning
    assert main(replan_argv(tables, path, tmp_path / "new.json")) == 0
    assert "--previous" in capsys.readouterr().err


def test_measure_refuses_memory_gb_with_a_devices_file(tables, planned, tmp_path, capsys):
    devices = tmp_path / "devices.csv"
    devices.write_text("memory_gb\n1\n1\n1\n")
    err = quick_error(["measure", "--tables", str(tables), "--plan", str(planned), *MEASURE, "--memory-gb",
                       "0.0001", "--devices-file", str(devices)], capsys)
    assert "--devices-file replaces --memory-gb" in err


def test_a_model_directory_is_said_to_be_one(tables, tmp_path, capsys):
    folder = tmp_path / "models"
    folder.mkdir()
    err = quick_error(plan_argv(with_bins(tables, tmp_path), tmp_path / "p.json", "--model", str(folder),
                                algo="dreamshard"), capsys)
    assert f"--model {folder}: is a directory" in err and "checkpoint file" in err


def test_profile_of_a_garbage_pt_is_one_line(tmp_path, capsys):
    garbage = tmp_path / "day_0.pt"
    garbage.write_bytes(b"\x80\x04garbage" * 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's warning about the pickle's protocol would print lines of its own
        err = quick_error(["profile", "--lookups", str(garbage), "--dim", "16", "--no-progress", "-o",
                           str(tmp_path / "t.csv")], capsys)
    assert "day_0.pt: cannot be read as a torch.save file (UnpicklingError)" in err and "weights_only" not in err
    assert not (tmp_path / "t.csv").exists()


# ---------------------------------------------------------------- near every limit: a valid plan or one line


def mostly(good: list, bad: list) -> st.SearchStrategy:
    """A value at or inside a limit four times as often as one beyond it."""
    return st.sampled_from(good * 4 + bad)


NEAR = [mostly(["1", "1000", "2e6"], [str(limits.MAX_ROWS), str(limits.MAX_ROWS + 1), "1e30", "0", "2.5"]),
        mostly(["4", "64", "512"], [str(limits.MAX_DIM), str(limits.MAX_DIM + 4), "6", "1e30"]),
        mostly(["0", "3.5", "200"], [str(limits.MAX_POOLING_FACTOR), str(limits.MAX_POOLING_FACTOR + 1), "1e300", "-1",
                                     "nan"]),
        mostly([None, HOT, [0.0] * 17, [0.5, 0.495] + [0.0] * 15], [[0.9] * 17, [0.5, 0.45] + [0.0] * 15])]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(*NEAR), min_size=1, max_size=3),
       devices=mostly(["1", "3"], [str(limits.MAX_DEVICES), str(limits.MAX_DEVICES + 1)]),
       batch=mostly(["1", "512"], [str(limits.MAX_BATCH_SIZE), str(limits.MAX_BATCH_SIZE + 1)]))
def test_inputs_near_every_limit_plan_or_fail_in_one_line(tmp_path, capsys, rows, devices, batch):
    header = "name,rows,dim,pooling_factor," + ",".join(BIN_COLUMNS)
    lines = [header] + [f"t{i},{r},{d},{p}," + ",".join("" if b is None else f"{x:g}" for x in (b or [None] * 17))
                        for i, (r, d, p, b) in enumerate(rows)]
    tables = tmp_path / "near.csv"
    tables.write_text("\n".join(lines) + "\n")
    out = tmp_path / "near.json"
    out.unlink(missing_ok=True)
    argv = ["plan", "--tables", str(tables), "--devices", devices, "--memory-gb", "64", "--batch-size", batch,
            "--sharding", "table", "--algo", "size_greedy", "-o", str(out)]
    start = time.monotonic()
    rc = main(argv)
    captured = capsys.readouterr()
    assert time.monotonic() - start < SECONDS
    event("a plan" if rc == 0 else "an error")
    if rc == 0:
        from dreamshard.data.cluster import task_from_plan
        from dreamshard.plan import Plan, validate_plan
        from dreamshard.tables import read_tables_file

        meta = json.loads(out.read_text())
        plan = Plan.from_dict(meta)
        validate_plan(task_from_plan("near", read_tables_file(tables), meta, plan.num_devices, "near"), plan)
    else:
        assert rc == 1 and captured.out == "" and not out.exists()
        assert len(captured.err.strip().splitlines()) == 1 and captured.err.startswith("dreamshard: error: ")
        assert len(captured.err) < 400  # no 300-digit numbers


DEVICE_NEAR = [mostly(["0.001", "16", "80"], ["0", "-1", "1e30", "nan", "x"]),  # memory_gb
               mostly(["", "h100"], ["a" * 300]),  # kind
               mostly(["1", "0.5", "2"], ["0", "-2", "inf", "nan"]),  # speed
               mostly(["node-a", "node-b"], [""])]  # host (all named, or a file that mixes)


def one_line_or_valid(rc: int, captured, out: Path | None) -> None:
    """The two outcomes a command may have: success, or one line on stderr and no output file."""
    if rc != 0:
        assert rc == 1 and (out is None or not out.exists()), captured
        assert len(captured.err.strip().splitlines()) == 1 and captured.err.startswith("dreamshard: error: ")
        assert len(captured.err) < 400


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(devices=st.lists(st.tuples(*DEVICE_NEAR), min_size=1, max_size=4))
def test_devices_files_near_every_limit_plan_or_fail_in_one_line(tmp_path, capsys, devices):
    tables = tmp_path / "t.csv"
    tables.write_text("name,rows,dim,pooling_factor\na,1000,16,2\nb,50000,64,8\nc,10,4,1\n")
    devices_file = tmp_path / "d.csv"
    devices_file.write_text("memory_gb,kind,speed,host\n" + "".join(",".join(d) + "\n" for d in devices))
    out = tmp_path / "p.json"
    out.unlink(missing_ok=True)
    start = time.monotonic()
    rc = main(["plan", "--tables", str(tables), "--devices-file", str(devices_file), "--algo", "size_greedy",
               "-o", str(out)])
    assert time.monotonic() - start < SECONDS
    event("a plan" if rc == 0 else "an error")
    one_line_or_valid(rc, capsys.readouterr(), out)


# one field of a valid plan's shard set near or beyond its limit ("keep": the valid plan as it is)
SHARD_CHANGES = st.sampled_from([("keep", None)] * 20 + [
    ("table", "zz"), ("table", ""), ("device", 2), ("device", -1), ("device", 2**40), ("device", "0"),
    ("col_start", -4), ("col_start", 16), ("col_start", 2**70), ("col_end", 0), ("col_end", 20), ("col_end", 1e30),
    ("cache_load_factor", 0.0), ("cache_load_factor", 1.5), ("cache_load_factor", "x"), ("drop", None),
    ("twice", None), ("replica", "yes"), ("row_start", 5), ("row_end", 10**6)])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(change=SHARD_CHANGES, which=st.integers(0, 1),
       batch=mostly([512, None], [0, -1, 2**40, "512", 1.5]),
       num_devices=mostly([2, 2, 2], [0, -1, 2**40, "2"]))
def test_plan_files_near_every_limit_measure_or_fail_in_one_line(tmp_path, capsys, change, which, batch,
                                                                 num_devices):
    tables = tmp_path / "t.csv"
    tables.write_text("name,rows,dim,pooling_factor\na,1000,16,2\nb,100,16,1\n")
    shards = [{"table": "a", "device": 0, "col_start": 0, "col_end": 16},
              {"table": "b", "device": 1, "col_start": 0, "col_end": 16}]
    key, value = change
    if key == "drop":
        shards.pop(which)
    elif key == "twice":
        shards.append(dict(shards[which]))
    elif key != "keep":
        shards[which][key] = value
    plan = {"num_devices": num_devices, "shards": shards}
    if batch is not None:
        plan["batch_size"] = batch
    plan_file = tmp_path / "p.json"
    plan_file.write_text(json.dumps(plan))
    start = time.monotonic()
    rc = main(["measure", "--tables", str(tables), "--plan", str(plan_file), "--backend", "analytic",
               "--memory-gb", "1"])
    assert time.monotonic() - start < SECONDS
    event("measured" if rc == 0 else "an error")
    one_line_or_valid(rc, capsys.readouterr(), None)
