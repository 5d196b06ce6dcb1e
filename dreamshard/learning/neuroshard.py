"""NeuroShard's pre-trained cost models: fused compute of one device, and all-to-all communication.

The compute model is DreamShard's CostNet trained on single devices only (NeuroShard's augmented data); the
communication model (CommNet) predicts a device's forward and backward all-to-all time from per-device
inputs, so one network serves every device count. Data and inputs: docs/learning.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import nn

from dreamshard.hardware.base import CostBackend, DeviceCost, PlanCost
from dreamshard.hardware.comm import dist_groups, dist_latency_ms, host_exchange_ms
from dreamshard.learning.checkpoints import load_checkpoint, save_checkpoint
from dreamshard.learning.cost_model import (
    CostData,
    CostNet,
    CostNetConfig,
    adam_fit,
    fit_cost_net,
    log_cost,
    median_device_ms,
    mlp,
    plan_device_sums,
)
from dreamshard.learning.features import FeatureScaler
from dreamshard.plan import Plan
from dreamshard.tables import Table
from dreamshard.tasks import Task

# per device: log1p dim sum, log1p others' dim sum, log device count, straggler offset; then with input_dist
# log1p input bytes, log1p others' input bytes
COMM_INPUTS = 4


@dataclass(frozen=True)
class CommNetConfig:
    """Everything that shapes a CommNet; a checkpoint stores it beside the weights."""

    hidden: tuple[int, ...] = (128, 64, 32, 16)
    scale_ms: float = 1.0  # outputs are softplus x scale_ms: the median positive communication cost
    input_dist: bool = False  # inputs include the devices' input bytes (checkpoints before the input dist: False)

    def build(self, generator: torch.Generator) -> CommNet:
        return CommNet(self, generator)


class CommNet(nn.Module):
    def __init__(self, config: CommNetConfig, generator: torch.Generator) -> None:
        super().__init__()
        self.config = config
        self.scale_ms = config.scale_ms
        self.net = mlp(COMM_INPUTS + 2 * config.input_dist, *config.hidden, 2, generator=generator)

    def inputs(self, traffic: np.ndarray, offsets_ms: np.ndarray) -> torch.Tensor:
        """[..., D, 2] traffic (hardware.comm.plan_traffic) and [..., D] straggler offsets -> [..., D, k]
        per-device inputs."""
        traffic = np.asarray(traffic, dtype=np.float64)
        dim_sums, ids = traffic[..., 0], traffic[..., 1]
        others = dim_sums.sum(axis=-1, keepdims=True) - dim_sums
        n = np.broadcast_to(np.float64(dim_sums.shape[-1]), dim_sums.shape)
        x = [np.log1p(dim_sums), np.log1p(others), np.log(n), np.asarray(offsets_ms)]
        if self.config.input_dist:
            x += [np.log1p(ids), np.log1p(ids.sum(axis=-1, keepdims=True) - ids)]
        return torch.from_numpy(np.stack(x, axis=-1)).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., k] -> [..., 2] (fwd_comm_ms, bwd_comm_ms)."""
        return nn.functional.softplus(self.net(x)) * self.scale_ms


@dataclass
class NeuroShardModel:
    compute: CostNet
    comm: CommNet
    scaler: FeatureScaler
    meta: dict

    def save(self, path: str | Path) -> None:
        save_checkpoint(path, "neuroshard", {"compute": self.compute, "comm": self.comm}, self.scaler, self.meta)

    @classmethod
    def load(cls, path: str | Path) -> NeuroShardModel:
        c = load_checkpoint(path, "neuroshard")
        return cls(cast(CostNet, c.networks["compute"]), cast(CommNet, c.networks["comm"]), c.scaler, c.meta)

    def plan_cost(self, task: Task, plan: Plan) -> PlanCost:
        """The models' estimate of a plan (a CostEstimator, never a measurement): each device's predicted fwd and bwd
        at its speed, and its communication from the communication model, given the devices' traffic and how long
        each waits for the slowest forward."""
        sums, traffic = plan_device_sums(self.compute, self.scaler, task, plan)
        speed = np.asarray(task.speeds(), dtype=np.float64)
        with torch.no_grad():
            compute = self.compute.device_costs(sums).double().numpy()[:, :2] / speed[:, None]
            fwd = compute[:, 0]
            comm = self.comm(self.comm.inputs(traffic, fwd.max() - fwd)).double().numpy()
        # table_row_wise tables' outputs, both ways, and the lookup groups' dists: the communication model
        # (hardware.comm) the comm net learned
        topology = self.compute.config.topology
        comm = comm + host_exchange_ms(plan, task, self.compute.config.batch_size, topology)[:, None] + \
            np.array(dist_latency_ms(dist_groups(plan, task), plan.num_devices, topology))
        devices = tuple(DeviceCost(float(f), float(b), float(cf), float(cb)) for (f, b), (cf, cb) in zip(compute, comm))
        return PlanCost(devices, "neuroshard", "model", False, "model")


@dataclass(frozen=True)
class AugmentConfig:
    compute_samples: int = 100  # fused operators measured
    max_tables: int = 15  # tables per operator: 1..max_tables
    memory_cap_gb: float = 1.0  # an operator's tables fit in this
    comm_samples: int = 2000  # all-to-all cases costed
    comm_max_offset_ms: float = 20.0
    dims: tuple[int, ...] = (4, 8, 16, 32, 64, 128)
    seed: int = 0


def compute_dataset(backend: CostBackend, tables: Sequence[Table],
                    cfg: AugmentConfig, task_template: Task, progress=None) -> CostData:
    """Single-device CostData: random table sets at random dims, measured as one fused operator
    (dreamshard/learning/devices.py, which the pipeline's collect_devices stage journals)."""
    from dreamshard.learning.devices import cost_data_of, device_samples, measure_samples

    samples = device_samples(tables, cfg.compute_samples, cfg.max_tables, cfg.memory_cap_gb, cfg.dims,
                             task_template, cfg.seed)
    rows = measure_samples(backend, samples, task_template, {}, on_sample=progress)
    return cost_data_of(samples, [(r["fwd_ms"], r["bwd_ms"]) for r in rows], task_template)


def comm_dataset(backend: CostBackend, device_counts: Sequence[int], pool: Sequence[Table], dims: Sequence[int],
                 cfg: AugmentConfig) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(traffic [D, 2], offsets [D], targets [D, 2]) cases over the given device counts: tables of `pool` at
    dims of `dims`, each on a random device (hardware.comm.shard_traffic)."""
    from dreamshard.hardware.comm import shard_traffic

    rng = np.random.default_rng(cfg.seed + 1)
    cases = []
    for _ in range(cfg.comm_samples):
        n = int(rng.choice(device_counts))
        count = int(rng.integers(n, 60 * n))
        dim = rng.choice(dims, count)
        each = np.array([shard_traffic(pool[int(i)], int(d), topology=backend.topology)
                         for i, d in zip(rng.integers(0, len(pool), count), dim)])
        traffic = np.zeros((n, 2))
        np.add.at(traffic, rng.integers(0, n, count), each)
        fwd = rng.uniform(0, cfg.comm_max_offset_ms, n)  # forward compute of each device
        offsets = fwd.max() - fwd  # how long each device waits for the slowest
        fwd_comm, bwd_comm = backend.communication_cost(fwd, traffic)
        cases.append((traffic, offsets, np.stack([fwd_comm, bwd_comm], axis=-1)))
    return cases


def fit_comm_net(cases, steps: int, lr: float, batch: int, seed: int) -> tuple[CommNet, list[float]]:
    """A new CommNet (weights drawn from a generator seeded with `seed`) fitted to the cases."""
    y = torch.from_numpy(np.concatenate([t for _, _, t in cases])).float()
    positive = y[y > 0]
    config = CommNetConfig(scale_ms=float(positive.median()) if len(positive) else 1.0, input_dist=True)
    net = config.build(torch.Generator().manual_seed(seed))
    x = torch.cat([net.inputs(d, o) for d, o, _ in cases])

    def batch_loss(idx: np.ndarray) -> torch.Tensor:
        i = torch.from_numpy(idx)
        return ((log_cost(net(x[i])) - log_cost(y[i])) ** 2).mean()

    return net, adam_fit(net, len(x), batch_loss, steps, lr, batch, seed)


def comm_mape(net: CommNet, cases) -> float:
    errors = []
    with torch.no_grad():
        for d, o, t in cases:
            pred = net(net.inputs(d, o)).numpy()
            keep = t > 0
            errors.extend((np.abs(pred[keep] - t[keep]) / t[keep]).tolist())
    return float(np.mean(errors)) if errors else float("nan")


def fit_compute_net(data: CostData, scaler: FeatureScaler, steps: int, lr: float, batch: int,
                    seed: int) -> tuple[CostNet, list[float]]:
    """A new compute network (weights drawn from a generator seeded with `seed`) fitted to single devices."""
    net = CostNetConfig(scale_ms=median_device_ms(data)).build(torch.Generator().manual_seed(seed))
    return net, fit_cost_net(net, scaler, data, steps, lr, batch, seed)
