"""DreamShard's placement policy: a logit for each device that could take the next table.

Inputs per device: the sum of the policy's own encodings of the tables already on it,
the cost network's predicted (fwd, bwd, comm) for it, and the encoding of the table
being placed (left out by the original code; without it the policy cannot tell a big
table from a small one). Nothing depends on the number of tables or devices, so one
policy serves any task.
"""
from __future__ import annotations

import torch
from torch import nn

from dreamshard.cost_model import mlp
from dreamshard.features import NUM_FEATURES


class PolicyNet(nn.Module):
    def __init__(self, hidden: int = 128, embed: int = 32, head_hidden: int = 64) -> None:
        super().__init__()
        self.config = {"hidden": hidden, "embed": embed, "head_hidden": head_hidden}
        self.encoder = mlp(NUM_FEATURES, hidden, embed)
        self.cost_proj = mlp(3, head_hidden, embed)
        self.head = mlp(3 * embed, head_hidden, 1)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.encoder(x))

    def logits(self, device_sum: torch.Tensor, device_costs: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """device_sum [..., D, E], device_costs [..., D, 3], table [..., E] -> logits [..., D]."""
        table = table.unsqueeze(-2).expand_as(device_sum)
        h = torch.cat([device_sum, torch.relu(self.cost_proj(device_costs)), table], dim=-1)
        return self.head(h).squeeze(-1)
