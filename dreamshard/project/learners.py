"""What the learners trained on task families share (train_policy, train_autoshard, train_rnn): the tasks of
`train_policy.families`, the bin estimator for tables without histograms, and the metadata a model carries."""
from __future__ import annotations

from typing import Any

from dreamshard.data.bins import META_KEY, BinEstimator, fit_tables_file
from dreamshard.hardware.base import CostBackend
from dreamshard.project.params import ParamsError, section
from dreamshard.tasks import Task


def policy_tasks(params: dict[str, Any], tasks: list[Task]) -> tuple[list[Task], BinEstimator]:
    """The training tasks of `train_policy.families` (all of them when it is empty), and the bin estimator fitted on
    every training table: for users' tables without histograms, the Zipf exponent that best fits the tables' bins."""
    bins = fit_tables_file(section(params, "paths.tables"), sorted({t.name for task in tasks for t in task.tables}))
    families = section(params, "train_policy.families")
    if families:
        unknown = set(families) - {t.family for t in tasks}
        if unknown:
            raise ParamsError(f"params.yaml: train_policy.families: no training tasks of {sorted(unknown)}")
        tasks = [t for t in tasks if t.family in families]
    return tasks, bins


def learner_meta(tasks: list[Task], bins: BinEstimator, backend: CostBackend) -> dict[str, Any]:
    """A trained learner's metadata: what it was trained on (families, table and device counts), its bin estimator,
    and the backend that measured its rewards."""
    return {"families": sorted({t.family for t in tasks}), "backend": backend.name,
            "table_counts": sorted({len(t.tables) for t in tasks}),
            "device_counts": sorted({t.num_devices for t in tasks}), META_KEY: bins.to_dict(),
            "device": backend.device_name()}
