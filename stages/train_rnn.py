"""train_rnn: the RNN placement baseline (dreamshard/learning/rnn.py), trained on real measurements.

Trained on the families of `train_policy.families`, with AutoShard's budget of real plan
measurements (`train_policy.autoshard.measurement_budget`) and episodes per update
(`train_policy.common.episodes`), so the two learn from the same number of measurements;
its own settings are in `train_rnn`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from dreamshard.project.backend import backend_of
from dreamshard.project.costs import load_tasks_and_scaler
from dreamshard.project.domain import write_text
from dreamshard.project.learners import learner_meta, policy_tasks
from dreamshard.project.learning import RnnPolicyConfig, RnnTrainConfig, RnnUpdateLog, train_rnn
from dreamshard.project.params import build, section


def run(params: dict[str, Any]) -> None:
    own = dict(section(params, "train_rnn") or {})
    policy = build(RnnPolicyConfig, own.pop("policy", {}) or {}, "train_rnn.policy")
    budget = {"measurement_budget": section(params, "train_policy.autoshard.measurement_budget"),
              "episodes": section(params, "train_policy.common.episodes")}
    config = build(RnnTrainConfig, {**budget, **own}, "train_rnn")
    tasks, scaler = load_tasks_and_scaler(params)
    tasks, bins = policy_tasks(params, tasks)
    backend = backend_of(params)
    meta = learner_meta(tasks, bins, backend)

    def report(log: RnnUpdateLog) -> None:
        print(f"rnn: update {log.update}: loss {log.policy_loss:.4f}, measured {log.measured_ms:.3f} ms, "
              f"{log.measurements} measurements")

    model, logs = train_rnn(tasks, backend, scaler, config, policy, meta, report)
    model.save(section(params, "paths.rnn_model"))
    plot_path = Path(section(params, "paths.plots")) / "rnn_updates.csv"  # no cost network: not a train_*.csv curve
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    write_text(pd.DataFrame([vars(log) for log in logs]).to_csv(index=False), plot_path)
    summary = {"algorithm": "rnn", "real_plan_measurements": {"training_loop": model.meta["measurements"],
                                                              "total": model.meta["measurements"]},
               "updates": len(logs), "families": meta["families"]}
    write_text(json.dumps(summary, indent=2) + "\n", Path(section(params, "paths.metrics")) / "train_rnn.json")
