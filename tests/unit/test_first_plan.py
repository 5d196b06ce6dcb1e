"""A first plan in five minutes (issue 36): README's example lines run over examples/, the example files stay what
they say, `measure --backend analytic` picks a regime and says which, waiting is told apart from transfer, and
re-plans print moved bytes in human units. Everything through the command (dreamshard.cli.main)."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from dreamshard.cli import main
from dreamshard.cli.plan import human_bytes
from dreamshard.data.cluster import task_from_plan
from dreamshard.data.examples import production_model_frame, production_model_tables
from dreamshard.plan import Plan, validate_plan
from dreamshard.tables import read_tables_file
from helpers import PROJECT_ROOT as ROOT
from helpers import one_line_error

EXAMPLES = ROOT / "examples"
README = ROOT / "README.md"


def readme_example_lines() -> list[str]:
    """README's command lines over examples/, in the order they appear."""
    return [line.strip() for line in README.read_text().splitlines()
            if line.startswith("    dreamshard ") and "examples/" in line]


def check_plan(tables: Path, plan_path: Path) -> Plan:
    """The plan file is a valid plan of the tables on the devices (and under the constraints) it records."""
    meta = json.loads(plan_path.read_text())
    plan = Plan.from_dict(meta, str(plan_path))
    task = task_from_plan(tables.stem, read_tables_file(tables), meta, plan.num_devices, str(plan_path), None, None)
    validate_plan(task, plan)
    return plan


@pytest.fixture
def in_a_checkout(tmp_path, monkeypatch) -> Path:
    """A directory that looks like the project root to the command: examples/, metrics/, params.yaml."""
    for name in ("examples", "metrics", "params.yaml"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------- README and examples/


def test_quick_start_puts_the_command_on_the_path():
    text = README.read_text()
    quick = text[text.index("## Quick start"):text.index("## The pipeline")]
    assert quick.index("make run") < quick.index(". .venv/bin/activate") < quick.index("    dreamshard plan")
    assert ".venv/bin/dreamshard" in quick
    command_line = text[text.index("## Command line"):]
    assert ". .venv/bin/activate" in command_line[:command_line.index("    dreamshard plan")]
    assert "need the 17 access-count bins" not in text  # they are estimated when absent


def test_readme_example_lines_run(in_a_checkout, capsys):
    lines = readme_example_lines()
    used = " ".join(lines)
    for name in ("examples/tables.csv", "examples/production_tables.csv", "examples/devices.csv",
                 "examples/constraints.json"):
        assert name in used, name
    assert any(line.startswith("dreamshard measure") for line in lines)
    for line in lines:
        argv = shlex.split(line)[1:]
        assert main(argv) == 0, line
        out = capsys.readouterr().out
        if argv[0] == "plan":
            output = Path(argv[argv.index("-o") + 1])
            tables = Path(argv[argv.index("--tables") + 1])
            plan = check_plan(tables, output)
            assert {s.table for s in plan.shards} == {t.name for t in read_tables_file(tables)}
        else:
            assert "cost (slowest device)" in out and out.startswith("regime "), out


def test_example_tables_have_no_bins():
    tables = read_tables_file(EXAMPLES / "tables.csv")
    assert 8 <= len(tables) <= 16
    assert all(t.bins is None for t in tables)
    assert all(t.bins is None for t in read_tables_file(EXAMPLES / "production_tables.csv"))


def test_production_tables_file_is_the_modules_model():
    """examples/production_tables.csv is dreamshard/data/examples.py's model, written by
    `python -m dreamshard.data.examples examples/production_tables.csv`: the two cannot drift apart."""
    path = EXAMPLES / "production_tables.csv"
    assert path.read_text() == production_model_frame().to_csv(index=False)
    assert read_tables_file(path) == production_model_tables()


# ---------------------------------------------------------------- the analytic backend's regime


def plan_example(tmp_path: Path, capsys, *extra: str) -> Path:
    plan = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(EXAMPLES / "tables.csv"), "--devices", "4", "--memory-gb", "16",
                 "--algo", "size_lookup_greedy", "-o", str(plan), *extra]) == 0
    capsys.readouterr()
    return plan


def measure_argv(plan: Path, *extra: str) -> list[str]:
    return ["measure", "--tables", str(EXAMPLES / "tables.csv"), "--plan", str(plan), "--backend", "analytic",
            *extra]


def cost_of(argv: list[str], capsys) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def elsewhere(tmp_path: Path, monkeypatch) -> Path:
    """A working directory that is not the project's, whose metrics/eval.json and params.yaml say another regime
    than the plan's: measure must not read them."""
    folder = tmp_path / "elsewhere"
    (folder / "metrics").mkdir(parents=True)
    (folder / "metrics" / "eval.json").write_text(json.dumps({
        "backend": "fbgemm", "device": "cpu: Test CPU", "measured": True, "additivity": {"regime": "super_additive"}}))
    (folder / "params.yaml").write_text("backend:\n  analytic:\n    regime: super_additive\n")
    monkeypatch.chdir(folder)
    return folder


def test_plan_prints_and_records_its_estimated_cost(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(EXAMPLES / "tables.csv"), "--devices", "4", "--memory-gb", "16",
                 "--algo", "size_lookup_greedy", "--regime", "sub_additive", "-o", str(plan)]) == 0
    said = capsys.readouterr().out
    estimate = json.loads(plan.read_text())["estimate"]
    assert estimate["backend"] == "analytic" and estimate["regime"] == "sub_additive" and not estimate["measured"]
    assert estimate["batch_size"] == 512 and estimate["cost_ms"] == max(estimate["device_ms"]) > 0
    line = next(ln for ln in said.splitlines() if ln.startswith("estimated cost: "))
    assert f"{estimate['cost_ms']:.3f} ms" in line and "sub_additive" in line and "not measured" in line
    assert "dim_sum: " in said and "kinds: " in said  # the columns are explained


def test_measure_takes_the_plans_regime_wherever_it_runs(tmp_path, monkeypatch, capsys):
    plan = plan_example(tmp_path, capsys, "--regime", "sub_additive")
    elsewhere(tmp_path, monkeypatch)
    assert main(measure_argv(plan)) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"regime sub_additive: the one {plan}'s estimate used; --regime to choose"
    chosen = cost_of(measure_argv(plan), capsys)
    assert chosen["regime"] == "sub_additive" and "estimate" in chosen["regime_chosen"]
    assert chosen["cost_ms"] == pytest.approx(json.loads(plan.read_text())["estimate"]["cost_ms"])
    given = cost_of(measure_argv(plan, "--regime", "sub_additive"), capsys)
    assert given["regime_chosen"] is None and given["cost_ms"] == chosen["cost_ms"]
    assert chosen["device"] == given["device"] == "analytic model (sub_additive regime)"


def test_measure_of_a_plan_without_an_estimate_takes_the_default(tmp_path, monkeypatch, capsys):
    plan = plan_example(tmp_path, capsys)
    meta = json.loads(plan.read_text())
    del meta["estimate"]  # a plan written before plans recorded one
    plan.write_text(json.dumps(meta))
    monkeypatch.chdir(tmp_path)
    assert main(measure_argv(plan)) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"regime super_additive: the default ({plan} records no estimate)"), first
    argv = ["measure", "--tables", str(EXAMPLES / "tables.csv"), "--plan", str(plan), "--backend", "fbgemm",
            "--regime", "sub_additive"]
    assert "only with --backend analytic" in one_line_error(argv, capsys)


def test_report_takes_the_plans_regime(tmp_path, monkeypatch, capsys):
    plan = plan_example(tmp_path, capsys, "--regime", "sub_additive")
    elsewhere(tmp_path, monkeypatch)
    out = tmp_path / "report.html"
    assert main(["report", "--tables", str(EXAMPLES / "tables.csv"), "--plan", str(plan), "--backend", "analytic",
                 "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("regime sub_additive: the one") and lines[1].startswith("report: ")
    assert out.exists() and "sub_additive" in out.read_text()


# ---------------------------------------------------------------- waiting apart from transfer


def test_measure_tells_waiting_from_transfer(tmp_path, capsys):
    """An idle device's forward communication is almost all waiting for the slowest device, and says so."""
    tables = tmp_path / "two.csv"
    tables.write_text("name,rows,dim,pooling_factor\nbig,2000000,64,40.0\nsmall,100,16,1.0\n")
    plan = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(tables), "--devices", "3", "--memory-gb", "16", "--algo",
                 "size_lookup_greedy", "-o", str(plan)]) == 0
    capsys.readouterr()
    argv = ["measure", "--tables", str(tables), "--plan", str(plan), "--backend", "analytic", "--regime",
            "super_additive"]
    out = cost_of(argv, capsys)
    assert all(set(d) == {"fwd_ms", "bwd_ms", "fwd_comm_ms", "bwd_comm_ms"} for d in out["devices"])  # as before
    slowest = max(d["fwd_ms"] for d in out["devices"])
    for d, part in zip(out["devices"], out["comm_split"]):
        assert part["fwd_wait_ms"] == pytest.approx(slowest - d["fwd_ms"])
        assert part["fwd_wait_ms"] + part["fwd_transfer_ms"] == pytest.approx(d["fwd_comm_ms"])
        assert part["bwd_transfer_ms"] == d["bwd_comm_ms"]
    idle = min(range(3), key=lambda i: out["devices"][i]["fwd_ms"])
    assert out["comm_split"][idle]["fwd_wait_ms"] > 10 * out["comm_split"][idle]["fwd_transfer_ms"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    header = next(ln for ln in text.splitlines() if ln.split()[:1] == ["device"])
    assert header.split() == ["device", "fwd_ms", "bwd_ms", "fwd_wait", "fwd_xfer", "bwd_xfer", "total"]
    row = next(ln for ln in text.splitlines() if ln.split()[:1] == [str(idle)]).split()
    assert float(row[3]) == pytest.approx(out["comm_split"][idle]["fwd_wait_ms"], abs=1e-3)
    assert "fwd_wait: idle in the forward all-to-all until the slowest device's forward compute ends" in text


# ---------------------------------------------------------------- moved bytes in human units


@pytest.mark.parametrize("n, text", [(0, "0 B"), (412, "412 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
                                     (0.5 * 1024**3, "512 MiB"), (0.002 * 1024**3, "2.05 MiB"),
                                     (19.07 * 1024**3, "19.1 GiB"), (1000 * 1024, "1000 KiB")])
def test_human_bytes(n, text):
    assert human_bytes(n) == text


def test_replan_prints_moved_bytes_in_human_units(tmp_path, capsys):
    previous = plan_example(tmp_path, capsys)
    out = tmp_path / "plan_v2.json"
    assert main(["plan", "--tables", str(EXAMPLES / "tables.csv"), "--devices", "5", "--memory-gb", "16", "--algo",
                 "size_lookup_greedy", "-o", str(out), "--previous", str(previous), "--max-moved-gb", "0.5",
                 "--backend", "analytic", "--regime", "super_additive"]) == 0
    stdout = capsys.readouterr().out
    line = re.search(r"moved (\d+(?:\.\d+)?) (B|KiB|MiB|GiB) of 512 MiB allowed; cost \S+ ms \(full re-plan \S+ ms "
                     r"moving (\d+(?:\.\d+)?) (B|KiB|MiB|GiB); ", stdout)
    assert line, stdout
    assert "e-0" not in stdout
    check_plan(EXAMPLES / "tables.csv", out)
