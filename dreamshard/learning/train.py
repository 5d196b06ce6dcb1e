"""Training DreamShard (policy on the estimated MDP) and AutoShard (policy on real measurements).

DreamShard alternates measuring plans its policy samples, refitting the cost network, and REINFORCE updates
rewarded by the network; AutoShard rewards every episode with a real measurement, within a budget. Seeded
through the trainer's own generators. The loop, baselines and results: docs/learning.md.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from dreamshard.hardware.base import CostBackend
from dreamshard.learning.cost_model import CostData, CostNet, CostNetConfig, cost_data_from_plans, fit_cost_net, median_device_ms
from dreamshard.learning.features import FeatureScaler
from dreamshard.learning.mdp import Episodes, TaskContext, reinforce_loss, rollout
from dreamshard.learning.policy import LearnedModel, PolicyNet, PolicyNetConfig
from dreamshard.plan import Plan
from dreamshard.tasks import Task

BASELINES = ("batch", "greedy")


@dataclass(frozen=True)
class TrainConfig:
    iterations: int = 5
    plans_per_iteration: int = 10
    cost_steps: int = 300
    cost_lr: float = 5e-4
    cost_batch_plans: int = 64
    policy_updates: int = 10
    episodes: int = 10
    policy_lr: float = 1e-3
    entropy_weight: float = 1e-3
    measurement_budget: int = 100  # AutoShard only
    refit_steps: int = 30  # AutoShard only: cost-network steps after each policy update
    baseline: str = "batch"  # batch | greedy (DreamShard only: a greedy episode on the estimated MDP)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("iterations", "cost_steps", "cost_batch_plans", "policy_updates", "episodes", "refit_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(self, name)}")
        if self.plans_per_iteration < 0 or self.measurement_budget < 0:
            raise ValueError("plans_per_iteration and measurement_budget must be >= 0")
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline: expected one of {', '.join(BASELINES)}, got {self.baseline!r}")


@dataclass
class IterationLog:
    iteration: int
    cost_loss: float  # last cost-network loss of the refit
    policy_loss: float  # mean policy loss of the iteration
    predicted_ms: float  # mean predicted cost of the plans measured this iteration
    measured_ms: float  # their mean measured cost (nan when none were measured)
    measurements: int  # real plan measurements so far


@dataclass
class Trainer:
    """Shared state of both training loops."""

    tasks: Sequence[Task]
    backend: CostBackend
    scaler: FeatureScaler
    config: TrainConfig
    data: CostData
    start_from: CostNet | None = None  # a fitted cost network to start from (copied); None: fit a new one first
    devices: CostData | None = None  # single-device measurements every refit learns from too (fit_cost_net)
    cost_config: CostNetConfig = field(default_factory=CostNetConfig)  # a new network's (scale_ms from the data)
    cost_net: CostNet = field(init=False)
    policy: PolicyNet = field(init=False)
    measurements: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("no training tasks")
        init = torch.Generator().manual_seed(self.config.seed)  # initial weights
        self.rng = np.random.default_rng(self.config.seed)  # tasks and minibatch seeds
        self.gen = torch.Generator().manual_seed(self.config.seed)  # rollouts
        self.fitted = self.start_from is not None
        if self.start_from is None:
            self.cost_net = replace(self.cost_config, scale_ms=median_device_ms(self.data)).build(init)
        else:
            self.cost_net = copy.deepcopy(self.start_from)
        self.policy = PolicyNetConfig().build(init)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.config.policy_lr)
        self.contexts: dict[str, TaskContext] = {}

    def context(self, task: Task) -> TaskContext:
        # cost encodings change with every refit: contexts are rebuilt after it
        if task.name not in self.contexts:
            self.contexts[task.name] = TaskContext.build(task, self.cost_net, self.scaler)
        return self.contexts[task.name]

    def start(self) -> None:
        if not self.fitted:
            self.refit(self.config.cost_steps)
            self.fitted = True

    def refit(self, steps: int) -> float:
        if self.data.num_plans == 0:
            return float("nan")
        losses = fit_cost_net(self.cost_net, self.scaler, self.data, steps, self.config.cost_lr,
                              self.config.cost_batch_plans, int(self.rng.integers(2**31)), self.devices)
        self.contexts.clear()
        return losses[-1]

    def random_task(self) -> Task:
        return self.tasks[int(self.rng.integers(len(self.tasks)))]

    def measure(self, task: Task, assignments: torch.Tensor) -> list[float]:
        """Measure the plans with the real backend, add them to the cost data; their costs in ms."""
        measured = []
        for a in assignments.tolist():
            plan = Plan.from_assignment(task, a)
            measured.append((task, plan, self.backend.plan_cost(task, plan)))
        self.measurements += len(measured)
        self.data = self.data.concat(cost_data_from_plans(measured))
        return [c.cost_ms for _, _, c in measured]

    def update(self, cost_ms: torch.Tensor, episodes: Episodes, baseline_ms: float | None = None) -> float:
        """One REINFORCE step of the policy on `episodes` rewarded by `cost_ms` (against `baseline_ms` where
        given, else the batch's mean)."""
        loss = reinforce_loss(episodes, cost_ms, self.config.entropy_weight, baseline_ms)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def model(self, algorithm: str, meta: dict) -> LearnedModel:
        return LearnedModel(self.cost_net, self.policy, self.scaler,
                            {"algorithm": algorithm, "measurements": self.measurements, **meta})


def train_dreamshard(trainer: Trainer, on_iteration: Callable[[IterationLog, Trainer], None] | None = None,
                     ) -> list[IterationLog]:
    cfg = trainer.config
    trainer.start()
    logs = []
    for it in range(cfg.iterations):
        predicted, measured = [], []
        for _ in range(cfg.plans_per_iteration):
            task = trainer.random_task()
            with torch.no_grad():
                ep = rollout(trainer.policy, trainer.cost_net, trainer.context(task), 1, trainer.gen)
            if ep.dead.any():
                continue  # a dead end is no plan: nothing to measure
            cost = trainer.measure(task, ep.assignment)
            predicted.append(float(ep.predicted_ms[0]))
            measured += cost
        cost_loss = trainer.refit(cfg.cost_steps)
        policy_losses = []
        for _ in range(cfg.policy_updates):
            ctx = trainer.context(trainer.random_task())
            baseline_ms = None
            if cfg.baseline == "greedy":
                with torch.no_grad():
                    best = rollout(trainer.policy, trainer.cost_net, ctx, 1, greedy=True)
                if not best.dead.any():  # a greedy dead end is no baseline: the batch's mean serves
                    baseline_ms = float(best.predicted_ms[0])
            ep = rollout(trainer.policy, trainer.cost_net, ctx, cfg.episodes, trainer.gen)
            policy_losses.append(trainer.update(ep.predicted_ms, ep, baseline_ms))
        log = IterationLog(it, cost_loss, float(np.mean(policy_losses)),
                           float(np.mean(predicted)) if predicted else float("nan"),
                           float(np.mean(measured)) if measured else float("nan"), trainer.measurements)
        logs.append(log)
        if on_iteration:
            on_iteration(log, trainer)
    return logs


def train_autoshard(trainer: Trainer, on_iteration: Callable[[IterationLog, Trainer], None] | None = None,
                    ) -> list[IterationLog]:
    """Policy updates rewarded by real measurements until the budget is spent."""
    cfg = trainer.config
    if cfg.baseline != "batch":
        raise ValueError(f"baseline: AutoShard's rewards are measurements, so only 'batch' serves (a "
                         f"{cfg.baseline!r} baseline would need a measured episode more per update); got {cfg.baseline!r}")
    trainer.start()
    logs = []
    # each update measures at most `episodes` plans (dead ends are not measured)
    for it in range(cfg.measurement_budget // cfg.episodes):
        if trainer.measurements + cfg.episodes > cfg.measurement_budget:
            break
        task = trainer.random_task()
        ctx = trainer.context(task)
        ep = rollout(trainer.policy, trainer.cost_net, ctx, cfg.episodes, trainer.gen)
        cost = torch.full((cfg.episodes,), float("nan"))
        alive = (~ep.dead).nonzero().flatten()
        if len(alive):
            cost[alive] = torch.tensor(trainer.measure(task, ep.assignment[alive]), dtype=torch.float32)
        policy_loss = trainer.update(cost, ep)
        cost_loss = trainer.refit(cfg.refit_steps)
        alive_mask = ~ep.dead
        log = IterationLog(it, cost_loss, policy_loss,
                           float(ep.predicted_ms[alive_mask].mean()) if len(alive) else float("nan"),
                           float(cost[alive_mask].mean()) if len(alive) else float("nan"), trainer.measurements)
        logs.append(log)
        if on_iteration:
            on_iteration(log, trainer)
    return logs
