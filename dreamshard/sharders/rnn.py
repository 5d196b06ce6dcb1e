"""The RNN placement baseline as a sharder: a trained RnnModel (dreamshard/learning/rnn.py) placing the tables
through `place_tables`."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dreamshard.data.bins import BinEstimator
from dreamshard.learning.decoding import rank_devices
from dreamshard.learning.rnn import RnnContext, RnnModel
from dreamshard.placement import PlacementState, place_tables
from dreamshard.plan import Plan
from dreamshard.sharders.fallback import Decision
from dreamshard.sharders.learned import LearnedSharder
from dreamshard.tasks import Task


@dataclass
class RnnSharder(LearnedSharder):
    """Plans with a trained RnnModel: tables in the task's order, each onto the device with the best logit that
    has room (`place_tables`, which also keeps the task's constraints and backs up from memory dead ends)."""

    model: RnnModel
    name: str = "rnn"
    # estimates the bins of tables that lack them; None: the model's own estimator, if its metadata has one
    bins: BinEstimator | None = None
    fallback: None = None  # no cost model to rate an analytic plan by: beyond the range it only says so
    last_decision: Decision | None = field(default=None, init=False, compare=False)

    @torch.no_grad()
    def _shard(self, task: Task) -> Plan:
        policy = self.model.policy
        ctx = RnnContext.build(task, self.model.scaler)
        enc = policy.encode(ctx.x)
        hidden = policy.hidden_states(enc)
        capacity = ctx.capacity.numpy()

        def rank(t: int, state: PlacementState) -> list[int]:
            device_sum = torch.from_numpy(state.load).float()
            used = torch.from_numpy(state.used_bytes / capacity).float()
            logits = policy.logits(hidden[t], device_sum, used).numpy()
            return rank_devices(logits)

        return Plan.from_assignment(task, place_tables(task, list(range(len(task.tables))), rank, enc.double().numpy()))
