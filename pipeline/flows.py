"""One Prefect flow per DVC stage; each calls the stage module with the params file.

`collect` lives in pipeline/collect.py (its chunks are mapped over a task runner);
the retraining flow and its deployment in pipeline/retrain.py and prefect.yaml.
"""
from __future__ import annotations

import importlib

from prefect import flow

from dreamshard.project.params import load_params
from pipeline.collect import collect_flow  # chunks mapped over a task runner chosen by params.yaml


def run_stage(name: str, params_file: str) -> None:
    importlib.import_module(f"stages.{name}").run(load_params(params_file))


@flow(name="download")
def download_flow(params_file: str = "params.yaml") -> None:
    run_stage("download", params_file)


@flow(name="process")
def process_flow(params_file: str = "params.yaml") -> None:
    run_stage("process", params_file)


@flow(name="tasks")
def tasks_flow(params_file: str = "params.yaml") -> None:
    run_stage("tasks", params_file)


@flow(name="collect_devices")
def collect_devices_flow(params_file: str = "params.yaml") -> None:
    run_stage("collect_devices", params_file)


@flow(name="train_cost")
def train_cost_flow(params_file: str = "params.yaml") -> None:
    run_stage("train_cost", params_file)


@flow(name="train_policy")
def train_policy_flow(params_file: str = "params.yaml") -> None:
    run_stage("train_policy", params_file)


@flow(name="train_autoshard")
def train_autoshard_flow(params_file: str = "params.yaml") -> None:
    run_stage("train_autoshard", params_file)


@flow(name="train_rnn")
def train_rnn_flow(params_file: str = "params.yaml") -> None:
    run_stage("train_rnn", params_file)


@flow(name="train_neuroshard")
def train_neuroshard_flow(params_file: str = "params.yaml") -> None:
    run_stage("train_neuroshard", params_file)


@flow(name="evaluate")
def evaluate_flow(params_file: str = "params.yaml") -> None:
    run_stage("evaluate", params_file)


STAGE_FLOWS = {
    "download": download_flow,
    "process": process_flow,
    "tasks": tasks_flow,
    "collect": collect_flow,
    "collect_devices": collect_devices_flow,
    "train_cost": train_cost_flow,
    "train_policy": train_policy_flow,
    "train_autoshard": train_autoshard_flow,
    "train_rnn": train_rnn_flow,
    "train_neuroshard": train_neuroshard_flow,
    "evaluate": evaluate_flow,
}
