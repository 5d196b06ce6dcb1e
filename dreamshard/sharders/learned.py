"""Sharders driven by a trained policy (DreamShard, AutoShard): decoding a LearnedModel into a plan.

The policy's logits (`StepScorer`) rank the devices for each table through `place_tables`, so a plan is
found whenever one exists; optional sampled plans and greedy rivals join, and the cost network keeps the one
it rates cheapest. Devices of different speed, decoding options and estimated bins: docs/learning.md.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dreamshard.data.bins import BinEstimator, task_with_estimated_bins
from dreamshard.learning.decoding import StepScorer, rank_devices
from dreamshard.learning.mdp import TaskContext
from dreamshard.learning.policy import LearnedModel
from dreamshard.placement import PlacementState, place_tables
from dreamshard.plan import Plan
from dreamshard.sharders.fallback import AnalyticSharder, Decision, keep_better
from dreamshard.sharders.heuristics import GREEDY_KEYS, greedy_assignment
from dreamshard.sharders.pieces import with_pieces
from dreamshard.tasks import Task


class LearnedSharder:
    """What every sharder planning with a trained model does around its own `_shard`: tables without bins get
    them from `bins` (None: the estimator the model's metadata carries, if any), tables the task asks to be
    cut are cut into pieces first (`with_pieces`), and a task beyond the model's training range is also planned by
    `fallback` where one is given (sharders/fallback.py; `last_decision` says what happened to the last task).
    Subclasses are dataclasses with these fields."""

    name: str
    model: Any  # has .meta and .scaler
    bins: BinEstimator | None
    fallback: AnalyticSharder | None
    last_decision: Decision | None

    def __post_init__(self) -> None:
        if self.bins is None:
            self.bins = BinEstimator.from_meta(self.model.meta, f"{self.name} model metadata")

    def shard(self, task: Task) -> Plan:
        task = task_with_estimated_bins(task, self.bins, self.name)
        plan = with_pieces(task, self._shard)
        plan, self.last_decision = keep_better(task, plan, self.model.scaler.outside(task.tables), self.own_ms,
                                              self.fallback, self.model.scaler.folds)
        return plan

    def _shard(self, task: Task) -> Plan:
        raise NotImplementedError

    def own_ms(self, task: Task, plan: Plan) -> float:
        """`plan` rated by the sharder's own cost model (ms; a model's estimate)."""
        from dreamshard.learning.cost_model import NetworkEstimate

        return NetworkEstimate(self.model.cost_net, self.model.scaler).plan_cost(task, plan).cost_ms


@dataclass
class PolicySharder(LearnedSharder):
    name: str
    model: LearnedModel
    samples: int = 0
    seed: int = 0
    rivals: tuple[str, ...] = ()  # greedy heuristics (GREEDY_KEYS) whose plans the cost network rates beside the policy's
    # estimates the bins of tables that lack them; None: the model's own estimator, if its metadata has one
    bins: BinEstimator | None = None
    fallback: AnalyticSharder | None = None  # plans tasks beyond the training range too (sharders/fallback.py)
    last_decision: Decision | None = field(default=None, init=False, compare=False)

    @torch.no_grad()
    def _shard(self, task: Task) -> Plan:
        m = self.model
        ctx = TaskContext.build(task, m.cost_net, m.scaler)
        scorer = StepScorer.build(m.cost_net, m.policy, ctx)  # the policy's step in NumPy (learning/decoding.py)

        def decode(noise: np.random.Generator | None) -> list[int]:
            def rank(t: int, state: PlacementState) -> list[int]:
                logits = scorer.logits(t, state.load)
                if noise is not None:
                    logits = logits + noise.gumbel(size=logits.shape)
                return rank_devices(logits)

            return place_tables(task, ctx.order, rank, scorer.weights)

        best = decode(None)
        if self.samples or self.rivals:
            rng = np.random.default_rng([self.seed, zlib.crc32(task.name.encode())])
            candidates = [best] + [decode(rng) for _ in range(self.samples)]
            candidates += [greedy_assignment(task, GREEDY_KEYS[name]) for name in self.rivals]
            best = min(candidates, key=lambda a: self.predicted_ms(ctx, a))  # the first of equals: the policy's
        return Plan.from_assignment(task, best)

    @torch.no_grad()
    def predicted_ms(self, ctx: TaskContext, assignment: list[int]) -> float:
        onehot = torch.nn.functional.one_hot(torch.tensor(assignment), ctx.task.num_devices).float()
        sums, dims = onehot.T @ ctx.cost_enc, onehot.T @ ctx.widths
        net = self.model.cost_net
        if bool((ctx.cluster.speed == 1.0).all()):
            return float(net.plan_cost(sums, dims, ctx.cluster))
        return float(net.device_costs(sums, dims, ctx.cluster).sum(dim=-1).max())  # the device-max estimate
