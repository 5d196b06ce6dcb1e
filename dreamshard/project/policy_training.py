"""The policy training of stages train_policy (DreamShard) and train_autoshard (AutoShard).

dreamshard: the alternating loop on the estimated MDP, starting from the train_cost
network; autoshard: the same policy rewarded by real measurements under a budget.
Both train on the training tasks of `train_policy.families` (the other families test
generalisation to unseen table and device counts), save a checkpoint per iteration
under models/<algorithm>/ and write their training curve for `dvc plots`.

Each stage reads `train_policy.families`, `train_policy.common` and its own group
(`train_policy.dreamshard` or `train_policy.autoshard`) and nothing else of
`train_policy`, so changing one algorithm's settings reruns only its stage.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from dreamshard.evaluation.figures import training_curves_figure
from dreamshard.io import write_text
from dreamshard.learning.cost_model import load_cost_net
from dreamshard.learning.train import IterationLog, TrainConfig, Trainer, train_autoshard, train_dreamshard
from dreamshard.project.backend import backend_of
from dreamshard.project.costs import load_scaler_and_data
from dreamshard.project.fit_data import load_single_devices, training_plans
from dreamshard.project.learners import learner_meta, policy_tasks
from dreamshard.project.params import build, section

LOOPS = {"dreamshard": train_dreamshard, "autoshard": train_autoshard}


def train(params: dict[str, Any], algorithm: str, own: dict[str, Any], model_path: Path) -> None:
    """Train `algorithm` with `train_policy.common` overridden by `own` (its params group); save it to
    `model_path`, and each iteration's checkpoint in the folder of the same name without the suffix."""
    options = {**(section(params, "train_policy.common") or {}), **(own or {})}
    config = build(TrainConfig, options, f"train_policy.{algorithm}")
    _, collected, all_tasks = load_scaler_and_data(params)
    data = training_plans(params, collected)  # the plans train_cost learned from
    single = load_single_devices(params, all_tasks)  # every refit learns from them too, as train_cost's fit did
    tasks, bins = policy_tasks(params, all_tasks)
    cost_net, scaler = load_cost_net(section(params, "paths.cost_model"))
    backend = backend_of(params)
    trainer = Trainer(tasks, backend, scaler, config, data, cost_net, single)
    meta = {**learner_meta(tasks, bins, backend), "collected_plans": data.num_plans}

    def save_iteration(log: IterationLog, tr: Trainer) -> None:
        tr.model(algorithm, meta).save(model_path.with_suffix("") / f"iter_{log.iteration:03d}.pt")
        print(f"{algorithm}: iteration {log.iteration}: {log}")

    logs = LOOPS[algorithm](trainer, save_iteration)
    trainer.model(algorithm, meta).save(model_path)
    curve = pd.DataFrame([vars(log) for log in logs])
    plot_path = Path(section(params, "paths.plots")) / f"train_{algorithm}.csv"
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    write_text(curve.to_csv(index=False), plot_path)
    training_curves_figure({algorithm: curve}, plot_path.with_suffix(".png"))
    summary = {"algorithm": algorithm, "real_plan_measurements": {
        "collect": data.num_plans, "training_loop": trainer.measurements,
        "total": data.num_plans + trainer.measurements,
        "collected_for_the_accuracy_report_only": collected.num_plans - data.num_plans},
        "single_device_measurements": 0 if single is None else single.num_plans, "iterations": len(logs),
        "families": meta["families"]}
    write_text(json.dumps(summary, indent=2) + "\n", Path(section(params, "paths.metrics")) / f"train_{algorithm}.json")
