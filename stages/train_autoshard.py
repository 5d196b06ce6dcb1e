"""train_autoshard: the policy trained on real measurements (dreamshard/project/policy_training.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from dreamshard.project.params import section
from dreamshard.project.policy_training import train


def run(params: dict[str, Any]) -> None:
    train(params, "autoshard", section(params, "train_policy.autoshard"), Path(section(params, "paths.autoshard_model")))
