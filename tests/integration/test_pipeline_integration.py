"""`dvc repro` of the foundation pipeline (download -> process -> tasks), through Prefect,
on a tiny configuration in a temporary git repo."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from dreamshard.data.requests import read_requests
from dreamshard.placement import find_feasible_assignment
from dreamshard.plan import Plan, validate_plan
from dreamshard.tables import TABLE_STATS_SCHEMA
from dreamshard.tasks import read_tasks
from helpers import FAMILIES, TINY_TABLES, out, ran, sh, skipped, tiny_params

STAGES = ("download", "process", "tasks")
# `dvc repro tasks` reproduces the foundation stages (tasks and everything upstream of it);
# later stages in dvc.yaml (cost collection, evaluation, ...) are left to their own tests.
REPRO = ["dvc", "repro", "tasks"]


def run(cmd: list[str], cwd: Path, env: dict) -> str:
    return out(sh(cmd, cwd, env, timeout=300))


@pytest.fixture
def repo(tmp_path: Path, project_root: Path, prefect_env: dict) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(project_root / "dvc.yaml", repo / "dvc.yaml")
    for pkg in ("dreamshard", "stages", "pipeline"):
        shutil.copytree(project_root / pkg, repo / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (repo / "params.yaml").write_text(yaml.safe_dump(tiny_params(), sort_keys=False))
    (repo / ".gitignore").write_text("__pycache__/\n.prefect/\n")
    git = ["git", "-c", "user.name=Test", "-c", "user.email=test@example.com"]
    sh(["git", "init", "-q"], repo, prefect_env)
    sh([*git, "add", "-A"], repo, prefect_env)
    sh([*git, "commit", "-q", "-m", "tiny pipeline"], repo, prefect_env)
    sh(["dvc", "init", "-q"], repo, prefect_env)
    return repo


@pytest.mark.integration
def test_dvc_repro_through_prefect(repo: Path, prefect_env: dict):
    env = prefect_env

    # ---- first run: every stage runs, through its Prefect flow
    out = run(REPRO, repo, env)
    assert ran(out) == set(STAGES), out
    assert "Traceback" not in out

    tables_path = repo / "data/tables.parquet"
    stats = pd.read_parquet(tables_path)
    assert pq.read_schema(tables_path).remove_metadata().equals(TABLE_STATS_SCHEMA)
    assert len(stats) == TINY_TABLES
    assert set(stats["source"]) == {"synthetic"}
    assert set(stats["source_file"]) == {f"synthetic_t{TINY_TABLES}_bs256.pt.gz"}
    assert stats["rows"].between(100, 5000).all()

    requests = read_requests(repo / "data/requests.parquet")
    assert sorted(requests) == stats["table_id"].tolist()
    assert {r.batch_size for r in requests.values()} == {64}

    tasks = {split: read_tasks(repo / f"data/tasks/{split}.parquet", tables_path) for split in ("train", "test")}
    assert len(tasks["train"]) == sum(f["num_train"] for f in FAMILIES)
    assert len(tasks["test"]) == sum(f["num_test"] for f in FAMILIES)
    used = {split: {t.name for task in ts for t in task.tables} for split, ts in tasks.items()}
    assert not used["train"] & used["test"]
    for task in tasks["train"] + tasks["test"]:
        assert {t.dim for t in task.tables} <= {4, 8, 16}
        validate_plan(task, Plan.from_assignment(task, find_feasible_assignment(task)))
    assert (repo / "dvc.lock").exists()
    first_train = (repo / "data/tasks/train.parquet").read_bytes()

    # the stages ran as Prefect flows against the shared test server
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs()
        names = {client.read_flow(r.flow_id).name for r in runs if r.state and r.state.is_completed()}
    assert set(STAGES) <= names, names

    # ---- second run: nothing changed, nothing runs
    out = run(REPRO, repo, env)
    assert ran(out) == set(), out
    assert skipped(out) == set(STAGES), out
    assert "Data and pipelines are up to date" in out

    # ---- a test-only family added: the tasks stage reruns, the training tasks file keeps its bytes, and every
    # stage but evaluate depends on that file alone, so no model is collected for or trained again
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["tasks"]["profiles"]["tiny"].append({"name": "tiny-8-8", "num_tables": 8, "num_devices": 8,
                                                "memory_gb": 0.01, "num_train": 0, "num_test": 1})
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = run(REPRO, repo, env)
    assert ran(out) == {"tasks"}, out
    assert (repo / "data/tasks/train.parquet").read_bytes() == first_train
    assert len(read_tasks(repo / "data/tasks/test.parquet", tables_path)) == len(tasks["test"]) + 1
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    on_tasks = {name: [d for d in s.get("deps", []) if str(d).startswith("${paths.tasks}")] for name, s in stages.items()}
    assert on_tasks.pop("evaluate") == ["${paths.tasks}"] and on_tasks.pop("tasks") == []
    assert {name: deps for name, deps in on_tasks.items() if deps != ["${paths.tasks}/train.parquet"] and deps} == {}
    assert {"collect", "collect_devices", "train_cost", "train_policy", "train_neuroshard"} <= {
        name for name, deps in on_tasks.items() if deps}

    # ---- a tasks parameter changes: only the tasks stage reruns
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["tasks"]["seed"] = 1
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = run(REPRO, repo, env)
    assert ran(out) == {"tasks"}, out
    assert skipped(out) == {"download", "process"}, out
    assert (repo / "data/tasks/train.parquet").read_bytes() != first_train
    reread = read_tasks(repo / "data/tasks/train.parquet", tables_path)
    assert len(reread) == len(tasks["train"])
