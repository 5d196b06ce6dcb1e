"""benchmarks/seeds.py: every seed of params set, each run's figures read, the spread over seeds reported."""
from __future__ import annotations

import pytest

from benchmarks import seeds


def test_every_seed_key_at_any_depth_is_set_and_nothing_else():
    params = {"data": {"synthetic": {"seed": 0, "num_tables": 1000}}, "tasks": {"seed": 0, "dims": [4, 8]},
              "train_policy": {"common": {"seed": 0, "episodes": 10}}, "evaluate": {"seed": 0, "sharders": ["a"]},
              "profiles": [{"name": "f", "seed": 3}], "paths": {"raw": "data/raw"}}
    out = seeds.with_seed(params, 2)
    assert out == {"data": {"synthetic": {"seed": 2, "num_tables": 1000}}, "tasks": {"seed": 2, "dims": [4, 8]},
                   "train_policy": {"common": {"seed": 2, "episodes": 10}}, "evaluate": {"seed": 2, "sharders": ["a"]},
                   "profiles": [{"name": "f", "seed": 2}], "paths": {"raw": "data/raw"}}
    assert params["tasks"]["seed"] == 0  # a copy


def cell(mean: float, high: float) -> dict:
    return {"mean_ratio": mean, "ci_low": mean - 0.05, "ci_high": high, "win_rate": 1.0, "tasks": 12, "groups": 6}


def metrics(peer_mean: float, peer_high: float) -> dict:
    return {"families": {"f-80-8": {
        "dreamshard_cut": {"vs_torchrec_peer": cell(peer_mean, peer_high), "vs_best_heuristic": cell(0.8, 0.9)},
        "dreamshard": {"vs_torchrec_peer": cell(1.1, 1.2)},
        "torchrec_peer": "torchrec_full", "best_heuristic": "size_lookup_greedy"}}}


def test_figures_per_seed_and_their_spread_reach_the_readme():
    summary = {"commit": "abc1234", "machine": "a CPU", "command": "python -m benchmarks.seeds",
               "seeds": {str(s): {"minutes": 15.0, "families": seeds.seed_figures(metrics(m, h))}
                         for s, (m, h) in enumerate([(0.85, 0.95), (0.9, 0.99), (0.95, 1.02)])}}
    fam = summary["seeds"]["0"]["families"]["f-80-8"]
    assert fam["torchrec_peer"] == "torchrec_full" and fam["dreamshard_cut/vs_torchrec_peer"]["groups"] == 6
    assert "dreamshard/vs_best_heuristic" not in fam  # not in the run's metrics: not invented
    spread = seeds.across(summary["seeds"], "dreamshard_cut/vs_torchrec_peer")["f-80-8"]
    assert spread["mean"] == pytest.approx(0.9) and (spread["min"], spread["max"]) == (0.85, 0.95)
    assert spread["max_ci_high"] == 1.02
    text = seeds.readme(summary)
    assert text.startswith("**Answer: over 3 seeds")
    assert "f-80-8 0.900 [0.850-0.950]" in text
    assert "on 0 of 1 families" in text  # one seed's upper end is above 1
    assert "the mean over seeds at most 0.90 on 1 of 1" in text
    assert "| f-80-8 | `dreamshard_cut` / torchrec_peer | 0.850 [0.80, 0.95] | 0.900 [0.85, 0.99] |" in text


def test_a_work_folder_that_is_not_a_clone_is_refused_never_overwritten(tmp_path):
    (tmp_path / "seed-0").mkdir()
    (tmp_path / "seed-0" / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit, match="exists and is not a clone"):
        seeds.prepare(tmp_path / "seed-0", seeds.git("rev-parse", "HEAD"), 0)
    assert (tmp_path / "seed-0" / "keep.txt").read_text() == "mine"
