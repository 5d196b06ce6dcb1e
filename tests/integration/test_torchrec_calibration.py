"""`torchrec_calibrated`: TorchRec's perf model with its compute fitted to measured devices (interop/calibration.py).

The oracle: devices whose "measurements" are known multiples of TorchRec's own compute estimates, per sharding type;
the fit must find those multiples from collect-format rows, and the calibrated planner must plan with them."""
from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torchrec", reason="torchrec is not installed (see docs/torchrec.md)")

from dreamshard.errors import DreamShardError  # noqa: E402
from dreamshard.interop.calibration import (  # noqa: E402
    PerfCalibration,
    _relative_nnls,
    fit_calibration,
)
from dreamshard.interop.torchrec import (  # noqa: E402
    _table_shards,
    per_rank_batch,
    plan_caches,
    quiet_torchrec,
    shard_estimates,
    topology,
)
from dreamshard.plan import row_wise_shards, validate_plan  # noqa: E402
from dreamshard.sharders import make_sharder  # noqa: E402
from dreamshard.tables import Table  # noqa: E402
from dreamshard.tasks import Task  # noqa: E402

BATCH = 4096
TRUE = {"table_wise": (2.0, 3.0), "row_wise": (5.0, 0.5)}  # sharding type -> (forward, backward) multiple


def task_of(seed: int) -> Task:
    rng = random.Random(seed)
    tables = [Table(f"t{i}", rng.randint(1_000, 200_000), rng.choice([16, 32, 64]), rng.uniform(1.0, 20.0))
              for i in range(8)]
    return Task.uniform(f"train/f/{seed:04d}", tables, 4, 1.0)


def rows_of(task: Task, plan, plan_id: str) -> tuple[dict, list[dict]]:
    """Collect-format rows of `plan` (its plan row, its device rows), each device "measured" as TRUE's multiples of
    TorchRec's estimates."""
    with quiet_torchrec():
        options = shard_estimates(task, _table_shards(task, plan), per_rank_batch(task, BATCH),
                                  plan_caches(task, plan), topology(task))
    fwd, bwd = np.zeros(task.num_devices), np.zeros(task.num_devices)
    for o in options:
        for s in o.shards:
            f, b = TRUE[o.sharding_type]
            fwd[s.rank] += f * s.perf.fwd_compute
            bwd[s.rank] += b * s.perf.bwd_compute
    plan_row = {"plan_id": plan_id, "task_id": task.name, "num_devices": task.num_devices,
                "shards": json.dumps(plan.to_dict()["shards"])}
    return plan_row, [{"plan_id": plan_id, "device": d, "fwd_ms": fwd[d], "bwd_ms": bwd[d]}
                      for d in range(task.num_devices)]


def collected() -> tuple[dict[str, Task], pd.DataFrame, pd.DataFrame]:
    tasks, plans, devices = {}, [], []
    for seed in range(4):
        task = task_of(seed)
        tasks[task.name] = task
        plan = make_sharder("size_lookup_greedy").shard(task)
        # the same plan with its two largest tables cut row-wise: devices mixing both kinds
        big = sorted(task.tables, key=lambda t: -t.rows)[:2]
        shards = [s for s in plan.shards if s.table not in {t.name for t in big}]
        shards += [s for t in big for s in row_wise_shards(t, task.num_devices)]
        cut = type(plan)(plan.num_devices, tuple(shards))
        validate_plan(task, cut)
        for plan_id, p in ((f"p{seed}", plan), (f"r{seed}", cut)):
            plan_row, device_rows = rows_of(task, p, plan_id)
            plans.append(plan_row)
            devices += device_rows
    return tasks, pd.DataFrame(plans), pd.DataFrame(devices)


def test_relative_nnls_finds_known_factors_and_never_prices_a_kind_at_nothing():
    rng = np.random.default_rng(0)
    est = rng.uniform(0, 1, size=(30, 3))
    est[:, 2] = 0  # a kind no device holds
    x = _relative_nnls(est, est @ np.array([2.0, 0.5, 7.0]))
    assert x[:2] == pytest.approx([2.0, 0.5]) and x[2] > 0


def test_the_fit_recovers_each_kinds_multiples_from_collected_rows():
    tasks, plans, devices = collected()
    cal = fit_calibration(tasks, plans, devices, BATCH)
    for kind, (f, b) in TRUE.items():
        assert cal.factors()[kind] == pytest.approx((f, b), rel=1e-6)
    assert cal.mape_after < 1e-6 < cal.mape_before and cal.devices == len(devices)


def test_the_calibrated_planner_plans_validly_with_the_fitted_compute():
    tasks, plans, devices = collected()
    cal = fit_calibration(tasks, plans, devices, BATCH)
    task = task_of(9)
    plan = make_sharder("torchrec_calibrated", calibration=cal, batch_size=BATCH).shard(task)
    validate_plan(task, plan)
    # its perf estimator is TorchRec's, each shard's compute scaled by its kind's factors
    with quiet_torchrec():
        args = (task, _table_shards(task, plan), per_rank_batch(task, BATCH), {}, topology(task))
        plain, scaled = shard_estimates(*args), shard_estimates(*args, calibration=cal)
    for a, b in zip(scaled, plain):
        f, bw = cal.factors()[a.sharding_type]
        for sa, sb in zip(a.shards, b.shards):
            assert sa.perf.fwd_compute == pytest.approx(f * sb.perf.fwd_compute)
            assert sa.perf.bwd_compute == pytest.approx(bw * sb.perf.bwd_compute)
            assert sa.perf.fwd_comms == pytest.approx(sb.perf.fwd_comms)


def test_rows_of_an_unknown_task_or_without_a_column_are_refused():
    tasks, plans, devices = collected()
    with pytest.raises(DreamShardError, match="not among the tasks given"):
        fit_calibration({}, plans, devices, BATCH)
    with pytest.raises(DreamShardError, match="device rows lack column.s. fwd_ms"):
        fit_calibration(tasks, plans, devices.drop(columns=["fwd_ms"]), BATCH)
    with pytest.raises(DreamShardError, match="plans lack column.s. shards"):
        fit_calibration(tasks, plans.drop(columns=["shards"]), devices, BATCH)
    with pytest.raises(ValueError, match="needs a calibration"):
        make_sharder("torchrec_calibrated")
    assert isinstance(fit_calibration(tasks, plans.iloc[:1], devices, BATCH), PerfCalibration)
