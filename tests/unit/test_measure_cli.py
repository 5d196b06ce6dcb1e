"""The `dreamshard measure` command on the analytic backend: output, and one-line errors for bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dreamshard.cli import main
from dreamshard.plan import Plan
from dreamshard.tables import Table
from dreamshard.tasks import Task
from helpers import analytic as backend
from helpers import one_line_error

# ---------------------------------------------------------------- `dreamshard measure`

CLI_TABLES = pd.DataFrame({
    "name": [f"emb_{i}" for i in range(8)],
    "rows": [20_000, 100, 5_000, 70_000, 1_000, 30_000, 250, 9_999],
    "dim": [32, 4, 16, 32, 64, 8, 12, 48],
    "pooling_factor": [1.0, 0.2, 15.5, 3.0, 40.0, 7.25, 100.0, 2.5],
})


@pytest.fixture
def planned(tmp_path, capsys) -> tuple[Path, Path]:
    tables = tmp_path / "tables.csv"
    CLI_TABLES.to_csv(tables, index=False)
    plan = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(tables), "--devices", "3", "--memory-gb", "0.05",
                 "--algo", "lookup_greedy", "-o", str(plan)]) == 0
    capsys.readouterr()
    return tables, plan


def measure(tables: Path, plan: Path, *extra: str) -> list[str]:
    return ["measure", "--tables", str(tables), "--plan", str(plan), "--backend", "analytic",
            "--regime", "super_additive", *extra]


def test_measure_json_with_the_analytic_backend(planned, capsys):
    tables, plan = planned
    assert main(measure(tables, plan, "--json", "--batch-size", "1024")) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"cost_ms", "backend", "device", "devices"} <= set(out)
    assert out["backend"] == "analytic"
    assert "analytic" in out["device"]
    assert out["measured"] is False
    assert out["batch_size"] == 1024
    assert len(out["devices"]) == 3
    for d in out["devices"]:
        assert set(d) == {"fwd_ms", "bwd_ms", "fwd_comm_ms", "bwd_comm_ms"}
        assert all(v >= 0 for v in d.values())
    assert out["cost_ms"] == pytest.approx(max(sum(d.values()) for d in out["devices"]))
    # the same number as the library gives for this task and plan
    task = Task.uniform("tables", [Table(r.name, r.rows, r.dim, r.pooling_factor) for r in CLI_TABLES.itertuples()],
                        3, 0.05)
    expected = backend("super_additive", 1024).plan_cost(task, Plan.load_json(plan))
    assert out["cost_ms"] == pytest.approx(expected.cost_ms)


def test_measure_analytic_takes_the_plans_regime_from_any_directory(planned, capsys, tmp_path, monkeypatch):
    """No --regime: the regime of the estimate the plan records, wherever the command runs (an empty directory
    here); a plan that records none: the documented default."""
    monkeypatch.chdir(tmp_path / "..")  # nothing of the project here
    tables, plan = planned
    argv = measure(tables, plan)
    del argv[argv.index("--regime"): argv.index("--regime") + 2]
    assert main([*argv, "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert chosen["regime"] == "super_additive" and "plan.json's estimate" in chosen["regime_chosen"]
    assert chosen["cost_ms"] == pytest.approx(json.loads(plan.read_text())["estimate"]["cost_ms"])
    meta = json.loads(plan.read_text())
    del meta["estimate"]
    plan.write_text(json.dumps(meta))
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("regime super_additive: the default (")


def test_measure_table_output(planned, capsys):
    tables, plan = planned
    assert main(measure(tables, plan)) == 0
    out = capsys.readouterr().out
    assert "analytic" in out and "modelled, not measured" in out
    assert "cost (slowest device)" in out
    assert len([ln for ln in out.splitlines() if ln.split() and ln.split()[0].isdigit()]) == 3


def test_measure_missing_plan_file(planned, capsys):
    tables, plan = planned
    line = one_line_error(measure(tables, plan.parent / "absent.json"), capsys)
    assert "absent.json" in line and "no such file" in line


def test_measure_plan_not_json(planned, capsys):
    tables, plan = planned
    plan.write_text("{ this is not json")
    line = one_line_error(measure(tables, plan), capsys)
    assert "plan.json" in line and "not valid JSON" in line


@pytest.mark.parametrize("content, words", [
    ("[1, 2, 3]", ["expected a JSON object"]),
    ('{"num_devices": 0, "shards": []}', ["num_devices"]),
    ('{"num_devices": 2, "shards": [{"table": "emb_0", "device": "zero", "col_start": 0, "col_end": 32}]}',
     ["shards[0].device"]),
])
def test_measure_malformed_plan_objects(planned, capsys, content, words):
    tables, plan = planned
    plan.write_text(content)
    line = one_line_error(measure(tables, plan), capsys)
    for w in words:
        assert w in line


def test_measure_plan_with_an_unknown_table(planned, capsys):
    tables, plan = planned
    obj = json.loads(plan.read_text())
    obj["shards"][0]["table"] = "no_such_table"
    plan.write_text(json.dumps(obj))
    line = one_line_error(measure(tables, plan), capsys)
    assert "unknown table" in line and "no_such_table" in line


def test_measure_plan_missing_a_table(planned, capsys):
    tables, plan = planned
    obj = json.loads(plan.read_text())
    dropped = obj["shards"].pop(2)["table"]
    plan.write_text(json.dumps(obj))
    line = one_line_error(measure(tables, plan), capsys)
    assert dropped in line and "not placed" in line


def test_measure_plan_without_memory(planned, capsys):
    tables, plan = planned
    obj = json.loads(plan.read_text())
    del obj["memory_gb"], obj["devices"]  # plans record their devices, and older ones memory_gb
    plan.write_text(json.dumps(obj))
    assert "--memory-gb" in one_line_error(measure(tables, plan), capsys)
    assert main(measure(tables, plan, "--memory-gb", "0.05")) == 0


def test_measure_plan_over_memory(planned, capsys):
    tables, plan = planned
    line = one_line_error(measure(tables, plan, "--memory-gb", "0.001"), capsys)
    assert "capacity" in line


@pytest.mark.parametrize("write, words", [
    (lambda p: CLI_TABLES.drop(columns=["rows"]).to_csv(p, index=False), ["missing column", "rows"]),
    (lambda p: p.write_text("name,rows,dim,pooling_factor\n"), ["no tables"]),
    (lambda p: CLI_TABLES.assign(dim=[6] + [4] * 7).to_csv(p, index=False), ["emb_0", "multiple of 4"]),
    (lambda p: None, ["no such file"]),
])
def test_measure_bad_tables_file(planned, capsys, tmp_path, write, words):
    _, plan = planned
    bad = tmp_path / "bad_tables.csv"
    write(bad)
    line = one_line_error(measure(bad, plan), capsys)
    assert "bad_tables.csv" in line
    for w in words:
        assert w in line



def test_measure_runs_at_the_batch_the_plan_records(planned, capsys, tmp_path):
    tables, plan = planned
    assert json.loads(plan.read_text())["batch_size"] == 512  # `plan`'s default, recorded
    assert main(measure(tables, plan, "--json")) == 0
    assert json.loads(capsys.readouterr().out)["batch_size"] == 512
    obj = json.loads(plan.read_text())
    del obj["batch_size"]  # a plan that records none: the old default
    old = tmp_path / "old.json"
    old.write_text(json.dumps(obj))
    assert main(measure(tables, old, "--json")) == 0
    assert json.loads(capsys.readouterr().out)["batch_size"] == 2048
    assert main(measure(tables, plan, "--json", "--batch-size", "0")) == 1
    assert "--batch-size: expected an integer in [1, 16777216], got 0" in capsys.readouterr().err


@pytest.mark.parametrize("recorded", [0, -5, 2.5, "512", True, 2**30])
def test_a_plans_bad_batch_size_is_an_error_not_2048(planned, capsys, tmp_path, recorded):
    """A batch_size the plan file records is one `plan` could have written, or an error naming it; never silently
    replaced by the default."""
    tables, plan = planned
    obj = json.loads(plan.read_text())
    obj["batch_size"] = recorded
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(obj))
    err = one_line_error(measure(tables, bad), capsys)
    assert "bad.json" in err and "batch_size: expected an integer in [1, 16777216]" in err and repr(recorded) in err


def test_plans_with_replicas_and_caches_are_measured_as_planned(tmp_path, capsys):
    """`plan --sharding ...,data --uvm-caching` on devices too small for every table: the plan file records the
    kinds and kernels, `measure` rebuilds that task and prices the plan (analytic); FBGEMM's CPU kernels refuse a
    cached table in one line."""
    tables = tmp_path / "tables.csv"
    CLI_TABLES.to_csv(tables, index=False)
    plan = tmp_path / "plan.json"
    # 17.5 MiB of tables and buffers on 3 x 5.1 MiB (4.35 MiB usable each): no plan without host memory
    args = ["plan", "--tables", str(tables), "--devices", "3", "--memory-gb", "0.005", "--algo", "lookup_greedy",
            "-o", str(plan)]
    assert main(args) == 1
    assert "allow the fused_uvm_caching kernel" in capsys.readouterr().err
    assert main([*args, "--sharding", "table,column,row,data", "--uvm-caching"]) == 0
    assert "cached" in capsys.readouterr().out
    obj = json.loads(plan.read_text())
    assert obj["kernels"] == ["fused", "fused_uvm_caching"] and "data" in obj["sharding"]
    assert any("cache_load_factor" in s for s in obj["shards"]) and any(s.get("replica") for s in obj["shards"])
    assert main(measure(tables, plan, "--json")) == 0
    assert json.loads(capsys.readouterr().out)["cost_ms"] > 0
    assert "UVM-cached (fused_uvm_caching), a CUDA kernel" in one_line_error(
        ["measure", "--tables", str(tables), "--plan", str(plan), "--backend", "fbgemm"], capsys)
