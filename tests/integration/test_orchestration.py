"""Orchestration at scale, with the real engines on 127.0.0.1 (no mocks):

- a real Prefect server (`prefect server start`), a process work pool, the `retrain`
  deployment of prefect.yaml, one triggered run executed by `prefect worker start --run-once`;
- the collect flow on a Dask LocalCluster of two workers (prefect-dask) against the
  single-process run: byte-identical costs (analytic backend);
- a chunk that keeps failing is retried, then reported, and the finished chunks stay journaled;
- a DVC local-directory remote: push, then pull into a fresh clone, where nothing reruns, a test-only family
  reruns only the tasks and evaluate stages, and a tasks parameter only the tasks stage;
- `dvc exp run -S` of a policy parameter (the deployment's run) reruns only the stages that depend on it.

One tiny pipeline (analytic backend, a few tables, tasks and steps) is reproduced once
per module in a temporary git repo with a DVC remote, and shared by the DVC and
deployment tests: each stage is a process of its own (imports alone take seconds), so
the tests run as few of them as what they check allows.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

import helpers
from dreamshard.data.requests import read_requests
from dreamshard.placement import find_feasible_assignment
from dreamshard.plan import Plan, validate_plan
from dreamshard.tables import TABLE_STATS_SCHEMA
from dreamshard.tasks import read_tasks
from helpers import FAMILIES, PROJECT_ROOT, TINY_TABLES, out, ran, sh, skipped

VENV_BIN = Path(sys.executable).parent
GIT = ["git", "-c", "user.name=Test", "-c", "user.email=test@example.com"]

ALL_STAGES = {"download", "process", "tasks", "collect", "collect_devices", "train_cost", "train_policy", "train_autoshard",
              "train_rnn", "train_neuroshard", "evaluate"}
POLICY_STAGES = {"train_policy", "train_autoshard", "evaluate"}  # what train_policy.* reaches
POOL = "dreamshard-gpu"  # the work pool prefect.yaml names for `retrain`


def tiny_params() -> dict:
    """helpers.tiny_params with smaller kernels' batches and chunks of 3 plans."""
    p = helpers.tiny_params()
    p["backend"].update(batch_size=256)
    p["collect"].update(chunk_size=3)
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def file_digests(root: Path, paths: list[str]) -> dict[str, str]:
    """md5 of every file under `paths` (files or folders) relative to `root`."""
    digests = {}
    for rel in paths:
        p = root / rel
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        for f in files:
            digests[str(f.relative_to(root))] = hashlib.md5(f.read_bytes()).hexdigest()
    return digests


def lock_outs(repo: Path, env: dict) -> list[str]:
    """The outputs in dvc.lock that DVC caches (metrics and plots with `cache: false` are in git)."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    in_git = set(sh(["git", "ls-files"], repo, env).stdout.split())
    return sorted({o["path"] for st in lock["stages"].values() for o in st.get("outs", [])} - in_git)


# ------------------------------------------------------------------ the Prefect server


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """`prefect server start` on 127.0.0.1 with its own PREFECT_HOME; yields the environment for its clients."""
    home = tmp_path_factory.mktemp("prefect_server")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}  # not another test's server
    env.update({
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",  # scheduled runs appear within seconds
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "DVC_NO_ANALYTICS": "1",
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    })
    env.pop("PYTHONPATH", None)  # the temporary repos import their own dreamshard/stages/pipeline
    port = free_port()
    log = open(home / "server.log", "w")
    server = subprocess.Popen([str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{api}/health", timeout=2) as r:
                    if r.read().strip() == b"true":
                        break
            except OSError:
                pass
            assert server.poll() is None, f"prefect server exited:\n{(home / 'server.log').read_text()}"
            assert time.monotonic() < deadline, f"prefect server not up:\n{(home / 'server.log').read_text()}"
            time.sleep(0.5)
        env["PREFECT_API_URL"] = api
        yield env
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(10)
        log.close()


@contextmanager
def prefect_client(env: dict):
    """A synchronous Prefect client in this process, talking to the test server."""
    for key in ("PREFECT_HOME", "PREFECT_SERVER_ANALYTICS_ENABLED"):
        os.environ.setdefault(key, env[key])  # before Prefect is first imported
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
        with get_client(sync_client=True) as client:
            yield client


# ------------------------------------------------------------------ the tiny pipeline, reproduced once


def make_repo(repo: Path, env: dict) -> None:
    repo.mkdir()
    for name in ("dvc.yaml", "prefect.yaml"):
        shutil.copy(PROJECT_ROOT / name, repo / name)
    for pkg in ("dreamshard", "stages", "pipeline"):
        shutil.copytree(PROJECT_ROOT / pkg, repo / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (repo / "params.yaml").write_text(yaml.safe_dump(tiny_params(), sort_keys=False))
    (repo / ".gitignore").write_text("__pycache__/\n.prefect/\n")
    sh(["git", "init", "-q", "-b", "main"], repo, env)
    sh(["git", "config", "user.name", "Test"], repo, env)  # for `dvc exp run` here (not in clones)
    sh(["git", "config", "user.email", "test@example.com"], repo, env)
    sh(["dvc", "init", "-q"], repo, env)


@pytest.fixture(scope="module")
def pipeline_repo(tmp_path_factory, prefect_server):
    """A git repo of the tiny pipeline with a DVC local remote: reproduced, committed, pushed."""
    env = prefect_server
    base = tmp_path_factory.mktemp("orchestration")
    repo, remote = base / "repo", base / "dvc-remote"
    make_repo(repo, env)
    sh(["dvc", "remote", "add", "-d", "shared", str(remote)], repo, env)
    sh([*GIT, "add", "-A"], repo, env)
    sh([*GIT, "commit", "-q", "-m", "tiny pipeline"], repo, env)
    t0 = time.monotonic()
    output = out(sh(["dvc", "repro"], repo, env))
    print(f"\nfull tiny `dvc repro`: {time.monotonic() - t0:.0f} s")
    assert ran(output) == ALL_STAGES, output
    sh([*GIT, "add", "-A"], repo, env)
    sh([*GIT, "commit", "-q", "-m", "reproduced"], repo, env)
    sh(["dvc", "push", "--run-cache"], repo, env)
    outs = lock_outs(repo, env)
    return {"repo": repo, "remote": remote, "outs": outs, "digests": file_digests(repo, outs),
            "lock": (repo / "dvc.lock").read_text()}


# ------------------------------------------------------------------ DVC remote and experiments


@pytest.mark.integration
def test_the_foundation_stages_write_what_the_others_read_as_flow_runs_of_the_server(pipeline_repo, prefect_server):
    """download -> process -> tasks: the tables' statistics, the requests and the task files, every table in one
    pool only; and every stage of the reproduction ran as a Prefect flow against the server."""
    repo = pipeline_repo["repo"]
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
    with prefect_client(prefect_server) as client:
        names = {client.read_flow(r.flow_id).name for r in client.read_flow_runs()
                 if r.state and r.state.is_completed()}
    assert ALL_STAGES <= names, names


@pytest.mark.integration
def test_dvc_remote_push_pull_round_trip(pipeline_repo, prefect_server, tmp_path):
    env, repo = prefect_server, pipeline_repo["repo"]
    assert any(pipeline_repo["remote"].rglob("*")), "dvc push wrote nothing to the remote"
    clone = tmp_path / "clone"
    sh(["git", "clone", "-q", str(repo), str(clone)], tmp_path, env)
    assert not any((clone / f).exists() for f in pipeline_repo["digests"])  # git has none of the outputs
    sh(["dvc", "pull"], clone, env)  # from the local-directory remote in the committed .dvc/config
    assert file_digests(clone, pipeline_repo["outs"]) == pipeline_repo["digests"]
    status = out(sh(["dvc", "status"], clone, env))
    assert "Data and pipelines are up to date" in status, status
    # what was pulled makes a rerun unnecessary: nothing runs
    assert ran(out(sh(["dvc", "repro"], clone, env))) == set()

    # a test-only family: the tasks stage reruns and the training tasks file keeps its bytes, so of the stages
    # after it only evaluate, which reads the test tasks, runs again: nothing is collected or trained anew
    tables_path = clone / "data/tables.parquet"
    first_train = (clone / "data/tasks/train.parquet").read_bytes()
    num_test = len(read_tasks(clone / "data/tasks/test.parquet", tables_path))
    params_file = clone / "params.yaml"
    params = yaml.safe_load(params_file.read_text())
    params["tasks"]["profiles"]["tiny"].append({"name": "tiny-8-8", "num_tables": 8, "num_devices": 8,
                                                "memory_gb": 0.01, "num_train": 0, "num_test": 1})
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    output = out(sh(["dvc", "repro"], clone, env))
    assert ran(output) == {"tasks", "evaluate"}, output
    assert "Traceback" not in output
    assert (clone / "data/tasks/train.parquet").read_bytes() == first_train
    assert len(read_tasks(clone / "data/tasks/test.parquet", tables_path)) == num_test + 1
    assert "tiny-8-8" in json.loads((clone / "metrics/eval.json").read_text())["families"]

    # a tasks parameter: the tasks stage reruns, the stages before it are kept
    params["tasks"]["seed"] = 1
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    output = out(sh(["dvc", "repro", "tasks"], clone, env))
    assert ran(output) == {"tasks"} and skipped(output) == {"download", "process"}, output
    assert (clone / "data/tasks/train.parquet").read_bytes() != first_train
    assert len(read_tasks(clone / "data/tasks/train.parquet", tables_path)) == sum(f["num_train"] for f in FAMILIES)


@pytest.mark.integration
def test_a_key_of_one_algorithms_group_changes_only_the_stages_that_read_it(pipeline_repo, prefect_server):
    """dvc.yaml lists params per key: the RNN baseline trains under AutoShard's measurement budget, so a change of
    that key makes those two stages out of date and no other. `dvc status` names them without running them."""
    env, repo = prefect_server, pipeline_repo["repo"]
    params_file = repo / "params.yaml"
    before = params_file.read_text()
    changed = yaml.safe_load(before)
    changed["train_policy"]["autoshard"]["measurement_budget"] = 2
    params_file.write_text(yaml.safe_dump(changed, sort_keys=False))
    try:
        status = json.loads(sh(["dvc", "status", "--json"], repo, env).stdout)
    finally:
        params_file.write_text(before)
    assert set(status) == {"train_autoshard", "train_rnn"}, status
    for stage in status.values():  # the key itself, or its group where a stage lists the group
        keys = {k for entry in stage for k in entry.get("changed deps", {}).get("params.yaml", {})}
        assert keys and keys <= {"train_policy.autoshard", "train_policy.autoshard.measurement_budget"}, status
    assert "Data and pipelines are up to date" in out(sh(["dvc", "status"], repo, env))


# ------------------------------------------------------------------ the `retrain` deployment


def sqlalchemy_version() -> tuple[int, int]:
    from importlib.metadata import version

    return tuple(int(x) for x in version("sqlalchemy").split(".")[:2])


@pytest.fixture(scope="module")
def retrain_deployment(pipeline_repo, prefect_server):
    """The `retrain` deployment of prefect.yaml on a process work pool of the test server."""
    env, repo = dict(prefect_server), pipeline_repo["repo"]
    env["DREAMSHARD_GIT_URL"] = str(repo)  # what the deployment's git_clone pull step clones
    sh(["prefect", "work-pool", "create", POOL, "--type", "process"], repo, env)
    sh(["prefect", "--no-prompt", "deploy", "--name", "retrain"], repo, env)
    with prefect_client(env) as client:
        deployment = client.read_deployment_by_name("retrain/retrain")
    assert deployment.work_pool_name == POOL
    assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * 1"]
    assert all(s.active for s in deployment.schedules)
    assert deployment.global_concurrency_limit.limit == 1
    assert deployment.pull_steps == [{"prefect.deployments.steps.git_clone": {"id": "clone",
                                                                              "repository": str(repo)}}]
    return deployment


@pytest.mark.integration
@pytest.mark.xfail(sqlalchemy_version() >= (2, 1), strict=True,
                   reason="Prefect 3.8.8's scheduler service fails on SQLAlchemy 2.1 ('Can't evaluate bulk DML "
                          "statement' in _insert_scheduled_flow_runs): pin sqlalchemy<2.1")
def test_retrain_schedule_creates_runs(retrain_deployment, prefect_server):
    """The server's scheduler turns the weekly cron into scheduled runs (Mondays 03:00 UTC)."""
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    only_this = DeploymentFilter(id=DeploymentFilterId(any_=[retrain_deployment.id]))
    scheduled = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])))
    with prefect_client(prefect_server) as client:
        deadline = time.monotonic() + 20  # the scheduler's loop runs every 2 s here
        while not (runs := [r for r in client.read_flow_runs(deployment_filter=only_this, flow_run_filter=scheduled)
                            if r.auto_scheduled]):
            assert time.monotonic() < deadline, "no run was scheduled from the cron schedule"
            time.sleep(1)
    assert all(r.expected_start_time.weekday() == 0 and r.expected_start_time.hour == 3 for r in runs)


@pytest.mark.integration
def test_retrain_deployment_runs_on_a_process_worker(retrain_deployment, pipeline_repo, prefect_server, tmp_path):
    env, repo = prefect_server, pipeline_repo["repo"]
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.deployments import run_deployment

    with prefect_client(env) as client:  # triggered now; the worker's --run-once picks it up
        flow_run = run_deployment("retrain/retrain", timeout=0, parameters={
            "set_params": {"train_policy.common.policy_lr": 0.002}, "name": "deployed-lr"})
        assert client.read_flow_run(flow_run.id).deployment_id == retrain_deployment.id

    worker_dir = tmp_path / "worker"
    worker_dir.mkdir()
    worker_env = {**env, "PREFECT_LOGGING_LEVEL": "INFO"}
    t0 = time.monotonic()
    worker = sh(["prefect", "worker", "start", "--pool", POOL, "--run-once"], worker_dir, worker_env)
    print(f"\nworker --run-once: {time.monotonic() - t0:.0f} s")

    with prefect_client(env) as client:
        finished = client.read_flow_run(flow_run.id)
        assert finished.state.is_completed(), f"{finished.state}\n{out(worker)}"
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])))
    assert [a.key for a in artifacts] == ["dreamshard-eval"]
    markdown = artifacts[0].data
    assert artifacts[0].type == "markdown"
    assert "| family | sharder | mean cost (ms) |" in markdown
    assert "experiment: `deployed-lr`" in markdown
    assert "`train_policy.common.policy_lr=0.002`" in markdown
    assert "stages run: train_policy, train_autoshard, evaluate" in markdown, markdown  # the rest was pulled

    # the run's clone is gone; its experiment went to origin (git) and its outputs to the DVC remote
    check = tmp_path / "check"
    sh(["git", "clone", "-q", str(repo), str(check)], tmp_path, env)
    sh(["dvc", "exp", "pull", "origin", "deployed-lr"], check, env)
    sh(["dvc", "exp", "apply", "deployed-lr"], check, env)
    assert yaml.safe_load((check / "params.yaml").read_text())["train_policy"]["common"]["policy_lr"] == 0.002
    status = out(sh(["dvc", "status"], check, env))
    assert "Data and pipelines are up to date" in status, status  # every output present, as locked
    # the experiment as `dvc exp show` lists it: its parameter and its metrics; its lock differs from the
    # baseline's only in the stages the policy parameter reaches
    shown = json.loads(sh(["dvc", "exp", "show", "--json"], check, env).stdout)
    exps = {r["name"]: r for base in shown for e in (base.get("experiments") or []) for r in e["revs"]}
    assert "deployed-lr" in exps, shown
    data = exps["deployed-lr"]["data"]
    assert data["params"]["params.yaml"]["data"]["train_policy"]["common"]["policy_lr"] == 0.002
    eval_metrics = data["metrics"]["metrics/eval.json"]["data"]
    assert set(eval_metrics["families"]) == {f["name"] for f in FAMILIES}
    assert "dreamshard" in eval_metrics["families"]["tiny-6-2"]
    exp_lock = yaml.safe_load((check / "dvc.lock").read_text())["stages"]
    base_lock = yaml.safe_load(pipeline_repo["lock"])["stages"]
    assert {s for s in base_lock if exp_lock[s] != base_lock[s]} == POLICY_STAGES
    for path in ("models/dreamshard.pt", "models/autoshard.pt", "data/eval/results.parquet"):
        assert (check / path).is_file(), path
    from dreamshard.evaluation.report import eval_markdown

    assert eval_markdown(json.loads((check / "metrics/eval.json").read_text())) in markdown
    models = file_digests(check, ["models/dreamshard.pt"])
    assert models != {k: v for k, v in pipeline_repo["digests"].items() if k in models}  # retrained


# ------------------------------------------------------------------ distributed cost collection


def collect_workspace(tiny_project, base: Path, backend: dict | None = None, **collect) -> tuple[Path, dict]:
    """data/ for the collect stage (the tiny project's data and tasks, copied), and its params."""
    params = tiny_params()
    params["paths"] = {k: str(base / v) for k, v in params["paths"].items()}
    if backend:
        params["backend"].update(backend)
    params["collect"].update(collect)
    tiny_project("tasks").copy_to(base)
    return base, params


def run_collect(params: dict, workdir: Path, name: str, env: dict, runner: dict, ok: bool = True):
    p = {**params, "orchestration": {"collect": runner}}
    (workdir / f"{name}.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    return sh([sys.executable, "-m", "pipeline", "collect", "--params", f"{name}.yaml"], workdir, env, ok=ok)


@pytest.mark.integration
def test_collect_on_dask_cluster_matches_single_process(prefect_server, tiny_project, tmp_path):
    from distributed import LocalCluster
    from distributed.diagnostics.plugin import SchedulerPlugin

    env = prefect_server
    base, params = collect_workspace(tiny_project, tmp_path, num_plans=12, chunk_size=2, row_fraction=0.0)  # 12 distinct plans
    costs = Path(params["paths"]["costs"])

    proc = run_collect(params, base, "single", env, {"runner": "local", "workers": 1})
    assert "12 to measure in 6 chunk(s)" in out(proc), out(proc)
    single = {f: (costs / f).read_bytes() for f in ("plans.parquet", "devices.parquet")}
    assert not (costs / "journal").exists()
    shutil.rmtree(costs)

    class Placements(SchedulerPlugin):
        """Where each task went and which resources it asked for, recorded by the scheduler."""

        def __init__(self, scheduler):
            self.scheduler, self.runs = scheduler, []

        def transition(self, key, start, finish, *args, **kwargs):
            if finish == "processing":
                ts = self.scheduler.tasks[key]
                self.runs.append((dict(ts.resource_restrictions or {}), ts.processing_on.address))

    # two single-threaded worker processes, each with one (abstract) GPU, as `dask worker --resources GPU=1`
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"GPU": 1}) as cluster:
        placements = Placements(cluster.scheduler)
        cluster.scheduler.add_plugin(placements)
        proc = run_collect(params, base, "dask", env, {"runner": "dask", "address": cluster.scheduler_address,
                                                       "gpus_per_chunk": 1})
    assert "12 to measure in 6 chunk(s)" in out(proc), out(proc)
    for f, data in single.items():
        assert (costs / f).read_bytes() == data, f"{f} differs between the Dask and the single-process run"
    assert len(placements.runs) == 6, placements.runs
    assert all(res == {"GPU": 1} for res, _ in placements.runs), placements.runs
    assert len({addr for _, addr in placements.runs}) == 2, placements.runs  # both workers measured
    plans = pd.read_parquet(costs / "plans.parquet")
    assert len(plans) == 12 and set(plans["backend"]) == {"analytic"} and not plans["measured"].any()


@pytest.mark.integration
def test_collect_failed_chunk_is_retried_reported_and_resumed(prefect_server, tiny_project, tmp_path):
    """Real FBGEMM kernels with a memory budget that some plans exceed: those chunks fail every attempt."""
    from dreamshard.memory import GB
    from dreamshard.plan import device_memory_bytes
    from stages import collect as stage

    env = prefect_server
    fbgemm = {"device": "cpu", "threads": 1, "warmup": 0, "iterations": 1, "memory_budget_gb": 1.0}
    base, params = collect_workspace(tiny_project, tmp_path, backend={"name": "fbgemm", "batch_size": 64, "fbgemm": fbgemm},
                                     num_plans=8, chunk_size=1)
    job = stage.prepare(params)
    largest = sorted({max(device_memory_bytes(c[0].task, c[0].plan)) for c in job.chunks})
    assert len(largest) >= 2
    cut = len(largest) // 2
    budget = (largest[cut - 1] + largest[cut]) / 2  # half the plans fit
    fbgemm["memory_budget_gb"] = budget / GB
    params["backend"]["fbgemm"] = fbgemm
    job = stage.prepare(params)
    failing = sum(max(device_memory_bytes(c[0].task, c[0].plan)) > budget for c in job.chunks)
    total = len(job.chunks)
    assert 0 < failing < total

    runner = {"runner": "local", "workers": 1, "retries": 1, "retry_delay_s": 0}
    proc = run_collect(params, base, "tight", env, runner, ok=False)
    assert proc.returncode == 1, out(proc)
    assert f"collect: error: {failing} of {total} chunk(s) failed after 1 retry" in proc.stderr, out(proc)
    assert "over the measurement budget" in proc.stderr
    journal = Path(params["paths"]["costs"]) / "journal"
    assert len(list(journal.glob("plans-*.parquet"))) == total - failing  # the finished chunks are kept

    with prefect_client(env) as client:
        from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

        runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="measure-chunk-")))
    failed = [r for r in runs if r.state.is_failed()]
    assert len(failed) == failing and all(r.run_count == 2 for r in failed)  # first attempt + 1 retry

    # a rerun measures only what is missing
    proc = run_collect(params, base, "tight", env, runner, ok=False)
    assert f"{failing} to measure in {failing} chunk(s)" in out(proc), out(proc)
    assert len(list(journal.glob("plans-*.parquet"))) == total - failing


# ------------------------------------------------------------------ make run's shared server


def test_make_run_serves_one_prefect_server_for_the_command_and_stops_it(tmp_path):
    """pipeline.serve: the command sees a healthy server at PREFECT_API_URL, its exit status is kept, and
    the server is gone when it ends."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update({"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    seen = tmp_path / "url"
    probe = ("import os, sys, urllib.request; url = os.environ['PREFECT_API_URL']; "
             f"open({str(seen)!r}, 'w').write(url); "
             "sys.exit(3 if urllib.request.urlopen(url + '/health', timeout=5).read().strip() == b'true' else 4)")
    proc = subprocess.run([sys.executable, "-m", "pipeline.serve", "--", sys.executable, "-c", probe],
                          env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 3, out(proc)  # healthy during the command; the command's status comes back
    url = seen.read_text()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/api")
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/health", timeout=2)  # stopped
    assert (tmp_path / "prefect" / "server.log").exists()
