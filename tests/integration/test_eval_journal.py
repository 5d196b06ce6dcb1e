"""The resumable evaluation: journaled per task; killed midway, a rerun loses and repeats nothing."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import pandas as pd
import pytest

from dreamshard.evaluation.journal import EvalJournal
from dreamshard.hardware.analytic import AnalyticBackend
from dreamshard.tasks import Device, Task
from helpers import SMALL, tiny_params


def tasks(n: int) -> list[Task]:
    return [Task(f"t{i}", tuple(SMALL), (Device(2**30), Device(2**30)), family="f") for i in range(n)]


def test_a_run_killed_midway_continues_without_losing_or_repeating(tmp_path):
    items = [("test", t) for t in tasks(5)]
    calls: list[str] = []

    def evaluate(split, task, crash_at=None):
        if task.name == crash_at:
            raise KeyboardInterrupt  # killed while measuring this task
        calls.append(task.name)
        return [{"task": task.name, "split": split, "cost_ms": float(len(calls))}]

    journal = EvalJournal(tmp_path, "fingerprint-1")
    with pytest.raises(KeyboardInterrupt):
        journal.run(items, lambda s, t: evaluate(s, t, crash_at="t3"))
    assert calls == ["t0", "t1", "t2"] and journal.journaled_count(items) == 3
    rows = journal.run(items, evaluate)
    assert calls == ["t0", "t1", "t2", "t3", "t4"]  # t3 and t4 only: nothing repeated
    assert [r["task"] for r in rows] == ["t0", "t1", "t2", "t3", "t4"]  # nothing lost, in order
    assert [r["cost_ms"] for r in rows] == [1.0, 2.0, 3.0, 4.0, 5.0]  # the journaled values, not new ones
    # another fingerprint (a setting or model changed) reuses nothing
    other = EvalJournal(tmp_path, "fingerprint-2")
    assert other.journaled_count(items) == 0
    assert not list(tmp_path.glob(".*.tmp"))  # no half-written file left by the kill


def test_once_is_measured_once_per_fingerprint(tmp_path):
    journal = EvalJournal(tmp_path, "f")
    values = iter([[1.5, 1.6], [9.9]])
    assert journal.once("additivity", lambda: next(values)) == [1.5, 1.6]
    assert EvalJournal(tmp_path, "f").once("additivity", lambda: next(values)) == [1.5, 1.6]
    assert EvalJournal(tmp_path, "g").once("additivity", lambda: next(values)) == [9.9]


def test_a_damaged_journal_file_is_named(tmp_path):
    journal = EvalJournal(tmp_path, "f")
    task = tasks(1)[0]
    journal.path("test", task).parent.mkdir(parents=True, exist_ok=True)
    journal.path("test", task).write_bytes(b"not parquet")
    with pytest.raises(ValueError, match=r"task-.*\.parquet: journaled rows of task 't0' cannot be read"):
        journal.read("test", task)


class Killed(Exception):
    pass


def test_evaluate_stage_killed_midway_then_rerun(tiny_project, tmp_path, monkeypatch):
    params = tiny_project("tasks").copy_to(tmp_path)  # the tiny project's data and tasks
    params["evaluate"]["sharders"] = ["random", "size_greedy", "lookup_greedy"]  # no trained models needed
    params["evaluate"]["estimated_bins"] = {"tasks_per_family": 0, "rounds": 1}
    params["orchestration"] = {"evaluate": {"planning_workers": 1, "planning_chunk": 1}}
    evaluate = importlib.import_module("stages.evaluate")
    evaluated: list[str] = []
    real = evaluate.evaluate_task

    def counting(backend, task, *args, **kwargs):
        if task.name == crash_on[0]:
            raise Killed(task.name)
        evaluated.append(task.name)
        return real(backend, task, *args, **kwargs)

    monkeypatch.setattr(evaluate, "evaluate_task", counting)
    test_tasks = sorted(pd.read_parquet(Path(params["paths"]["tasks"]) / "test.parquet")["task_id"])
    assert len(test_tasks) == 4
    # evaluated with the families in turns: each family's first task, then each one's second
    order = sorted(test_tasks, key=lambda name: (name.rsplit("/", 1)[1], name))
    crash_on = [order[2]]
    with pytest.raises(Killed):
        evaluate.run(params)
    assert evaluated == order[:2] and not Path(params["paths"]["eval_metrics"]).exists()
    crash_on = [None]
    evaluate.run(params)
    assert sorted(evaluated) == test_tasks  # each test task evaluated once in all
    resumed = pd.read_parquet(Path(params["paths"]["eval"]) / "results.parquet")
    assert sorted(set(resumed["task"])) == test_tasks
    assert len(resumed) == 4 * 3
    # the same results as one uninterrupted run whose plans were made in other processes (the analytic
    # backend is deterministic; planning time is not)
    fresh = tiny_params(tmp_path / "fresh")
    fresh["paths"] = {**params["paths"], "eval": str(tmp_path / "fresh_eval"),
                      "eval_journal": str(tmp_path / "fresh_journal"),
                      "eval_metrics": str(tmp_path / "fresh_eval.json"), "eval_plot": str(tmp_path / "fresh.csv")}
    fresh["evaluate"] = params["evaluate"]
    fresh["orchestration"] = {"evaluate": {"planning_workers": 2, "planning_chunk": 3}}  # in 2 processes, 3 at a time
    evaluate.run(fresh)
    once = pd.read_parquet(tmp_path / "fresh_eval" / "results.parquet")
    cols = ["task", "algorithm", "cost_ms", "lower_bound_ms", "shards"]
    pd.testing.assert_frame_equal(resumed[cols], once[cols])
    assert json.loads(Path(params["paths"]["eval_metrics"]).read_text())["backend"] == AnalyticBackend.name


def test_planning_settings_must_be_positive_integers():
    evaluate = importlib.import_module("stages.evaluate")
    from dreamshard.project.params import ParamsError

    assert evaluate.planning_settings({}) == (1, 1)
    assert evaluate.planning_settings({"orchestration": {"evaluate": {"planning_workers": 2,
                                                                      "planning_chunk": 16}}}) == (2, 16)
    with pytest.raises(ParamsError, match=r"orchestration.evaluate.planning_workers: expected an integer >= 1, got 0"):
        evaluate.planning_settings({"orchestration": {"evaluate": {"planning_workers": 0}}})
    with pytest.raises(ParamsError, match=r"orchestration.evaluate.planning_chunk: expected an integer >= 1, got 'x'"):
        evaluate.planning_settings({"orchestration": {"evaluate": {"planning_chunk": "x"}}})


def test_decoding_options_reach_their_sharder_and_the_fingerprint():
    """evaluate.decoding: per sharder options (a policy's samples and rivals); they decide the plans, so they are
    in the journal's fingerprint (absent and empty alike: no options)."""
    from dreamshard.data.lookups import RecordedLookups
    from dreamshard.project.backend import backend_of
    from dreamshard.project.evaluation import journal_fingerprint, make_sharders
    from dreamshard.project.params import ParamsError

    params = tiny_params()
    params["evaluate"]["sharders"] = ["random", "size_greedy"]
    params["evaluate"].pop("decoding", None)
    backend = backend_of(params, lookups=RecordedLookups({}))
    before = journal_fingerprint(params, backend, make_sharders(params, 512))
    params["evaluate"]["decoding"] = {}
    assert journal_fingerprint(params, backend, make_sharders(params, 512)) == before
    # dreamshard_cut's search settings decide its plans too
    params["cut_search"] = {**params["cut_search"], "depth": params["cut_search"]["depth"] + 1}
    assert journal_fingerprint(params, backend, make_sharders(params, 512)) != before
    params["cut_search"] = {**params["cut_search"], "depth": params["cut_search"]["depth"] - 1}
    params["evaluate"]["decoding"] = {"random": {"seed": 5}}
    sharders = make_sharders(params, 512)
    assert sharders[0].seed == 5
    assert journal_fingerprint(params, backend, sharders) != before
    params["evaluate"]["decoding"] = {"dreamshard": {"samples": 4}}
    with pytest.raises(ParamsError, match=r"evaluate.decoding: dreamshard not in evaluate.sharders"):
        make_sharders(params, 512)
    params["evaluate"]["decoding"] = {"size_greedy": {"samples": 4}}
    with pytest.raises(ParamsError, match=r"evaluate.sharders: sharder 'size_greedy': unknown option\(s\) samples"):
        make_sharders(params, 512)


def _worker_threads() -> tuple[int, list[tuple[str, int]]]:
    import torch
    from threadpoolctl import threadpool_info

    return torch.get_num_threads(), [(p["internal_api"], p["num_threads"]) for p in threadpool_info()]


def test_a_planning_worker_runs_one_thread_in_every_pool(tmp_path):
    """Two planning workers on 2 cores must not start a BLAS thread per core each: NumPy's OpenBLAS ignores
    torch's thread count, and the oversubscribed workers planned 2-3x slower from about 100 tables."""
    evaluate = importlib.import_module("stages.evaluate")
    params = tiny_params(tmp_path)
    params["evaluate"]["sharders"] = ["random"]
    from dreamshard.project.evaluation import make_sharders

    with evaluate.Planner(params, make_sharders(params, 64), workers=2) as planner:
        torch_threads, pools = planner.pool.submit(_worker_threads).result()
    assert torch_threads == 1
    assert pools and all(n == 1 for _, n in pools), pools  # numpy's BLAS at least (and torch's OpenMP)
