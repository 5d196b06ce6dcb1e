"""train_cost: fit the cost network on the collected costs; report held-out accuracy.

With `device_data`, the fit also learns from the collect_devices stage's single-device
measurements (counted apart from the plans in metrics/cost_model.json); `comm` says where a
device's communication comes from (the comm head, or the backend's all-to-all model over
`backend.topology` at `backend.batch_size`: dreamshard/learning/cost_model.py).

The feature scaler is fitted on the training pool's tables (at every configured dim)
and saved in the checkpoint with the network. A seeded `holdout_fraction` of the
collected plans is kept out of the fit to measure accuracy (metrics/cost_model.json),
beside the floor under that accuracy within one spell of the machine: how far one
measurement of those plans lies from the median of their rounds (`held_out_measurement_noise`,
from collect.rounds; measured again minutes later they move further: experiments/cost_net.py remeasure). With
`learn_from_held_out` the checkpoint is then refitted on all plans, else it is the network
fitted without them (and the policies' stages too learn from the fitted share only: the held-out
plans then serve the report alone, outside the plan budget the models learn from).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dreamshard.project.cost_network import fit_network
from dreamshard.project.costs import load_scaler_and_data
from dreamshard.project.domain import write_text
from dreamshard.project.fit_data import load_single_devices, plan_split, training_plans
from dreamshard.project.learning import (
    cost_model_scatter,
    evaluate_cost_net,
    fit_fold_exponent,
    measurement_noise,
    plan_predictions,
    save_cost_net,
)
from dreamshard.project.params import section


def plans_with_cuts(plans: pd.DataFrame) -> pd.Series:
    """Per collected plan: does it place some table on more than one device (column slices or row ranges)?"""
    def cut(shards: str) -> bool:
        names = [s["table"] for s in json.loads(shards)]
        return len(set(names)) < len(names)

    return plans["shards"].map(cut).astype(bool)


def run(params: dict[str, Any]) -> None:
    seed = int(section(params, "train_cost.seed"))
    scaler, data, tasks = load_scaler_and_data(params)
    single = load_single_devices(params, tasks)
    held_idx, fit_idx = plan_split(params, data)
    costs = Path(section(params, "paths.costs"))  # the rows behind `data`, in its plan order: each round kept
    collected_plans, collected_devices = pd.read_parquet(costs / "plans.parquet"), pd.read_parquet(costs / "devices.parquet")
    held, fit_on = data.subset(held_idx), data.subset(fit_idx)
    learn_from = training_plans(params, data)

    net, losses = fit_network(params, scaler, fit_on, single, seed)
    held_ids = set(collected_plans["plan_id"].iloc[held_idx])
    noise = measurement_noise(collected_plans[collected_plans["plan_id"].isin(held_ids)],
                              collected_devices[collected_devices["plan_id"].isin(held_ids)])
    cut = plans_with_cuts(collected_plans).to_numpy()
    metrics = {"held_out": evaluate_cost_net(net, scaler, held), "train": evaluate_cost_net(net, scaler, fit_on),
               # accuracy on held-out plans with tables cut into slices (a table on several devices) and without
               "held_out_by_cuts": {
                   label: evaluate_cost_net(net, scaler, held.subset(idx)) if len(idx) > 1 else None
                   for label, idx in (("with_cuts", np.flatnonzero(cut[held_idx])),
                                      ("without_cuts", np.flatnonzero(~cut[held_idx])))},
               "held_out_measurement_noise": noise,
               "holdout_fraction": float(section(params, "train_cost.holdout_fraction")), "final_loss": losses[-1],
               "collected_plans": data.num_plans, "plans_learned_from": learn_from.num_plans,
               "single_device_measurements": 0 if single is None else single.num_plans, "comm": net.config.comm}
    # the held-out plans' predicted and measured costs (before a refit on every plan could see them)
    predicted, measured = plan_predictions(net, scaler, held)
    plots = Path(section(params, "paths.plots"))
    points = pd.DataFrame({"plan": held_idx, "predicted_ms": predicted, "measured_ms": measured,
                           "estimate": net.plan_estimate})
    write_text(points.to_csv(index=False), plots / "cost_model_holdout.csv")
    cost_model_scatter(predicted, measured, plots / "cost_model_holdout.png",
                       title=f"Cost network on {len(points)} held-out plans ({net.plan_estimate} estimate; "
                             f"trained on {fit_on.num_plans})")
    if learn_from.num_plans != fit_on.num_plans:
        net, losses = fit_network(params, scaler, learn_from, single, seed)  # the checkpoint learns from every measured plan
    out = Path(section(params, "paths.cost_model"))
    scaler = fit_fold_exponent(net, scaler, tasks)  # how a dim beyond the range folds, fitted inside it
    metrics["fold_exponent"] = scaler.fold_exponent
    save_cost_net(net, scaler, out)
    write_text(json.dumps(metrics, indent=2) + "\n", section(params, "paths.cost_model_metrics"))
    print(f"train_cost: {data.num_plans} plans; held out: {metrics['held_out']}")
