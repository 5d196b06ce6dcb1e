"""train_autoshard: the policy trained on real measurements (see stages/train_policy.py)."""
from __future__ import annotations

from typing import Any

from stages.train_policy import train


def run(params: dict[str, Any]) -> None:
    train(params, "autoshard")
