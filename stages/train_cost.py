"""train_cost: fit the cost network on the collected costs; report held-out accuracy.

The feature scaler is fitted on the training pool's tables (at every configured dim)
and saved in the checkpoint with the network. A seeded `holdout_fraction` of the
collected plans is kept out of the fit to measure accuracy (metrics/cost_model.json);
the checkpoint is then refitted on all plans.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from dreamshard.evaluation.figures import cost_model_scatter
from dreamshard.io import write_text
from dreamshard.learning.cost_model import (
    CostNetConfig,
    evaluate_cost_net,
    fit_cost_net,
    median_device_ms,
    plan_predictions,
    save_cost_net,
)
from stages.common import ParamsError, section
from stages.cost_data import load_scaler_and_data


def run(params: dict[str, Any]) -> None:
    cfg = section(params, "train_cost")
    seed = int(section(params, "train_cost.seed"))
    holdout = float(section(params, "train_cost.holdout_fraction"))
    if not 0 < holdout < 1:
        raise ParamsError(f"params.yaml: train_cost.holdout_fraction: expected in (0, 1), got {holdout}")
    scaler, data, _ = load_scaler_and_data(params)
    order = np.random.default_rng(seed).permutation(data.num_plans)
    n_hold = max(1, int(round(holdout * data.num_plans)))
    held, fit_on = data.subset(order[:n_hold]), data.subset(order[n_hold:])

    def fit(d):
        config = CostNetConfig(scale_ms=median_device_ms(d), plan_estimate=section(params, "train_cost.plan_estimate"))
        net = config.build(torch.Generator().manual_seed(seed))
        losses = fit_cost_net(net, scaler, d, int(cfg["steps"]), float(cfg["lr"]), int(cfg["batch_plans"]), seed)
        return net, losses

    net, losses = fit(fit_on)
    metrics = {"held_out": evaluate_cost_net(net, scaler, held), "train": evaluate_cost_net(net, scaler, fit_on),
               "holdout_fraction": holdout, "final_loss": losses[-1]}
    # the held-out plans' predicted and measured costs, before the refit on every plan sees them
    predicted, measured = plan_predictions(net, scaler, held)
    plots = Path(section(params, "paths.plots"))
    points = pd.DataFrame({"plan": order[:n_hold], "predicted_ms": predicted, "measured_ms": measured,
                           "estimate": net.plan_estimate})
    write_text(points.to_csv(index=False), plots / "cost_model_holdout.csv")
    cost_model_scatter(predicted, measured, plots / "cost_model_holdout.png",
                       title=f"Cost network on {len(points)} held-out plans ({net.plan_estimate} estimate; "
                             f"trained on {data.num_plans - n_hold})")
    net, losses = fit(data)  # the checkpoint learns from every measured plan
    out = Path(section(params, "paths.cost_model"))
    save_cost_net(net, scaler, out)
    write_text(json.dumps(metrics, indent=2) + "\n", section(params, "paths.cost_model_metrics"))
    print(f"train_cost: {data.num_plans} plans; held out: {metrics['held_out']}")
