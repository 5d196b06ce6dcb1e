"""DreamShard's placement policy: a logit for each device that could take the next table.

Inputs per device: the sum of the policy's own encodings of the tables already on it,
the cost network's predicted (fwd, bwd, comm) for it, and the encoding of the table
being placed (left out by the original code; without it the policy cannot tell a big
table from a small one). Nothing depends on the number of tables or devices, so one
policy serves any task.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from torch import nn

from dreamshard.learning.cost_model import CostNet, mlp
from dreamshard.learning.features import NUM_FEATURES, FeatureScaler


@dataclass(frozen=True)
class PolicyNetConfig:
    """Everything that shapes a PolicyNet; a checkpoint stores it beside the weights."""

    hidden: int = 128
    embed: int = 32
    head_hidden: int = 64

    def build(self, generator: torch.Generator) -> PolicyNet:
        return PolicyNet(self, generator)


class PolicyNet(nn.Module):
    def __init__(self, config: PolicyNetConfig, generator: torch.Generator) -> None:
        super().__init__()
        self.config = config
        self.encoder = mlp(NUM_FEATURES, config.hidden, config.embed, generator=generator)
        self.cost_proj = mlp(3, config.head_hidden, config.embed, generator=generator)
        self.head = mlp(3 * config.embed, config.head_hidden, 1, generator=generator)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.encoder(x))

    def logits(self, device_sum: torch.Tensor, device_costs: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """device_sum [..., D, E], device_costs [..., D, 3], table [..., E] -> logits [..., D]."""
        table = table.unsqueeze(-2).expand_as(device_sum)
        h = torch.cat([device_sum, torch.relu(self.cost_proj(device_costs)), table], dim=-1)
        return self.head(h).squeeze(-1)


@dataclass
class LearnedModel:
    """DreamShard's (or AutoShard's) trained model: cost network, policy, feature scaler, metadata."""

    cost_net: CostNet
    policy: PolicyNet
    scaler: FeatureScaler
    meta: dict

    def save(self, path: str | Path) -> None:
        from dreamshard.learning.checkpoints import save_checkpoint

        save_checkpoint(path, "policy", {"cost_net": self.cost_net, "policy": self.policy}, self.scaler, self.meta)

    @classmethod
    def load(cls, path: str | Path) -> LearnedModel:
        from dreamshard.learning.checkpoints import load_checkpoint

        c = load_checkpoint(path, "policy")
        return cls(cast(CostNet, c.networks["cost_net"]), cast(PolicyNet, c.networks["policy"]), c.scaler, c.meta)
