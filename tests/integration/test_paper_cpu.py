"""A long run kept in a folder and continued elsewhere (tools/paper_cpu.py), on the tiny analytic pipeline."""
from __future__ import annotations

import importlib
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dreamshard.evaluation.evaluate import evaluate_task
from dreamshard.evaluation.summary import interleave_families
from helpers import tiny_params
from tools import paper_cpu

SHARDERS = ["random", "size_greedy", "neuroshard"]  # one trained model: its checkpoint travels too


class Killed(Exception):
    pass


def git_repo(path: Path) -> Path:
    """A repository standing for the project at the run's commit (its code folders empty: nothing differs)."""
    path.mkdir()
    (path / "stages").mkdir()
    (path / "stages" / "placeholder.py").write_text("# the run's code\n")
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "run"]):
        subprocess.run(["git", *cmd], cwd=path, check=True)
    return path


@contextmanager
def journal_files(kept: Path, tmp_path: Path) -> Iterator[list[Path]]:
    """The kept journal's files, unpacked to change them; packed into a fresh archive afterwards."""
    folder = tmp_path / "unpacked_journal"
    paper_cpu.unpack_journal(kept / "state" / paper_cpu.JOURNAL_ARCHIVE, folder)
    yield sorted(folder.glob("task-*.parquet"))
    (kept / "state" / paper_cpu.JOURNAL_ARCHIVE).unlink()
    paper_cpu.pack_journal(sorted(folder.glob("*")), kept / "state" / paper_cpu.JOURNAL_ARCHIVE)
    for f in folder.glob("*"):
        f.unlink()


def data_stages(params):
    for stage in ("download", "process", "tasks"):
        importlib.import_module(f"stages.{stage}").run(params)


@pytest.fixture
def tiny_data(tiny_project):
    """rebuild(params) for paper_cpu.restore: the tiny project's data and tasks (what data_stages makes of
    tiny_params) copied into the working folder, where the run's relative paths point."""
    return lambda params: tiny_project("tasks").copy_to(Path.cwd())


def counting_evaluate(monkeypatch, crash_on: set[str]) -> list[str]:
    evaluate = importlib.import_module("stages.evaluate")
    seen: list[str] = []

    def counting(backend, task, *args, **kwargs):
        if task.name in crash_on:
            raise Killed(task.name)
        seen.append(task.name)
        return evaluate_task(backend, task, *args, **kwargs)

    monkeypatch.setattr(evaluate, "evaluate_task", counting)
    return seen


@pytest.fixture
def stopped_run(tmp_path, monkeypatch, tiny_data):
    """A run of the tiny pipeline whose evaluate was killed at its third task, saved to kept/."""
    root = git_repo(tmp_path / "project")
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)
    params = tiny_params()  # relative paths, as in params.yaml
    params["evaluate"].update(sharders=SHARDERS, estimated_bins={"tasks_per_family": 0, "rounds": 1})
    params["orchestration"] = {"evaluate": {"planning_workers": 1, "planning_chunk": 1}}
    Path("params.yaml").write_text(yaml.safe_dump(params))
    tiny_data(params)
    for stage in ("collect_devices", "train_neuroshard"):
        importlib.import_module(f"stages.{stage}").run(params)
    from dreamshard.tasks import read_tasks

    order = [t.name for t in interleave_families(read_tasks(Path(params["paths"]["tasks"]) / "test.parquet",
                                                            params["paths"]["tables"]))]
    seen = counting_evaluate(monkeypatch, {order[2]})
    with pytest.raises(Killed):
        importlib.import_module("stages.evaluate").run(params)
    assert seen == order[:2]
    prov = paper_cpu.save(Path("params.yaml"), tmp_path / "kept", root, prefect_db=tmp_path / "none.db")
    return {"root": root, "kept": tmp_path / "kept", "order": order, "provenance": prov, "params": params}


def test_a_stopped_run_is_saved_with_its_progress_and_a_partial_summary(stopped_run):
    kept, prov = stopped_run["kept"], stopped_run["provenance"]
    assert prov["progress"]["journaled"] == 2 and prov["progress"]["total"] == len(stopped_run["order"])
    assert not prov["finished"]
    assert prov["commit"] == subprocess.run(["git", "rev-parse", "HEAD"], cwd=stopped_run["root"], text=True,
                                            capture_output=True, check=True).stdout.strip()
    metrics = json.loads((kept / "eval.json").read_text())
    assert metrics["partial"] is True
    # the two journaled tasks are the first of each family (families in turns), each with every sharder
    counts = {f: {a: v["num_tasks"] for a, v in algos.items() if isinstance(v, dict)}
              for f, algos in metrics["families"].items()}
    assert counts == {f: {s: 1 for s in SHARDERS} for f in ("tiny-6-2", "tiny-8-4")}
    assert metrics["additivity"]["fused_over_sum_of_singles"]  # the run's fusion probe, read not measured
    assert (kept / "state" / "models" / "neuroshard.pt").exists()
    archive = kept / "state" / paper_cpu.JOURNAL_ARCHIVE
    assert sorted(n for n in paper_cpu.journal_members(archive) if n.startswith("task-")) == sorted(
        f.name for f in Path("data/eval_journal").glob("task-*.parquet"))  # the journal, as one archive
    assert len([n for n in paper_cpu.journal_members(archive) if n.startswith("task-")]) == 2
    assert not (kept / "state" / "eval_journal").exists()
    assert "Partial: 2 of" in (kept / paper_cpu.SUMMARY).read_text()
    assert (kept / "eval_cost_ratio.png").read_bytes()[:4] == b"\x89PNG"


def test_a_restored_run_continues_without_losing_or_repeating(stopped_run, tmp_path, monkeypatch, tiny_data):
    clone = tmp_path / "clone"
    clone.mkdir()
    monkeypatch.chdir(clone)
    # a fresh clone holds the checked-in metrics of `make run`, not the run's
    trained = (stopped_run["kept"] / "metrics" / "neuroshard.json").read_text()
    Path("metrics").mkdir()
    Path("metrics/neuroshard.json").write_text('{"from": "the checkout, make run"}\n')
    restored = paper_cpu.restore(stopped_run["kept"], Path("params.yaml"), stopped_run["root"], rebuild=tiny_data)
    assert restored["replayed_tasks"] == 2  # one journaled task of each family planned again, the same plans
    # their plans measured again: the analytic backend gives the journal's costs exactly
    assert restored["timing_check"]["median_ratio"] == 1.0 and len(restored["timing_check"]["tasks"]) == 2
    params = paper_cpu.load_params("params.yaml")
    assert params == stopped_run["params"]
    seen = counting_evaluate(monkeypatch, set())
    importlib.import_module("stages.evaluate").run(params)
    order = stopped_run["order"]
    assert seen == order[2:]  # the journaled tasks are read, not measured again
    results = pd.read_parquet(Path(params["paths"]["eval"]) / "results.parquet")
    assert sorted(set(results["task"])) == sorted(order)
    # saved again: finished, the stage's own metrics
    prov = paper_cpu.save(Path("params.yaml"), stopped_run["kept"], stopped_run["root"], prefect_db=tmp_path / "none.db")
    assert prov["finished"] and prov["progress"]["journaled"] == prov["progress"]["total"]
    assert json.loads((stopped_run["kept"] / "eval.json").read_text())["partial"] is False
    assert (stopped_run["kept"] / "metrics" / "neuroshard.json").read_text() == trained  # the run's training, kept


def test_restore_refuses_other_plans_timings_processor_and_data(stopped_run, tmp_path, monkeypatch, tiny_data):
    kept, root = stopped_run["kept"], stopped_run["root"]
    clone = tmp_path / "clone"
    clone.mkdir()
    monkeypatch.chdir(clone)
    # a journaled plan that this code would not make (as code changed since the run would)
    with journal_files(kept, tmp_path) as files:
        original = pd.read_parquet(files[0])
        changed = original.copy()
        shards = json.loads(changed.loc[0, "shards"])
        shards[0]["device"] = (shards[0]["device"] + 1) % 2
        changed.loc[0, "shards"] = json.dumps(shards)
        changed.to_parquet(files[0])
    with pytest.raises(paper_cpu.RunError, match=f"this clone's {changed.loc[0, 'algorithm']} plans it otherwise"):
        paper_cpu.restore(kept, Path("params.yaml"), root, rebuild=tiny_data)
    assert not Path("data/eval_journal").exists()  # refused before anything was put in place
    with journal_files(kept, tmp_path) as files:
        original.to_parquet(files[0])

    # a machine that runs the run's plans at another speed, though it reports the same processor: here the
    # journal says they cost a third of what this machine measures them at
    with journal_files(kept, tmp_path) as files:
        originals = [pd.read_parquet(f) for f in files]
        for f, rows in zip(files, originals, strict=True):
            rows.assign(cost_ms=rows["cost_ms"] / 3).to_parquet(f)
    with pytest.raises(paper_cpu.RunError, match=r"measures the run's journaled plans of .* at 3\.00x"):
        paper_cpu.restore(kept, Path("params.yaml"), root, rebuild=tiny_data)
    assert not Path("data/eval_journal").exists()
    (tmp_path / "tolerant").mkdir()
    monkeypatch.chdir(tmp_path / "tolerant")
    paper_cpu.restore(kept, Path("params.yaml"), root, rebuild=tiny_data, timing_tolerance=3.5)  # allowed
    assert Path("data/eval_journal").exists()
    monkeypatch.chdir(clone)
    with journal_files(kept, tmp_path) as files:
        for f, rows in zip(files, originals, strict=True):
            rows.to_parquet(f)

    prov = json.loads((kept / "provenance.json").read_text())
    (kept / "provenance.json").write_text(json.dumps({**prov, "measured": True, "processor": "cpu: Other CPU (1 thread)"}))
    with pytest.raises(paper_cpu.RunError, match="processor: the run measured on 'cpu: Other CPU"):
        paper_cpu.restore(kept, Path("params.yaml"), root, rebuild=tiny_data)
    (kept / "provenance.json").write_text(json.dumps(prov))

    def other_data(params):
        params["data"]["synthetic"]["seed"] = 1
        data_stages(params)

    with pytest.raises(paper_cpu.RunError, match=r"paths.tables\): rebuilt data differs"):
        paper_cpu.restore(kept, Path("params.yaml"), root, rebuild=other_data)


def test_the_journal_archive_is_deterministic_keeps_what_it_holds_and_reads_back(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    journal = tmp_path / "journal"
    journal.mkdir()
    pq.write_table(pa.table({"cost_ms": [1.5, 2.5], "shards": ["[]", "[]"]}), journal / "task-a.parquet")
    (journal / "fusion_probes-x.json").write_text("[1]")
    first, second = tmp_path / "one" / "j.tar.xz", tmp_path / "two" / "j.tar.xz"
    assert paper_cpu.pack_journal(sorted(journal.glob("*")), first) == 2
    (journal / "task-a.parquet").touch()  # another mtime: the same bytes
    paper_cpu.pack_journal(sorted(journal.glob("*")), second)
    assert first.read_bytes() == second.read_bytes()
    pq.write_table(pa.table({"cost_ms": [9.0], "shards": ["[]"]}), journal / "task-a.parquet")
    pq.write_table(pa.table({"cost_ms": [3.0], "shards": ["[]"]}), journal / "task-b.parquet")
    assert paper_cpu.pack_journal(sorted(journal.glob("*")), first) == 3  # task-a journaled once: kept as it was
    out = tmp_path / "out"
    assert paper_cpu.unpack_journal(first, out) == 3 and paper_cpu.unpack_journal(first, out) == 0
    assert pd.read_parquet(out / "task-a.parquet")["cost_ms"].tolist() == [1.5, 2.5]
    assert (out / "fusion_probes-x.json").read_text() == "[1]"
