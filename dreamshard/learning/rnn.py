"""The RNN placement baseline of the DreamShard paper's comparison: a sequence policy trained on real measurements.

An LSTM reads the tables in the task's order; a shared head scores each device from its hidden state and the
device's load, so it plans for any number of devices. No cost network: it learns from real measurements only,
under AutoShard's budget. Design: docs/learning.md.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import nn

from dreamshard.hardware.base import CostBackend
from dreamshard.learning.cost_model import mlp
from dreamshard.learning.features import NUM_FEATURES, FeatureScaler, table_features
from dreamshard.learning.mdp import Episodes, choose, reinforce_loss, rules_tensors
from dreamshard.placement import Rules
from dreamshard.plan import Plan
from dreamshard.tasks import Task


@dataclass(frozen=True)
class RnnPolicyConfig:
    """Everything that shapes an RnnPolicy; a checkpoint stores it beside the weights."""

    hidden: int = 64  # LSTM state
    embed: int = 32  # table encoding
    head_hidden: int = 64

    def __post_init__(self) -> None:
        for name in ("hidden", "embed", "head_hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")

    def build(self, generator: torch.Generator) -> RnnPolicy:
        return RnnPolicy(self, generator)


class RnnPolicy(nn.Module):
    def __init__(self, config: RnnPolicyConfig, generator: torch.Generator) -> None:
        super().__init__()
        self.config = config
        self.encoder = mlp(NUM_FEATURES, config.hidden, config.embed, generator=generator)
        self.lstm = nn.LSTMCell(config.embed, config.hidden, device="meta").to_empty(device="cpu")
        with torch.no_grad():  # PyTorch's default LSTM initialisation, drawn from `generator`
            bound = 1 / math.sqrt(config.hidden)
            for p in self.lstm.parameters():
                nn.init.uniform_(p, -bound, bound, generator=generator)
        self.head = mlp(config.hidden + config.embed + 1, config.head_hidden, 1, generator=generator)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """[T, F] scaled features -> [T, E] table encodings."""
        return torch.relu(self.encoder(x))

    def hidden_states(self, enc: torch.Tensor) -> torch.Tensor:
        """[T, E] encodings in the fixed order -> [T, H]: the LSTM's state after reading each table."""
        h = torch.zeros(1, self.config.hidden)
        c = torch.zeros(1, self.config.hidden)
        out = []
        for t in range(enc.shape[0]):
            h, c = self.lstm(enc[t: t + 1], (h, c))
            out.append(h[0])
        return torch.stack(out) if out else torch.zeros(0, self.config.hidden)

    def logits(self, hidden: torch.Tensor, device_sum: torch.Tensor, used_share: torch.Tensor) -> torch.Tensor:
        """hidden [..., H], device_sum [..., D, E], used_share [..., D] -> logits [..., D]."""
        h = hidden.unsqueeze(-2).expand(*device_sum.shape[:-1], hidden.shape[-1])
        return self.head(torch.cat([h, device_sum, used_share.unsqueeze(-1)], dim=-1)).squeeze(-1)


@dataclass
class RnnModel:
    """The trained RNN baseline: policy, feature scaler, metadata (bins of the training tables among it)."""

    policy: RnnPolicy
    scaler: FeatureScaler
    meta: dict

    def save(self, path: str | Path) -> None:
        from dreamshard.learning.checkpoints import save_checkpoint

        save_checkpoint(path, "rnn", {"rnn": self.policy}, self.scaler, self.meta)

    @classmethod
    def load(cls, path: str | Path) -> RnnModel:
        from dreamshard.learning.checkpoints import load_checkpoint

        c = load_checkpoint(path, "rnn")
        return cls(cast(RnnPolicy, c.networks["rnn"]), c.scaler, c.meta)


@dataclass(frozen=True)
class RnnContext:
    """What decoding one task needs: scaled features, table sizes, device capacities."""

    task: Task
    x: torch.Tensor  # [T, F]
    sizes: torch.Tensor  # [T] bytes
    capacity: torch.Tensor  # [D] bytes
    allowed: torch.Tensor  # [T, D] bool: the devices each table may take (placement.Rules)

    @classmethod
    def build(cls, task: Task, scaler: FeatureScaler) -> RnnContext:
        x = torch.from_numpy(scaler.transform(table_features(task.tables, task.memory)))
        return cls(task, x, *rules_tensors(Rules.of_task(task)))


def rollout(policy: RnnPolicy, ctx: RnnContext, batch: int, generator: torch.Generator | None = None,
            greedy: bool = False) -> Episodes:
    """`batch` episodes of ctx.task: each table in order onto a device with room, sampled from the policy
    (greedy: the best logit). An episode that reaches a table no device has room for is marked dead."""
    n_dev = ctx.task.num_devices
    enc = policy.encode(ctx.x)
    hidden = policy.hidden_states(enc)
    dev_sum = torch.zeros(batch, n_dev, enc.shape[-1])
    used = torch.zeros(batch, n_dev, dtype=torch.float64)
    dead = torch.zeros(batch, dtype=torch.bool)
    assignment = torch.full((batch, len(ctx.task.tables)), -1, dtype=torch.long)
    log_prob = torch.zeros(batch)
    entropy = torch.zeros(batch)
    for t in range(len(ctx.task.tables)):
        logits = policy.logits(hidden[t].expand(batch, -1), dev_sum, (used / ctx.capacity).float())
        legal = (used + ctx.sizes[t] <= ctx.capacity) & ctx.allowed[t]
        action, step_log_prob, step_entropy, stuck = choose(logits, legal, greedy, generator)
        dead |= stuck
        log_prob = log_prob + step_log_prob
        entropy = entropy + step_entropy
        onehot = torch.nn.functional.one_hot(action, n_dev)
        dev_sum = dev_sum + onehot[..., None] * enc[t]
        used = used + onehot * ctx.sizes[t]
        assignment[:, t] = action
    return Episodes(assignment, log_prob, entropy, torch.full((batch,), float("nan")), dead)


@dataclass(frozen=True)
class RnnTrainConfig:
    """The RNN baseline's training: AutoShard's budget of real plan measurements, `episodes` per update."""

    measurement_budget: int = 100
    episodes: int = 10
    lr: float = 1e-3
    entropy_weight: float = 1e-3
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("measurement_budget", 1), ("episodes", 2), ("seed", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
        for name in ("lr", "entropy_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
        if self.episodes > self.measurement_budget:
            raise ValueError(f"episodes: {self.episodes} per update exceed the measurement_budget "
                             f"{self.measurement_budget}")


@dataclass(frozen=True)
class RnnUpdateLog:
    update: int
    policy_loss: float
    measured_ms: float  # mean measured cost of the update's plans (nan when every episode was a dead end)
    measurements: int  # real plan measurements so far


def train_rnn(tasks: Sequence[Task], backend: CostBackend, scaler: FeatureScaler, config: RnnTrainConfig,
              policy_config: RnnPolicyConfig = RnnPolicyConfig(), meta: dict | None = None,
              on_update: Callable[[RnnUpdateLog], None] | None = None) -> tuple[RnnModel, list[RnnUpdateLog]]:
    """REINFORCE on real measurements: each update samples `episodes` plans of a random training task and
    measures those that fit, until the next update would exceed the budget."""
    if not tasks:
        raise ValueError("no training tasks")
    policy = policy_config.build(torch.Generator().manual_seed(config.seed))
    rng = np.random.default_rng(config.seed)  # tasks
    gen = torch.Generator().manual_seed(config.seed)  # rollouts
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)
    contexts: dict[str, RnnContext] = {}
    measurements = 0
    logs = []
    for update in range(config.measurement_budget // config.episodes):
        task = tasks[int(rng.integers(len(tasks)))]
        ctx = contexts.setdefault(task.name, RnnContext.build(task, scaler))
        ep = rollout(policy, ctx, config.episodes, gen)
        cost = torch.full((config.episodes,), float("nan"))
        alive = (~ep.dead).nonzero().flatten().tolist()
        for i in alive:
            plan = Plan.from_assignment(task, ep.assignment[i].tolist())
            cost[i] = backend.plan_cost(task, plan).cost_ms
        measurements += len(alive)
        loss = reinforce_loss(ep, cost, config.entropy_weight)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        log = RnnUpdateLog(update, float(loss.item()), float(cost[alive].mean()) if alive else float("nan"),
                           measurements)
        logs.append(log)
        if on_update:
            on_update(log)
    policy.eval()
    return RnnModel(policy, scaler, {"algorithm": "rnn", "measurements": measurements, **(meta or {})}), logs
