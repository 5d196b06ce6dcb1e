"""train_policy: DreamShard's policy, trained on the estimated MDP (dreamshard/project/policy_training.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from dreamshard.project.params import section
from dreamshard.project.policy_training import train


def run(params: dict[str, Any]) -> None:
    train(params, "dreamshard", section(params, "train_policy.dreamshard"), Path(section(params, "paths.dreamshard_model")))
