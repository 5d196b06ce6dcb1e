"""train_neuroshard: NeuroShard's pre-trained compute and communication models -> models/neuroshard.pt.

The compute model learns from the collect_devices stage's single-device measurements (the
augmented data of dreamshard/learning/neuroshard.py: random sets of training tables at random
dims), the communication model from cases costed by the backend; a seeded share of each is
held out for metrics/neuroshard.json.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dreamshard.project.backend import backend_of
from dreamshard.project.data import META_KEY, fit_tables_file
from dreamshard.project.domain import read_tasks, table_dims, table_pool, write_text
from dreamshard.project.learning import (
    AugmentConfig,
    FeatureScaler,
    NeuroShardModel,
    comm_dataset,
    comm_mape,
    cost_data_from_device_rows,
    evaluate_cost_net,
    fit_comm_net,
    fit_compute_net,
    fit_fold_exponent,
    table_features,
)
from dreamshard.project.params import ParamsError, build, section


def run(params: dict[str, Any]) -> None:
    cfg = dict(section(params, "train_neuroshard"))
    fit = cfg.pop("fit")
    holdout = float(section(params, "train_neuroshard.holdout_fraction"))
    cfg.pop("holdout_fraction")
    if not 0 < holdout < 1:
        raise ParamsError(f"params.yaml: train_neuroshard.holdout_fraction: expected in (0, 1), got {holdout}")
    tasks = read_tasks(Path(section(params, "paths.tasks")) / "train.parquet", section(params, "paths.tables"))
    augment = build(AugmentConfig, {**cfg, "dims": tuple(table_dims(tasks))}, "train_neuroshard")
    pool = table_pool(tasks)
    scaler = FeatureScaler.fit(np.concatenate([table_features(t.tables, t.memory) for t in tasks]))
    backend = backend_of(params)
    measured = Path(section(params, "paths.single_devices")) / "devices.parquet"
    data = cost_data_from_device_rows(pd.read_parquet(measured), pool, tasks[0], str(measured))
    cases = comm_dataset(backend, sorted({t.num_devices for t in tasks} | {1}), pool, augment.dims, augment)
    n_hold = max(1, int(round(holdout * data.num_plans)))
    order = np.random.default_rng(augment.seed).permutation(data.num_plans)
    steps, lr, batch, comm_batch = int(fit["steps"]), float(fit["lr"]), int(fit["batch"]), int(fit["comm_batch"])
    compute, _ = fit_compute_net(data.subset(order[n_hold:]), scaler, steps, lr, batch, augment.seed)
    c_hold = max(1, int(round(holdout * len(cases))))
    comm, _ = fit_comm_net(cases[c_hold:], steps, lr, comm_batch, augment.seed)
    metrics = {"compute_held_out": evaluate_cost_net(compute, scaler, data.subset(order[:n_hold])),
               "comm_held_out_mape": comm_mape(comm, cases[:c_hold]),
               "compute_samples": data.num_plans, "comm_samples": len(cases),
               "backend": backend.name, "device": backend.device_name(), "measured": backend.measured}
    # the saved models learn from every sample
    compute, _ = fit_compute_net(data, scaler, steps, lr, batch, augment.seed)
    comm, _ = fit_comm_net(cases, steps, lr, comm_batch, augment.seed)
    scaler = fit_fold_exponent(compute, scaler, tasks)  # how a dim beyond the range folds, fitted inside it
    metrics["fold_exponent"] = scaler.fold_exponent
    # bins for users' tables without histograms: the Zipf exponent that best fits the training tables' bins
    bins = fit_tables_file(section(params, "paths.tables"), [t.name for t in pool])
    meta = {"backend": backend.name, "device": backend.device_name(), "compute_samples": data.num_plans,
            META_KEY: bins.to_dict()}
    NeuroShardModel(compute, comm, scaler, meta).save(section(params, "paths.neuroshard_model"))
    write_text(json.dumps(metrics, indent=2) + "\n", Path(section(params, "paths.metrics")) / "neuroshard.json")
    print(f"train_neuroshard: compute held-out MAPE {metrics['compute_held_out']['device_compute_mape']:.3f}, "
          f"comm held-out MAPE {metrics['comm_held_out_mape']:.3f}")
