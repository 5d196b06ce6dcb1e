"""experiments/decoding_ab.py: the variant's cost on a task is the measured cost of the evaluated plan it picks."""
from __future__ import annotations

import importlib
import json

import pytest

from dreamshard.sharders.heuristics import GREEDY_KEYS
from experiments import decoding_ab


def test_the_variant_takes_the_measured_row_of_the_plan_it_picks(tiny_project, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = tiny_project("trained").copy_to(tmp_path)  # the tiny project with a trained DreamShard policy
    params["evaluate"].update(sharders=[*GREEDY_KEYS, "dreamshard"], estimated_bins={"tasks_per_family": 0, "rounds": 1},
                              train_tasks_per_family=1)
    params["orchestration"] = {"evaluate": {"planning_workers": 1, "planning_chunk": 4}}
    importlib.import_module("stages.evaluate").run(params)
    frame, counts = decoding_ab.counterfactual(params, "dreamshard", tuple(GREEDY_KEYS))
    variant = frame[frame["algorithm"] == "dreamshard+rivals"]
    assert counts["tasks"] == len(set(zip(frame["split"], frame["task"]))) == len(variant) + counts["missing"]
    assert counts["missing"] == 0 and counts["kept"] + sum(counts[r] for r in GREEDY_KEYS) == counts["tasks"]
    for _, row in variant.iterrows():  # the same plan, the same measurement as one evaluated row of its task
        same = frame[(frame["task"] == row["task"]) & (frame["split"] == row["split"])
                     & (frame["algorithm"] != row["algorithm"])]
        matches = same[same["shards"].map(decoding_ab.plan_key_of) == decoding_ab.plan_key_of(row["shards"])]
        assert not matches.empty and (matches["cost_ms"] == row["cost_ms"]).all()
    result = decoding_ab.report(frame, "dreamshard", seed=0)
    assert set(result) == {"test", "train"}
    assert all("dreamshard+rivals" in v for fams in result.values() for v in fams.values())
    with pytest.raises(decoding_ab.DreamShardError, match="missing: autoshard"):
        decoding_ab.counterfactual(params, "autoshard", ("size_greedy",))
    json.dumps(result)  # written as JSON by the command
