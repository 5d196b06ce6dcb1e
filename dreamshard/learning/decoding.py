"""The policy's per-step device logits in NumPy, for planning: the same function as `PolicyNet.logits` on
`CostNet.device_costs`, computed without PyTorch's per-call overhead and without redoing what is linear.

The linear first layers are projected once per table and summed per device by `place_tables`, leaving a few
NumPy operations a step; results equal PyTorch's up to float rounding (a test checks logits and plans).
Training keeps PyTorch (`mdp.rollout`), which needs gradients. Why and how: docs/learning.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import nn

from dreamshard.hardware.comm import DIST_GROUP_MASK, dist_latencies
from dreamshard.learning.cost_model import CostNet
from dreamshard.learning.mdp import LOGIT_TIE, TaskContext
from dreamshard.learning.policy import PolicyNet


def _layers(seq: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray]]:
    """(weight [in, out], bias [out]) of each Linear of an `mlp`, as float64 NumPy arrays."""
    out = []
    for m in seq:
        if isinstance(m, nn.Linear):
            out.append((m.weight.detach().double().numpy().T.copy(), m.bias.detach().double().numpy().copy()))
        elif not isinstance(m, nn.ReLU):
            raise TypeError(f"expected an mlp of Linear and ReLU layers, found {type(m).__name__}")
    return out


def _two_layers(seq: nn.Sequential, name: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    layers = _layers(seq)
    if len(layers) != 2:
        raise ValueError(f"{name}: the NumPy decoder expects a hidden layer and an output layer, found "
                         f"{len(layers)} linear layers")
    return layers[0], layers[1]


def rank_devices(logits: np.ndarray) -> list[int]:
    """Devices best first by `logits` [D], as the greedy rollout chooses (mdp.greedy_devices): logits within
    LOGIT_TIE of the next better one form a group, ranked by device index, so a tie goes to the lowest index
    whatever the float rounding."""
    order = np.argsort(-logits, kind="stable")
    ranked = logits[order]
    apart = ranked[:-1] - ranked[1:] > LOGIT_TIE * (1 + np.abs(ranked[:-1]))
    if apart.all():
        return cast(list[int], order.tolist())
    group = np.concatenate([[0], np.cumsum(apart)])
    return cast(list[int], order[np.lexsort((order, group))].tolist())


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


@dataclass(frozen=True)
class CostHeads:
    """A CostNet's device heads (fwd, bwd, comm: the first `count` of them) in NumPy. Their first layer is linear,
    so each piece's encoding is projected once (`project`) and a device's projections sum to that layer's input;
    `costs` finishes the heads on such sums, as CostNet.head_costs does (by kind, only the groups a device holds)."""

    first: np.ndarray  # [embed, K*H] the heads' first-layer weights side by side
    bias: np.ndarray  # [K, H] their biases
    out: np.ndarray  # [K, H] their output weights
    out_bias: np.ndarray  # [K]
    scale_ms: float
    group_count: int  # lookup groups (CostNetConfig.group_count)

    @classmethod
    def of(cls, cost_net: CostNet, count: int | None = None) -> CostHeads:
        heads = [_two_layers(cast(nn.Sequential, h), f"cost head {i}")
                 for i, h in enumerate(list(cost_net.device_heads)[:count])]
        return cls(first=np.concatenate([w for (w, _), _ in heads], axis=1),
                   bias=np.stack([b for (_, b), _ in heads]),
                   out=np.stack([w[:, 0] for _, (w, _) in heads]),
                   out_bias=np.array([b[0] for _, (_, b) in heads]),
                   scale_ms=float(cost_net.scale_ms), group_count=cost_net.config.group_count)

    @property
    def width(self) -> int:
        """Projected columns: `group_count` blocks of K x H (by kind, each group's piece count follows them)."""
        return self.group_count * self.first.shape[1]

    @property
    def masked(self) -> bool:
        return self.group_count > 1

    def project(self, enc: np.ndarray) -> np.ndarray:
        """[n, CostNet.width] encodings -> [n, width] (by kind: + [n, group_count] piece counts)."""
        if self.masked:  # each group's block [embed, count] (CostNet.encode)
            blocks = enc.reshape(len(enc), self.group_count, -1)
            return np.concatenate([(blocks[:, :, :-1] @ self.first).reshape(len(enc), -1), blocks[:, :, -1]], axis=1)
        return enc @ self.first

    def costs(self, load: np.ndarray) -> np.ndarray:
        """[..., k] summed projections (columns from 0, counts after `width` by kind) -> [..., K] ms of a device at
        the reference speed."""
        shape = load.shape[:-1]
        hidden = np.maximum(load[..., :self.width].reshape(*shape, self.group_count, len(self.out_bias), -1)
                            + self.bias, 0.0)
        per_group = _softplus((hidden * self.out).sum(axis=-1) + self.out_bias) * self.scale_ms
        if self.masked:  # only the groups the device holds run (CostNet.head_costs)
            counts = load[..., self.width:self.width + self.group_count]
            per_group = np.where(counts[..., None] > 0.5, per_group, 0.0)
        return per_group.sum(axis=-2)


@dataclass(frozen=True)
class StepScorer:
    """The logits of one task's placement steps. `weights` [T, k]: what `place_tables` sums per device for
    each table (the cost heads' first-layer input per lookup group, with lookup groups by kind each group's piece
    count, the policy head's device-sum input, the table's traffic in the last 2 columns); `logits(t, load)`
    scores every device for table t from those sums."""

    weights: np.ndarray
    heads: CostHeads  # the cost network's three device heads
    speed: np.ndarray  # [D]
    comm_model: bool  # False: the comm head's estimate
    block_per_dim: float  # bytes a device sends each other device per column of its dim sum
    block_per_byte: float  # bytes of its input dist per byte of its traffic's input bytes: batch / D
    spb: np.ndarray  # [D, D] seconds per byte of each link
    latency_s: float
    proj: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]  # policy cost_proj (3 -> H -> E)
    table_part: np.ndarray  # [T, Hp] the policy head's first layer on the table's encoding, plus its bias
    cost_part: np.ndarray  # [E, Hp] the policy head's first layer on the projected costs
    out: tuple[np.ndarray, np.ndarray]  # the policy head's output layer
    policy_width: int  # columns for the policy head's device sum, from column policy_start

    @property
    def cost_width(self) -> int:
        """Columns of `weights` that feed the cost heads (CostHeads.width); by kind, the groups' counts follow."""
        return self.heads.width

    @property
    def policy_start(self) -> int:
        return self.cost_width + (self.heads.group_count if self.heads.masked else 0)

    @classmethod
    def build(cls, cost_net: CostNet, policy: PolicyNet, ctx: TaskContext) -> StepScorer:
        cfg = cost_net.config
        heads = CostHeads.of(cost_net)
        enc = ctx.cost_enc.double().numpy()
        with torch.no_grad():
            penc = policy.encode(ctx.x).double().numpy()
        (w1, b1), out = _two_layers(policy.head, "policy head")
        e = penc.shape[1]
        w_sum, w_cost, w_table = w1[:e], w1[e:2 * e], w1[2 * e:]
        weights = np.concatenate([heads.project(enc), penc @ w_sum, ctx.widths.double().numpy()], axis=1)
        n = ctx.task.num_devices
        return cls(
            weights=weights,
            heads=heads,
            speed=ctx.cluster.speed.double().numpy(),
            comm_model=cfg.comm == "model",
            block_per_dim=cfg.batch_size / n * cfg.topology.output_bytes,
            block_per_byte=cfg.batch_size / n,
            spb=ctx.cluster.seconds_per_byte.double().numpy(),
            latency_s=cfg.topology.latency_us * 1e-6,
            proj=_two_layers(policy.cost_proj, "policy cost projection"),
            table_part=penc @ w_table + b1,
            cost_part=w_cost,
            out=out,
            policy_width=w_sum.shape[1],
        )

    def device_costs(self, load: np.ndarray) -> np.ndarray:
        """[..., D, k] summed weights -> [..., D, 3] (fwd, bwd, comm) ms, as `CostNet.device_costs` with the task's
        cluster; leading dimensions rate several loads at once."""
        shape = load.shape[:-1]
        costs = self.heads.costs(load)
        costs[..., :2] /= self.speed[:, None]
        if not self.comm_model:
            return costs
        if shape[-1] == 1:
            costs[..., 2] = 0.0
            return costs
        transfer, input_dist = self._exchange(self.block_per_dim * load[..., -2]), \
            self._exchange(self.block_per_byte * load[..., -1])
        fwd = costs[..., 0]
        costs[..., 2] = input_dist + fwd.max(axis=-1, keepdims=True) - fwd + 2 * transfer + self._dists(load)
        return costs

    def _dists(self, load: np.ndarray) -> np.ndarray:
        """[..., D, k] -> [..., 1] ms of the dists' latencies beyond `_exchange`'s, both ways (CostNet.dist_latency_ms):
        by kind, a set per lookup group with pieces on any device."""
        groups = np.ones((*load.shape[:-2], 1))
        if self.heads.masked:
            counts = load[..., self.cost_width:self.cost_width + self.heads.group_count].sum(axis=-2)
            groups = np.maximum(((counts > 0.5) & DIST_GROUP_MASK).sum(axis=-1, keepdims=True), 1)
        return sum(dist_latencies(groups, self.latency_s * 1e3))

    def _exchange(self, block: np.ndarray) -> np.ndarray:
        """[..., D] bytes each device exchanges with each other one -> [..., D] ms (comm.exchange_ms)."""
        return (self.latency_s + np.maximum(block * self.spb.sum(axis=1), block @ self.spb)) * 1e3

    def logits(self, t: int, load: np.ndarray) -> np.ndarray:
        """[D] the policy's logit of each device for table t, the devices' loads summed from `weights`."""
        (p1, q1), (p2, q2) = self.proj
        costs = self.device_costs(load)
        projected = np.maximum(np.maximum(costs @ p1 + q1, 0.0) @ p2 + q2, 0.0)
        device_sum = load[:, self.policy_start:self.policy_start + self.policy_width]
        hidden = np.maximum(device_sum + projected @ self.cost_part + self.table_part[t], 0.0)
        w, b = self.out
        return (hidden @ w)[:, 0] + b[0]
