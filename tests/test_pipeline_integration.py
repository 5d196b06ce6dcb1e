"""`dvc repro` of the foundation pipeline (download -> process -> tasks), through Prefect, on a tiny configuration in a temporary git repo."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from dreamshard.plan import Plan, validate_plan
from dreamshard.requests import read_requests
from dreamshard.sharders.placement import find_feasible_assignment
from dreamshard.tables import TABLE_STATS_SCHEMA
from dreamshard.tasks import read_tasks

NUM_TABLES = 24
FAMILIES = [
    {"name": "tiny-6-2", "num_tables": 6, "num_devices": 2, "memory_gb": 0.01, "num_train": 3, "num_test": 2},
    {"name": "tiny-8-4", "num_tables": 8, "num_devices": 4, "memory_gb": 0.01, "num_train": 2, "num_test": 2},
]
STAGES = ("download", "process", "tasks")
# `dvc repro tasks` reproduces the foundation stages (tasks and everything upstream of it);
# later stages in dvc.yaml (cost collection, evaluation, ...) are left to their own tests.
REPRO = ["dvc", "repro", "tasks"]


def tiny_params(project_root: Path) -> dict:
    """The project's params.yaml with a tiny dataset and one small task profile."""
    params = yaml.safe_load((project_root / "params.yaml").read_text())
    params["data"]["source"] = "synthetic"
    params["data"]["synthetic"].update(num_tables=NUM_TABLES, batch_size=256, max_rows=5000, seed=0)
    params["process"]["sample_batch"] = 64
    params["tasks"].update(seed=0, test_fraction=0.5, dims=[4, 8, 16], profile="tiny", profiles={"tiny": FAMILIES})
    return params


def sh(cmd: list[str], cwd: Path, env: dict, timeout: int = 300) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{out}"
    return out


def ran(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


def skipped(output: str) -> set[str]:
    return set(re.findall(r"Stage '([^']+)' didn't change, skipping", output))


@pytest.fixture
def repo(tmp_path: Path, project_root: Path, prefect_env: dict) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(project_root / "dvc.yaml", repo / "dvc.yaml")
    for pkg in ("dreamshard", "stages", "pipeline"):
        shutil.copytree(project_root / pkg, repo / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (repo / "params.yaml").write_text(yaml.safe_dump(tiny_params(project_root), sort_keys=False))
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
    out = sh(REPRO, repo, env)
    assert ran(out) == set(STAGES), out
    assert "Traceback" not in out

    tables_path = repo / "data/tables.parquet"
    stats = pd.read_parquet(tables_path)
    assert pq.read_schema(tables_path).remove_metadata().equals(TABLE_STATS_SCHEMA)
    assert len(stats) == NUM_TABLES
    assert set(stats["source"]) == {"synthetic"}
    assert set(stats["source_file"]) == {f"synthetic_t{NUM_TABLES}_bs256.pt.gz"}
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
    out = sh(REPRO, repo, env)
    assert ran(out) == set(), out
    assert skipped(out) == set(STAGES), out
    assert "Data and pipelines are up to date" in out

    # ---- a tasks parameter changes: only the tasks stage reruns
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["tasks"]["seed"] = 1
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = sh(REPRO, repo, env)
    assert ran(out) == {"tasks"}, out
    assert skipped(out) == {"download", "process"}, out
    assert (repo / "data/tasks/train.parquet").read_bytes() != first_train
    reread = read_tasks(repo / "data/tasks/train.parquet", tables_path)
    assert len(reread) == len(tasks["train"])
