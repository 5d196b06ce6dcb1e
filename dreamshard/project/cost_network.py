"""The cost network fitted as stage train_cost fits it, under `train_cost`'s params (the benchmarks' and experiments'
refits use it too)."""
from __future__ import annotations

from typing import Any

import torch

from dreamshard.hardware.comm import Topology
from dreamshard.learning.cost_model import CostData, CostNet, CostNetConfig, fit_cost_net, median_device_ms
from dreamshard.learning.features import FeatureScaler
from dreamshard.project.params import ParamsError, build, section

WIDTHS = ("hidden", "embed", "head_hidden")  # the CostNetConfig fields fit_network's `widths` may set


def fit_network(params: dict[str, Any], scaler: FeatureScaler, data: CostData, single: CostData | None, seed: int,
                widths: dict[str, int] | None = None) -> tuple[CostNet, list[float]]:
    """A new cost network (weights drawn with `seed`) fitted as train_cost fits it: `data`'s plans and `single`
    (the single devices, or None) under `train_cost`'s params, communication over `backend.topology`.
    `widths`: CostNetConfig's hidden, embed and head_hidden where they differ from its defaults (the
    benchmarks' variants; the stage uses the defaults)."""
    cfg = section(params, "train_cost")
    topology = build(Topology, section(params, "backend.topology"), "backend.topology")
    unknown = sorted(set(widths or {}) - set(WIDTHS))
    if unknown:
        raise ParamsError(f"cost network widths: unknown key(s) {', '.join(unknown)}; expected {', '.join(WIDTHS)}")
    try:
        config = CostNetConfig.with_topology(topology, int(section(params, "backend.batch_size")),
                                             scale_ms=median_device_ms(data),
                                             plan_estimate=section(params, "train_cost.plan_estimate"),
                                             comm=section(params, "train_cost.comm"),
                                             lookup_groups=section(params, "train_cost.lookup_groups"),
                                             **(widths or {}))
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"params.yaml: train_cost: {exc}") from None
    net = config.build(torch.Generator().manual_seed(seed))
    losses = fit_cost_net(net, scaler, data, int(cfg["steps"]), float(cfg["lr"]), int(cfg["batch_plans"]), seed,
                          single, int(cfg["batch_devices"]))
    return net, losses
