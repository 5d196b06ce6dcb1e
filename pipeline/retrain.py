"""Scheduled retraining: the flow of the `retrain` deployment (prefect.yaml, docs/gpu-cluster.md).

One run works in a checkout of the project (the deployment's pull step clones it into
the worker's temporary directory, or `working_dir` points at a checkout) and uses DVC
for everything that touches data:

1. `dvc pull --run-cache --allow-missing` when a default DVC remote is configured, so
   that only stages whose inputs changed are recomputed;
2. `dvc exp run -n NAME -S key=value ...` (an experiment, the default) or `dvc repro`
   (`experiment=False`, no overrides); `set_params` are the `-S` overrides, e.g.
   {"train_policy.common.policy_lr": 0.0005, "train_policy.families": ["dlrm-20-4"]};
3. `dvc push --run-cache` when a remote is configured, and `dvc exp push GIT_REMOTE NAME`
   when `git_remote` is given (the experiment's commit, so `dvc exp show` lists it
   anywhere, and its outputs): a throw-away checkout loses nothing;
4. a Markdown artifact (key `artifact_key`) with the evaluation table of
   metrics/eval.json (dreamshard.evaluation.report.eval_markdown) and what was run.

Stage commands run `python -m pipeline STAGE` with this interpreter (its folder goes
first on PATH) and report to the same Prefect API as this flow.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from dreamshard.project.domain import DreamShardError


class RetrainError(DreamShardError):
    pass


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("DVC_NO_ANALYTICS", "1")
    return env


def _git(args: list[str]) -> str:
    proc = subprocess.run(["git", *args], capture_output=True, text=True, env=_env())
    return proc.stdout.strip() if proc.returncode == 0 else ""


@task(name="dvc", task_run_name="dvc {args[0]}", cache_policy=NO_CACHE, persist_result=False)
def dvc(args: list[str], env: dict[str, str] | None = None) -> str:
    """Run `dvc ARGS` here (this interpreter's DVC); its output goes to the run's logs."""
    logger = get_run_logger()
    cmd = [sys.executable, "-m", "dvc", *args]
    logger.info("$ dvc %s", shlex.join(args))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env or _env())
    out = proc.stdout + proc.stderr
    if out.strip():
        logger.info(out.strip())
    if proc.returncode != 0:
        raise RetrainError(f"`dvc {shlex.join(args)}` failed ({proc.returncode}):\n{out[-4000:]}")
    return out


def default_remote() -> str | None:
    """The DVC remote `dvc pull`/`dvc push` use without -r, or None."""
    proc = subprocess.run([sys.executable, "-m", "dvc", "remote", "default"], capture_output=True, text=True,
                          env=_env())
    name = proc.stdout.strip()
    return name if proc.returncode == 0 and name else None


def set_param_args(set_params: dict[str, Any]) -> list[str]:
    """`-S key=value` for each override; values in YAML flow style, as `dvc exp run -S` parses them."""
    args = []
    for key, value in set_params.items():
        text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20).strip()
        text = text.removesuffix("\n...").removesuffix("...").strip()
        args += ["-S", f"{key}={text}"]
    return args


def stages_run(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


def summary_markdown(metrics: dict, *, experiment: str | None, set_params: dict[str, Any], ran: list[str],
                     commit: str, remote: str | None) -> str:
    from dreamshard.project.evaluation import eval_markdown

    lines = ["# DreamShard retraining", "",
             f"- commit: `{commit or 'unknown'}`",
             f"- experiment: `{experiment}`" if experiment else "- `dvc repro` in the workspace (no experiment)",
             f"- parameter overrides: {', '.join(f'`{k}={v!r}`' for k, v in set_params.items()) or 'none'}",
             f"- stages run: {', '.join(ran) or 'none (all up to date)'}",
             f"- DVC remote: {f'`{remote}` (pulled and pushed)' if remote else 'none configured'}",
             "", "## Evaluation (metrics/eval.json)", ""]
    return "\n".join(lines) + "\n" + eval_markdown(metrics)


@flow(name="retrain")
def retrain_flow(set_params: dict[str, Any] | None = None, experiment: bool = True, name: str | None = None,
                 targets: list[str] | None = None, pull: bool = True, push: bool = True,
                 git_remote: str | None = None, artifact_key: str = "dreamshard-eval",
                 params_file: str = "params.yaml") -> dict[str, Any]:
    """Pull, reproduce (as a DVC experiment with `set_params`), push, publish the evaluation table."""
    from prefect.runtime import flow_run

    logger = get_run_logger()
    set_params = dict(set_params or {})
    if set_params and not experiment:
        raise RetrainError("set_params need experiment=True: `dvc repro` takes no parameter overrides")
    env = _env()
    if not _git(["config", "user.name"]) or not _git(["config", "user.email"]):
        # `dvc exp run` commits the experiment; a worker's throw-away checkout may have no identity
        for who in ("AUTHOR", "COMMITTER"):
            env.setdefault(f"GIT_{who}_NAME", "DreamShard retrain")
            env.setdefault(f"GIT_{who}_EMAIL", "retrain@dreamshard.invalid")
    remote = default_remote()
    logger.info("DVC remote: %s", remote or "none configured")
    if pull and remote:
        dvc(["pull", "--run-cache", "--allow-missing"], env)
    targets = list(targets or [])
    exp_name = None
    if experiment:
        exp_name = name or f"retrain-{flow_run.name or 'run'}"
        out = dvc(["exp", "run", "-n", exp_name, *set_param_args(set_params), *targets], env)
    else:
        out = dvc(["repro", *targets], env)
    ran = stages_run(out)
    if push and remote:
        dvc(["push", "--run-cache"], env)
        if exp_name and git_remote:
            dvc(["exp", "push", git_remote, exp_name], env)
    elif git_remote and exp_name:
        dvc(["exp", "push", "--no-cache", git_remote, exp_name], env)

    from dreamshard.project.params import load_params, section

    metrics_path = Path(section(load_params(params_file), "paths.eval_metrics"))
    summary: dict[str, Any] = {"experiment": exp_name, "stages_run": ran, "remote": remote,
                               "commit": _git(["rev-parse", "HEAD"])}
    if metrics_path.exists():
        metrics = json.loads(metrics_path.read_text())
        markdown = summary_markdown(metrics, experiment=exp_name, set_params=set_params, ran=ran,
                                    commit=summary["commit"], remote=remote)
        summary["artifact_id"] = str(create_markdown_artifact(
            markdown=markdown, key=artifact_key,
            description=f"DreamShard evaluation after retraining ({exp_name or 'dvc repro'})"))
        summary["metrics"] = str(metrics_path)
    else:
        logger.warning("%s not found (targets %s): no evaluation artifact", metrics_path, targets or "all")
    return summary
