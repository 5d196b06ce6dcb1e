"""How well each cost model rates the plans the evaluate stage measured: per family, its mean absolute percentage
error on a plan's cost and its Kendall tau over each task's plans (the ranking a search relies on).

The models: DreamShard's cost network (the dreamshard checkpoint), NeuroShard's cost models, TorchRec's perf model
told the cluster the backend prices (`torchrec`, CUDA defaults: its scale is not the CPU's, its ranking is what
counts) and the same with its compute fitted to the collected measurements (`torchrec_calibrated`,
interop/calibration.py). Each rates the very plans that were measured; nothing is measured here. For the tables
beyond the learned models' training range (holdout families), `tools.model_error` reports these beside the
default families.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dreamshard.learning.cost_model import NetworkEstimate, kendall_tau
from dreamshard.plan import Plan
from dreamshard.tasks import Task

Estimate = Callable[[Task, Plan], float]


def plan_of_row(row: Any, task: Task) -> Plan:
    """The plan a results row measured (its `shards` column, JSON)."""
    return Plan.from_dict({"num_devices": task.num_devices, "shards": json.loads(row.shards)}, f"results row {row.task}")


def torchrec_estimates(batch_size: int, links: Any, hbm_gbps: float | None, calibration: Any = None) -> Estimate:
    """TorchRec's rating of a plan (ms, slowest rank) at the global `batch_size` on `links`: its own perf model, or
    with `calibration`'s compute factors."""
    from dreamshard.interop.torchrec import topology, torchrec_batch, torchrec_perf_estimate

    def rate(task: Task, plan: Plan) -> float:
        return torchrec_perf_estimate(task, plan, torchrec_batch(task, batch_size), topology(task, links, hbm_gbps),
                                      calibration).cost_ms

    return rate


def learned_estimates(dreamshard_model: Any = None, neuroshard_model: Any = None) -> dict[str, Estimate]:
    """The learned cost models given: "cost_network" (a LearnedModel's), "neuroshard" (a NeuroShardModel)."""
    found: dict[str, Estimate] = {}
    if dreamshard_model is not None:
        net = NetworkEstimate(dreamshard_model.cost_net, dreamshard_model.scaler)
        found["cost_network"] = lambda task, plan: net.plan_cost(task, plan).cost_ms
    if neuroshard_model is not None:
        found["neuroshard"] = lambda task, plan: neuroshard_model.plan_cost(task, plan).cost_ms
    return found


def learned_estimates_of(folder: str | Path) -> dict[str, Estimate]:
    """learned_estimates of the checkpoints of another finished project folder (its params.yaml's model paths, read
    relative to it): models trained otherwise, to rate on the same plans."""
    from dreamshard.project.evaluation import model_paths_of
    from dreamshard.project.params import load_params
    from dreamshard.sharders import load_model

    root = Path(folder)
    paths = model_paths_of(load_params(root / "params.yaml"))
    return learned_estimates(load_model("dreamshard", str(root / paths["dreamshard"])),
                             load_model("neuroshard", str(root / paths["neuroshard"])))


def estimates_of(params: dict[str, Any]) -> dict[str, Estimate]:
    """The four models of the module docstring as the evaluate stage's params give them: the trained checkpoints
    (paths), TorchRec told backend.topology and backend.hbm_gbps at backend.batch_size, calibrated on paths.costs."""
    from dreamshard.hardware.topology import Topology
    from dreamshard.project.evaluation import _hbm_gbps, model_paths_of, torchrec_calibration
    from dreamshard.project.params import build, section
    from dreamshard.sharders import load_model

    batch = int(section(params, "backend.batch_size"))
    links, hbm = build(Topology, section(params, "backend.topology"), "backend.topology"), _hbm_gbps(params)
    models = model_paths_of(params)
    return {**learned_estimates(load_model("dreamshard", models["dreamshard"]),
                                load_model("neuroshard", models["neuroshard"])),
            "torchrec": torchrec_estimates(batch, links, hbm),
            "torchrec_calibrated": torchrec_estimates(batch, links, hbm,
                                                      torchrec_calibration(params, batch, links, hbm))}


def fitted_blend(results: pd.DataFrame, tasks: Sequence[Task], first: Estimate,
                 second: Estimate) -> tuple[Estimate, tuple[float, float, float]]:
    """A log-linear blend of two models, exp(w0 + w1 log first + w2 log second), fitted by least squares to the
    log measured costs of `results`' plans (the evaluate stage's training rows: no test plan), and its weights."""
    by_name = {t.name: t for t in tasks}
    x, y = [], []
    for r in results.itertuples():
        task = by_name[r.task]
        plan = plan_of_row(r, task)
        x.append([1.0, np.log(first(task, plan)), np.log(second(task, plan))])
        y.append(np.log(float(r.cost_ms)))
    w = np.linalg.lstsq(np.asarray(x), np.asarray(y), rcond=None)[0]

    def blend(task: Task, plan: Plan) -> float:
        return float(np.exp(w[0] + w[1] * np.log(first(task, plan)) + w[2] * np.log(second(task, plan))))

    return blend, (float(w[0]), float(w[1]), float(w[2]))


def model_error(results: pd.DataFrame, tasks: Sequence[Task], estimates: Mapping[str, Estimate]) -> dict[str, Any]:
    """Per family and model: `mape` (mean |estimate - measured| / measured over the rows' plans), `bias` (the mean
    of (estimate - measured) / measured: below 0, the model rates the plans cheaper than they measure), `tau` (mean over
    tasks of Kendall's tau between estimates and measured costs of the task's distinct plans; tasks with fewer than
    3 distinct plans are left out), the numbers of plans and tasks."""
    by_name = {t.name: t for t in tasks}
    rows = []
    for r in results.itertuples():
        task = by_name[r.task]
        plan = plan_of_row(r, task)
        rows.append({"family": r.family, "task": r.task, "key": repr(plan.key()), "measured": float(r.cost_ms),
                     **{name: float(f(task, plan)) for name, f in estimates.items()}})
    frame = pd.DataFrame(rows)
    summary: dict[str, Any] = {}
    for family, g in frame.groupby("family", sort=False):
        summary[str(family)] = {}
        for name in estimates:
            rel = (g[name] - g["measured"]) / g["measured"]
            taus = []
            for _, t in g.groupby("task", sort=False):
                distinct = t.drop_duplicates("key")
                if len(distinct) >= 3:
                    taus.append(kendall_tau(distinct[name].to_numpy(), distinct["measured"].to_numpy()))
            summary[str(family)][name] = {"mape": float(rel.abs().mean()), "bias": float(rel.mean()),
                                          "tau": float(np.mean(taus)) if taus else None,
                                          "plans": int(len(g)), "tasks_ranked": len(taus)}
    return summary


def input_dist_repriced(rows: Any, tasks: dict[str, Task], params: dict[str, Any], priced_by: int) -> Any:
    """`rows` (the evaluate stage's results) with costs under the communication model without the input dist
    (`cost_ms_without`) and with it (`cost_ms_with`), from each row's measured compute and modelled communication;
    `priced_by`: the comm model version that priced the rows (hardware.comm.MODEL_VERSION: 1 without, 2 with).
    Nothing is measured: compute stays as measured, the input dist is the model's (comm.input_dist_ms)."""
    import numpy as np

    from dreamshard.hardware.comm import input_dist_ms, plan_traffic
    from dreamshard.hardware.topology import Topology
    from dreamshard.project.params import ParamsError, build, section

    if priced_by not in (1, 2):
        raise ParamsError(f"priced_by: expected 1 (no input dist) or 2 (the input dist), got {priced_by!r}")
    topology = build(Topology, section(params, "backend.topology"), "backend.topology")
    batch = int(section(params, "backend.batch_size"))
    without, with_ = [], []
    for row in rows.itertuples(index=False):
        task = tasks[row.task]
        plan = plan_of_row(row, task)
        delta = input_dist_ms(plan_traffic(plan, task, topology)[:, 1], batch, topology, task.host_ids())
        priced = delta if priced_by == 2 else np.zeros_like(delta)  # the input dist the row's cost holds
        compute = np.asarray(row.fwd_ms) + np.asarray(row.bwd_ms) + np.asarray(row.bwd_comm_ms)
        comm = np.asarray(row.fwd_comm_ms) - priced
        if not np.isclose((compute + comm + priced).max(), row.cost_ms, rtol=1e-9):
            raise ValueError(f"results row {row.task} {row.algorithm}: its devices do not sum to its cost_ms")
        without.append(float((compute + comm).max()))
        with_.append(float((compute + comm + delta).max()))
    return rows.assign(cost_ms_without=without, cost_ms_with=with_)
