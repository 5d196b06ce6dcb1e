"""The collected cost data: the training tasks, the feature scaler of their tables, and the measured plans."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dreamshard.errors import DataFormatError
from dreamshard.learning.cost_model import CostData, cost_data_from_rows
from dreamshard.learning.features import FeatureScaler, table_features
from dreamshard.project.params import section
from dreamshard.tasks import Task, read_tasks


def load_tasks_and_scaler(params: dict[str, Any]) -> tuple[list[Task], FeatureScaler]:
    """The training tasks and the feature scaler of their tables."""
    tasks = read_tasks(Path(section(params, "paths.tasks")) / "train.parquet", section(params, "paths.tables"))
    return tasks, FeatureScaler.fit(np.concatenate([table_features(t.tables, t.memory) for t in tasks]))


def load_scaler_and_data(params: dict[str, Any]) -> tuple[FeatureScaler, CostData, list[Task]]:
    """The feature scaler of the training tasks' tables, the collected cost data, the training tasks."""
    tasks, scaler = load_tasks_and_scaler(params)
    costs = Path(section(params, "paths.costs"))
    plans = pd.read_parquet(costs / "plans.parquet")
    devices = pd.read_parquet(costs / "devices.parquet")
    names = {t.name for t in tasks}
    for file, frame in (("plans.parquet", plans), ("devices.parquet", devices)):
        unknown = sorted(set(frame["task_id"]) - names)
        if unknown:
            raise DataFormatError(f"{costs / file}: task_id {', '.join(map(repr, unknown[:3]))} "
                                  f"{'is' if len(unknown) == 1 else 'are'} not among the training tasks of "
                                  f"{Path(section(params, 'paths.tasks')) / 'train.parquet'}: the costs were "
                                  "collected for other tasks; rerun collect")
    return scaler, cost_data_from_rows(plans, devices, tasks), tasks
