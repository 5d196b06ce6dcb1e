"""TorchRec's perf model calibrated on our measurements: the `torchrec_calibrated` peer.

TorchRec's `EmbeddingPerfEstimator` is an analytic model written for CUDA. Here each of its compute terms gets a
factor per sharding type (forward and backward apart), fitted by non-negative least squares on relative errors to
the same measured devices the cost network trains on (the collect stage's rows: each device's forward and backward
kernel time and its shards), so that TorchRec's own planner searches with costs of the hardware we measure.
Communication stays TorchRec's, told our links (`interop.torchrec.topology`).
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dreamshard.errors import DreamShardError
from dreamshard.plan import Plan, validate_plan
from dreamshard.tasks import Task

PLAN_COLUMNS = ("plan_id", "task_id", "num_devices", "shards")  # the collect stage's plans frame
DEVICE_COLUMNS = ("plan_id", "device", "fwd_ms", "bwd_ms")  # and its devices frame


@dataclass(frozen=True)
class PerfCalibration:
    """Factors on TorchRec's compute estimates per sharding type (forward, backward), and how well they fit."""

    fwd: tuple[tuple[str, float], ...]
    bwd: tuple[tuple[str, float], ...]
    devices: int  # measured devices fitted
    mape_before: float  # of a device's forward + backward compute: TorchRec's estimate against the measurement
    mape_after: float  # the same, calibrated

    def factors(self) -> dict[str, tuple[float, float]]:
        """Sharding type -> (forward, backward) factor of the types fitted (others: `fallback`)."""
        return {k: (f, dict(self.bwd)[k]) for k, f in self.fwd}

    def fallback(self) -> tuple[float, float]:
        """For a sharding type the fit never saw: the median of the fitted factors."""
        return float(np.median([f for _, f in self.fwd])), float(np.median([b for _, b in self.bwd]))

    def to_json(self) -> dict[str, Any]:
        return {"fwd": dict(self.fwd), "bwd": dict(self.bwd), "devices": self.devices,
                "mape_before": self.mape_before, "mape_after": self.mape_after}


def plans_of_rows(plans: pd.DataFrame, devices: pd.DataFrame,
                  tasks: Mapping[str, Task]) -> list[tuple[Task, Plan, pd.DataFrame]]:
    """The collected plans (the plans frame: each plan's shards as collect recorded them) with their tasks and
    their measured devices' rows; a plan whose task is not in `tasks` is an error, as is a missing column."""
    for frame, columns, what in ((plans, PLAN_COLUMNS, "plans"), (devices, DEVICE_COLUMNS, "device rows")):
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise DreamShardError(f"calibration: the collected {what} lack column(s) {', '.join(missing)}")
    by_plan = {plan_id: g for plan_id, g in devices.groupby("plan_id", sort=False)}
    out = []
    for r in plans.itertuples():
        if r.task_id not in tasks:
            raise DreamShardError(f"calibration: plan {r.plan_id} is of task {r.task_id!r}, not among the tasks given")
        task = tasks[r.task_id]
        plan = Plan.from_dict({"num_devices": int(r.num_devices), "shards": json.loads(r.shards)},
                              f"collected plan {r.plan_id}")
        validate_plan(task, plan)
        out.append((task, plan, by_plan.get(r.plan_id, devices.iloc[:0])))
    return out


def fit_calibration(tasks: Mapping[str, Task], plans: pd.DataFrame, devices: pd.DataFrame, batch_size: int,
                    links: Any = None, hbm_gbps: float | None = None) -> PerfCalibration:
    """Fit the factors to the collected `plans` and their measured `devices` (the collect stage's frames) of
    `tasks` (task name -> Task), measured at the global `batch_size`, TorchRec told `links` and `hbm_gbps` as the
    peer is (interop.torchrec.topology)."""
    from dreamshard.interop.torchrec import _table_shards, per_rank_batch, plan_caches, quiet_torchrec, shard_estimates, topology

    samples: list[tuple[dict[str, float], dict[str, float], float, float]] = []  # per device: est fwd, bwd; meas
    with quiet_torchrec():
        for task, plan, g in plans_of_rows(plans, devices, tasks):
            options = shard_estimates(task, _table_shards(task, plan), per_rank_batch(task, batch_size),
                                      plan_caches(task, plan), topology(task, links, hbm_gbps))
            fwd: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
            bwd: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
            for option in options:
                for shard in option.shards:
                    fwd[shard.rank][option.sharding_type] += float(shard.perf.fwd_compute)
                    bwd[shard.rank][option.sharding_type] += float(shard.perf.bwd_compute)
            for r in g.itertuples():
                d = int(r.device)
                if d in fwd and r.fwd_ms > 0 and r.bwd_ms > 0:
                    samples.append((dict(fwd[d]), dict(bwd[d]), float(r.fwd_ms), float(r.bwd_ms)))
    if not samples:
        raise DreamShardError("calibration: no measured device with shards among the collected rows")
    kinds = sorted({k for f, _, _, _ in samples for k in f})
    est_fwd = np.array([[f.get(k, 0.0) for k in kinds] for f, _, _, _ in samples])
    est_bwd = np.array([[b.get(k, 0.0) for k in kinds] for _, b, _, _ in samples])
    meas_fwd = np.array([m for _, _, m, _ in samples])
    meas_bwd = np.array([m for _, _, _, m in samples])
    f_fwd, f_bwd = _relative_nnls(est_fwd, meas_fwd), _relative_nnls(est_bwd, meas_bwd)
    meas = meas_fwd + meas_bwd
    before = est_fwd.sum(1) + est_bwd.sum(1)
    after = est_fwd @ f_fwd + est_bwd @ f_bwd
    return PerfCalibration(tuple(zip(kinds, map(float, f_fwd))), tuple(zip(kinds, map(float, f_bwd))), len(samples),
                           float(np.mean(np.abs(before - meas) / meas)), float(np.mean(np.abs(after - meas) / meas)))


def _relative_nnls(est: np.ndarray, meas: np.ndarray) -> np.ndarray:
    """Factors x >= 0 minimising sum(((est @ x - meas) / meas) ** 2): least squares on the kinds still positive,
    dropping the most negative until none is; a dropped kind (or one never estimated) takes the factor of all kinds
    at once, so that no kind is priced at nothing."""
    a, b = est / meas[:, None], np.ones(len(meas))
    total = a.sum(1)
    overall = float(total @ b / (total @ total)) if total @ total > 0 else 1.0
    active = [k for k in range(est.shape[1]) if np.any(est[:, k] > 0)]
    x = np.full(est.shape[1], overall)
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if np.all(sol > 0):
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))
    return x
