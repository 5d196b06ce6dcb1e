"""Sharders driven by a trained policy (DreamShard, AutoShard), and their checkpoints.

Decoding walks the tables in the policy's order and ranks the devices by the policy's
logits; the first with room is taken, which is the arg-max over the legal devices. The
ranking goes through `place_tables`, so a plan is found whenever one exists (it backs
up from memory dead ends instead of failing). With `samples = k > 0`, k plans are also
sampled (Gumbel noise on the logits = sampling from the softmax over legal devices) and
the one the cost network rates best, greedy plan included, is returned.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dreamshard.cost_model import CostNet
from dreamshard.checkpoints import load_checkpoint, save_checkpoint
from dreamshard.features import FeatureScaler
from dreamshard.mdp import TaskContext
from dreamshard.plan import Plan
from dreamshard.policy import PolicyNet
from dreamshard.sharders.placement import PlacementState, place_tables
from dreamshard.tasks import Task

CHECKPOINT_FORMAT = "dreamshard-model/1"


@dataclass
class LearnedModel:
    cost_net: CostNet
    policy: PolicyNet
    scaler: FeatureScaler
    meta: dict

    def save(self, path: str | Path) -> None:
        state = {
            "cost_net": {"config": self.cost_net.config, "state": self.cost_net.state_dict()},
            "policy": {"config": self.policy.config, "state": self.policy.state_dict()},
            "scaler": self.scaler.to_dict(),
            "meta": self.meta,
        }
        save_checkpoint(state, CHECKPOINT_FORMAT, path)

    @classmethod
    def load(cls, path: str | Path) -> LearnedModel:
        state = load_checkpoint(path, CHECKPOINT_FORMAT)
        cost_net = CostNet(**state["cost_net"]["config"])
        cost_net.load_state_dict(state["cost_net"]["state"])
        policy = PolicyNet(**state["policy"]["config"])
        policy.load_state_dict(state["policy"]["state"])
        cost_net.eval()
        policy.eval()
        return cls(cost_net, policy, FeatureScaler.from_dict(state["scaler"]), state["meta"])


@dataclass
class PolicySharder:
    name: str
    model: LearnedModel
    samples: int = 0
    seed: int = 0

    @torch.no_grad()
    def shard(self, task: Task) -> Plan:
        m = self.model
        ctx = TaskContext.build(task, m.cost_net, m.scaler)
        policy_enc = m.policy.encode(ctx.x)
        embed = ctx.cost_enc.shape[-1]
        weights = torch.cat([ctx.cost_enc, policy_enc], dim=1).double().numpy()

        def decode(noise: np.random.Generator | None) -> list[int]:
            def rank(t: int, state: PlacementState) -> list[int]:
                load = torch.from_numpy(state.load).float()
                costs = m.cost_net.device_costs(load[:, :embed])
                logits = m.policy.logits(load[:, embed:], costs, policy_enc[t]).numpy()
                if noise is not None:
                    logits = logits + noise.gumbel(size=logits.shape)
                return np.argsort(-logits, kind="stable").tolist()

            return place_tables(task, ctx.order, rank, weights)

        best = decode(None)
        if self.samples:
            rng = np.random.default_rng([self.seed, zlib.crc32(task.name.encode())])
            candidates = [best] + [decode(rng) for _ in range(self.samples)]
            best = min(candidates, key=lambda a: self.predicted_ms(ctx, a))
        return Plan.from_assignment(task, best)

    @torch.no_grad()
    def predicted_ms(self, ctx: TaskContext, assignment: list[int]) -> float:
        onehot = torch.nn.functional.one_hot(torch.tensor(assignment), ctx.task.num_devices).float()
        return float(self.model.cost_net.plan_cost(onehot.T @ ctx.cost_enc))
