"""Sharders driven by a trained policy (DreamShard, AutoShard): decoding a LearnedModel into a plan.

Decoding walks the tables in the policy's order and ranks the devices by the policy's
logits; the first with room is taken, which is the arg-max over the legal devices. The
ranking goes through `place_tables`, so a plan is found whenever one exists (it backs
up from memory dead ends instead of failing). With `samples = k > 0`, k plans are also
sampled (Gumbel noise on the logits = sampling from the softmax over legal devices), and with
`rivals` (names of greedy heuristics) their plans join the candidates; the one the cost
network rates best, the policy's greedy plan included, is returned (ties: the policy's).
The logits come from `StepScorer` (learning/decoding.py): the networks' step in NumPy, the same
function as the training rollout's up to float rounding, at a fraction of the time.

Devices of different speed (Device.speed): the cost network's device costs are a reference
device's; the policy sees each device's compute divided by its speed (CostNet.device_costs with
the task's cluster), and sampled plans are rated by the device-max estimate at those speeds.

Tables without access-count bins get them from `bins`, a `BinEstimator` (by default the
one the model's metadata carries, if any: see dreamshard.data.bins); with none, such a
table is an error naming it.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dreamshard.data.bins import BinEstimator, task_with_estimated_bins
from dreamshard.learning.decoding import StepScorer, rank_devices
from dreamshard.learning.mdp import TaskContext
from dreamshard.learning.policy import LearnedModel
from dreamshard.placement import PlacementState, place_tables
from dreamshard.plan import Plan
from dreamshard.sharders.heuristics import GREEDY_KEYS, greedy_assignment
from dreamshard.sharders.pieces import with_pieces
from dreamshard.tasks import Task


class LearnedSharder:
    """What every sharder planning with a trained model does around its own `_shard`: tables without bins get
    them from `bins` (None: the estimator the model's metadata carries, if any), and tables the task asks to be
    cut are cut into pieces first (`with_pieces`). Subclasses are dataclasses with these three fields."""

    name: str
    model: Any  # has .meta
    bins: BinEstimator | None

    def __post_init__(self) -> None:
        if self.bins is None:
            self.bins = BinEstimator.from_meta(self.model.meta, f"{self.name} model metadata")

    def shard(self, task: Task) -> Plan:
        return with_pieces(task_with_estimated_bins(task, self.bins, self.name), self._shard)

    def _shard(self, task: Task) -> Plan:
        raise NotImplementedError


@dataclass
class PolicySharder(LearnedSharder):
    name: str
    model: LearnedModel
    samples: int = 0
    seed: int = 0
    rivals: tuple[str, ...] = ()  # greedy heuristics (GREEDY_KEYS) whose plans the cost network rates beside the policy's
    # estimates the bins of tables that lack them; None: the model's own estimator, if its metadata has one
    bins: BinEstimator | None = None

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
