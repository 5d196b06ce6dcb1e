"""What the cost network's fits learn from (train_cost, and the refits of train_policy and train_autoshard): the
collected plans outside the held-out share (unless `train_cost.learn_from_held_out`), and the single-device
measurements of stage collect_devices when `train_cost.device_data` asks for them."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dreamshard.learning import devices
from dreamshard.learning.cost_model import CostData
from dreamshard.project.params import ParamsError, section
from dreamshard.tasks import Task, table_pool


def load_single_devices(params: dict[str, Any], tasks: list[Task]) -> CostData | None:
    """The collect_devices stage's measurements when `train_cost.device_data` is true, else None."""
    use = section(params, "train_cost.device_data")
    if not isinstance(use, bool):
        raise ParamsError(f"params.yaml: train_cost.device_data: expected true or false, got {use!r}")
    if not use:
        return None
    path = Path(section(params, "paths.single_devices")) / "devices.parquet"
    pool = table_pool(tasks)
    return devices.cost_data_from_device_rows(pd.read_parquet(path), pool, tasks[0], str(path))


def plan_split(params: dict[str, Any], data: CostData) -> tuple[np.ndarray, np.ndarray]:
    """(held-out, fitted) plan indices of the collected plans: a seeded `train_cost.holdout_fraction` held out."""
    holdout = section(params, "train_cost.holdout_fraction")
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or not 0 < holdout < 1:
        raise ParamsError(f"params.yaml: train_cost.holdout_fraction: expected a number in (0, 1), got {holdout!r}")
    order = np.random.default_rng(int(section(params, "train_cost.seed"))).permutation(data.num_plans)
    n_hold = max(1, int(round(holdout * data.num_plans)))
    return order[:n_hold], order[n_hold:]


def training_plans(params: dict[str, Any], data: CostData) -> CostData:
    """The collected plans the models learn from: every plan with `train_cost.learn_from_held_out`, else the
    fitted share only (the held-out plans then serve the accuracy report alone)."""
    every = section(params, "train_cost.learn_from_held_out")
    if not isinstance(every, bool):
        raise ParamsError(f"params.yaml: train_cost.learn_from_held_out: expected true or false, got {every!r}")
    return data if every else data.subset(plan_split(params, data)[1])
