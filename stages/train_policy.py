"""train_policy: DreamShard's policy, trained on the estimated MDP (dreamshard/project/policy_training.py), with
plans of dreamshard_cut's search (params cut_search) measured in its loop."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from dreamshard.project.params import build, section
from dreamshard.project.policy_training import train
from dreamshard.sharders.cuts import CutConfig, CutSearchSharder


def run(params: dict[str, Any]) -> None:
    own = section(params, "train_policy.dreamshard")
    cuts = build(CutConfig, section(params, "cut_search"), "cut_search")  # dreamshard_cut's, as evaluated
    planner = None
    if (own or {}).get("cut_plans_per_iteration"):
        def planner(model, task):
            return CutSearchSharder("dreamshard_cut", model, cuts).shard(task)
    train(params, "dreamshard", own, Path(section(params, "paths.dreamshard_model")), planner)
