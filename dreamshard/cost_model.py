"""DreamShard's cost network: predicts a fused operator's costs from its tables' features.

Each shard's 21 scaled features go through a table encoder (21 -> 128 -> 32); a device
is the sum of its shards' encodings; three heads (32 -> 64 -> 1) predict the device's
forward compute, backward compute and communication; the element-wise max over a plan's
devices goes through a fourth head predicting the plan's cost. Heads end in softplus
times `scale_ms` (the median measured device cost, fixed at the first fit), so a cost
grows about linearly with the summed encodings, as fused costs do. The loss compares
log(ms + TARGET_EPS_MS), so sub-ms and tens-of-ms costs weigh alike.

The plan cost the rest of the system uses (`plan_cost`) is chosen by `plan_estimate`:
"head" is the plan head; "device_max" is the max over devices of their predicted
fwd + bwd + comm. Both are trained and reported; on the default pipeline's held-out
plans (50 collected CPU-kernel plans) device_max ranked plans far better (Kendall tau
0.73 against 0.29), so it is the default.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from dreamshard.features import NUM_FEATURES, FeatureScaler, shard_features
from dreamshard.hardware.base import PlanCost
from dreamshard.plan import Plan
from dreamshard.tasks import Task

TARGET_EPS_MS = 0.01
DEVICE_TARGETS = ("fwd_ms", "bwd_ms", "comm_ms")
PLAN_ESTIMATES = ("device_max", "head")


def mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def log_cost(ms: torch.Tensor) -> torch.Tensor:
    return torch.log(ms + TARGET_EPS_MS)


class CostNet(nn.Module):
    def __init__(self, hidden: int = 128, embed: int = 32, head_hidden: int = 64, scale_ms: float = 1.0,
                 plan_estimate: str = "device_max") -> None:
        super().__init__()
        if plan_estimate not in PLAN_ESTIMATES:
            raise ValueError(f"plan_estimate: expected one of {PLAN_ESTIMATES}, got {plan_estimate!r}")
        self.config = {"hidden": hidden, "embed": embed, "head_hidden": head_hidden, "scale_ms": scale_ms,
                       "plan_estimate": plan_estimate}
        self.scale_ms = scale_ms
        self.plan_estimate = plan_estimate
        self.encoder = mlp(NUM_FEATURES, hidden, embed)
        self.device_heads = nn.ModuleList([mlp(embed, head_hidden, 1) for _ in DEVICE_TARGETS])
        self.plan_head = mlp(embed, head_hidden, 1)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """[..., 21] scaled features -> [..., embed]: sum these over a device's shards."""
        return torch.relu(self.encoder(x))

    def device_costs(self, device_sum: torch.Tensor) -> torch.Tensor:
        """[..., embed] -> [..., 3] predicted (fwd, bwd, comm) ms."""
        raw = torch.cat([h(device_sum) for h in self.device_heads], dim=-1)
        return nn.functional.softplus(raw) * self.scale_ms

    def plan_cost(self, device_sums: torch.Tensor) -> torch.Tensor:
        """[..., D, embed] -> [...] predicted plan cost ms, by `plan_estimate`."""
        if self.plan_estimate == "device_max":
            return self.device_costs(device_sums).sum(dim=-1).max(dim=-1).values
        return self.plan_from_max(device_sums.max(dim=-2).values)

    def plan_from_max(self, max_embedding: torch.Tensor) -> torch.Tensor:
        return nn.functional.softplus(self.plan_head(max_embedding).squeeze(-1)) * self.scale_ms


# ---------------------------------------------------------------- data


@dataclass
class CostData:
    """Measured plans flattened: shards -> device rows -> plans."""

    shard_raw: np.ndarray  # [M, 21] raw features
    shard_device: np.ndarray  # [M] index of the shard's device row
    device_plan: np.ndarray  # [K] index of the device row's plan
    device_ms: np.ndarray  # [K, 3] fwd, bwd, comm
    plan_ms: np.ndarray  # [P]

    @property
    def num_plans(self) -> int:
        return len(self.plan_ms)

    @classmethod
    def empty(cls) -> CostData:
        return cls(np.zeros((0, NUM_FEATURES)), np.zeros(0, np.int64), np.zeros(0, np.int64),
                   np.zeros((0, 3)), np.zeros(0))

    def subset(self, plans: Sequence[int]) -> CostData:
        plans = np.asarray(plans, dtype=np.int64)
        plan_map = np.full(self.num_plans, -1)
        plan_map[plans] = np.arange(len(plans))
        devices = np.flatnonzero(plan_map[self.device_plan] >= 0)
        devices = devices[np.argsort(plan_map[self.device_plan[devices]], kind="stable")]
        dev_map = np.full(len(self.device_plan), -1)
        dev_map[devices] = np.arange(len(devices))
        shards = np.flatnonzero(dev_map[self.shard_device] >= 0)
        return CostData(self.shard_raw[shards], dev_map[self.shard_device[shards]],
                        plan_map[self.device_plan[devices]], self.device_ms[devices], self.plan_ms[plans])

    def concat(self, other: CostData) -> CostData:
        return CostData(
            np.concatenate([self.shard_raw, other.shard_raw]),
            np.concatenate([self.shard_device, other.shard_device + len(self.device_plan)]),
            np.concatenate([self.device_plan, other.device_plan + self.num_plans]),
            np.concatenate([self.device_ms, other.device_ms]),
            np.concatenate([self.plan_ms, other.plan_ms]),
        )


def cost_data_from_plans(task_plans: Sequence[tuple[Task, Plan, PlanCost]]) -> CostData:
    """CostData of measured plans."""
    raw, shard_dev, dev_plan, dev_ms, plan_ms = [], [], [], [], []
    for p, (task, plan, cost) in enumerate(task_plans):
        tables = {t.name: t for t in task.tables}
        for d, dc in enumerate(cost.devices):
            k = len(dev_plan)
            for s in plan.device_shards(d):
                raw.append(shard_features(tables[s.table], s.col_end - s.col_start, task.memory))
                shard_dev.append(k)
            dev_plan.append(p)
            dev_ms.append((dc.fwd_ms, dc.bwd_ms, dc.fwd_comm_ms + dc.bwd_comm_ms))
        plan_ms.append(cost.cost_ms)
    return CostData(np.asarray(raw).reshape(-1, NUM_FEATURES), np.asarray(shard_dev, np.int64),
                    np.asarray(dev_plan, np.int64), np.asarray(dev_ms).reshape(-1, 3), np.asarray(plan_ms))


def cost_data_from_rows(plans, devices, tasks: Sequence[Task]) -> CostData:
    """CostData from the collect stage's plans/devices frames (rows in the same plan order)."""
    plan_index = {pid: i for i, pid in enumerate(plans["plan_id"])}
    by_task = {t.name: ({tb.name: tb for tb in t.tables}, t.memory) for t in tasks}
    raw, shard_dev, dev_plan, dev_ms = [], [], [], []
    for k, row in enumerate(devices.itertuples(index=False)):
        tables, memory = by_task[row.task_id]
        for name, start, end in zip(row.tables, row.col_starts, row.col_ends):
            raw.append(shard_features(tables[name], int(end - start), memory))
            shard_dev.append(k)
        dev_plan.append(plan_index[row.plan_id])
        dev_ms.append((row.fwd_ms, row.bwd_ms, row.fwd_comm_ms + row.bwd_comm_ms))
    return CostData(np.asarray(raw).reshape(-1, NUM_FEATURES), np.asarray(shard_dev, np.int64),
                    np.asarray(dev_plan, np.int64), np.asarray(dev_ms).reshape(-1, 3),
                    plans["cost_ms"].to_numpy(dtype=np.float64))


# ---------------------------------------------------------------- training


def predict(net: CostNet, scaler: FeatureScaler, data: CostData) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted (device [K, 3], plan [P]) costs, ms."""
    x = torch.from_numpy(scaler.transform(data.shard_raw))
    enc = net.encode(x)
    dev = torch.zeros(len(data.device_plan), enc.shape[-1]).index_add(0, torch.from_numpy(data.shard_device), enc)
    device_y = net.device_costs(dev)
    index = torch.from_numpy(data.device_plan)[:, None].expand(-1, dev.shape[-1])
    plan_emb = torch.full((data.num_plans, dev.shape[-1]), -torch.inf).scatter_reduce(0, index, dev, "amax")
    return device_y, net.plan_from_max(plan_emb)


def adam_fit(module: nn.Module, num_items: int, batch_loss: Callable[[np.ndarray], torch.Tensor],
             steps: int, lr: float, batch_size: int, seed: int) -> list[float]:
    """The one training loop of the cost models: Adam with linear lr decay over seeded minibatches.

    `batch_loss(indices)` returns the loss of a minibatch of item indices.
    """
    gen = np.random.default_rng(seed)
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / max(steps, 1))
    losses = []
    module.train()
    for _ in range(steps):
        loss = batch_loss(gen.choice(num_items, size=min(batch_size, num_items), replace=False))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    module.eval()
    return losses


def fit_cost_net(net: CostNet, scaler: FeatureScaler, data: CostData, steps: int, lr: float,
                 batch_plans: int, seed: int) -> list[float]:
    """Sum of the four squared log errors (three device costs, the plan cost); loss per step."""

    def batch_loss(plans: np.ndarray) -> torch.Tensor:
        batch = data.subset(plans)
        device_y, plan_y = predict(net, scaler, batch)
        device_true = torch.from_numpy(batch.device_ms).float()
        plan_true = torch.from_numpy(batch.plan_ms).float()
        return ((log_cost(device_y) - log_cost(device_true)) ** 2).mean(dim=0).sum() + \
            ((log_cost(plan_y) - log_cost(plan_true)) ** 2).mean()

    return adam_fit(net, data.num_plans, batch_loss, steps, lr, batch_plans, seed)


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-a of two rankings (pairs tied in either count as neither)."""
    a, b = np.asarray(a), np.asarray(b)
    da = np.sign(a[:, None] - a[None, :])
    db = np.sign(b[:, None] - b[None, :])
    n = len(a)
    return float((da * db).sum() / (n * (n - 1))) if n > 1 else float("nan")


def evaluate_cost_net(net: CostNet, scaler: FeatureScaler, data: CostData) -> dict[str, float]:
    """MAPE of device costs (compute; compute + comm) and of plan costs, Kendall tau of plan costs.

    Plan costs are given for both estimates: the plan head (plan_*) and the max over
    devices of their predicted costs (plan_device_max_*).
    """
    with torch.no_grad():
        device_y, plan_y = predict(net, scaler, data)
    pred = device_y.numpy()
    compute_pred, compute_true = pred[:, :2].sum(axis=-1), data.device_ms[:, :2].sum(axis=-1)
    dev_pred, dev_true = pred.sum(axis=-1), data.device_ms.sum(axis=-1)
    keep = compute_true > 0  # devices without tables cost 0: no percentage error
    plan_pred = plan_y.numpy()
    device_max = np.full(data.num_plans, -np.inf)
    np.maximum.at(device_max, data.device_plan, dev_pred)
    return {
        "device_compute_mape": float(np.mean(np.abs(compute_pred[keep] - compute_true[keep]) / compute_true[keep])),
        "device_mape": float(np.mean(np.abs(dev_pred[keep] - dev_true[keep]) / dev_true[keep])),
        "plan_mape": float(np.mean(np.abs(plan_pred - data.plan_ms) / data.plan_ms)),
        "plan_kendall_tau": kendall_tau(plan_pred, data.plan_ms),
        "plan_device_max_mape": float(np.mean(np.abs(device_max - data.plan_ms) / data.plan_ms)),
        "plan_device_max_kendall_tau": kendall_tau(device_max, data.plan_ms),
        "plan_estimate_used": net.plan_estimate,
        "num_plans": data.num_plans,
        "num_devices": int(len(data.device_plan)),
    }


def median_device_ms(data: CostData) -> float:
    """The cost scale of a new network: the median measured device cost."""
    totals = data.device_ms.sum(axis=-1)
    positive = totals[totals > 0]
    return float(np.median(positive)) if positive.size else 1.0


COST_NET_FORMAT = "dreamshard-cost-net/1"


def save_cost_net(net: CostNet, scaler: FeatureScaler, path) -> None:
    """The network's constructor config, weights and feature scaler in one checkpoint."""
    from dreamshard.checkpoints import save_checkpoint

    save_checkpoint({"config": net.config, "state": net.state_dict(), "scaler": scaler.to_dict()}, COST_NET_FORMAT, path)


def load_cost_net(path) -> tuple[CostNet, FeatureScaler]:
    """What `save_cost_net` wrote; a clear error naming the file otherwise."""
    from dreamshard.checkpoints import load_checkpoint

    checkpoint = load_checkpoint(path, COST_NET_FORMAT)
    net = CostNet(**checkpoint["config"])
    net.load_state_dict(checkpoint["state"])
    return net, FeatureScaler.from_dict(checkpoint["scaler"])
