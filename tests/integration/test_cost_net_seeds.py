"""experiments/cost_net_seeds.py: the cost network fitted as train_cost fits it, over seeds and variants."""
from __future__ import annotations

import json

import pytest

from experiments import cost_net_seeds


def test_the_stage_seed_gives_the_stages_own_held_out_figures_and_variants_change_them(costed_project, tmp_path,
                                                                                       monkeypatch):
    root, params = costed_project
    monkeypatch.chdir(tmp_path)  # --root, not the working folder, locates the project
    out = tmp_path / "seeds.json"
    lr = json.dumps({"params": {"train_cost": {"lr": 0.05}}})
    no_single = json.dumps({"params": {"train_cost": {"device_data": False}}, "widths": {"embed": 16}})
    assert cost_net_seeds.main(["--root", str(root), "--seeds", "2", "--variant", f"lr={lr}",
                                "--variant", f"bare={no_single}", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    stage = json.loads((root / params["paths"]["cost_model_metrics"]).read_text())["held_out"]
    assert params["train_cost"]["seed"] == 0 and result["held_out_plans"] == stage["num_plans"]
    first = result["variants"]["params"]["per_seed"][0]  # the stage's seed, the stage's split: its own figures
    for key in cost_net_seeds.METRICS:
        assert first[key] == pytest.approx(stage[key], rel=1e-6)
    per = {name: v["per_seed"] for name, v in result["variants"].items()}
    assert [r["seed"] for r in per["params"]] == [0, 1] and per["params"][0] != per["params"][1]
    assert per["lr"][0] != per["params"][0] and per["bare"][0] != per["params"][0]
    assert result["variants"]["bare"]["single_devices"] == 0 < result["variants"]["params"]["single_devices"]
    s = result["variants"]["params"]["summary"]["plan_device_max_kendall_tau"]
    assert s["min"] <= s["mean"] <= s["max"]


def test_a_variant_naming_what_params_lack_is_an_error_naming_it(costed_project, capsys):
    root, _ = costed_project
    bad = json.dumps({"params": {"train_cost": {"learning_rate": 0.01}}})
    assert cost_net_seeds.main(["--root", str(root), "--seeds", "1", "--variant", f"x={bad}"]) == 1
    assert "params.train_cost.learning_rate: not in params.yaml" in capsys.readouterr().err
    wide = json.dumps({"widths": {"depth": 3}})
    assert cost_net_seeds.main(["--root", str(root), "--seeds", "1", "--variant", f"x={wide}"]) == 1
    assert "unknown key(s) depth" in capsys.readouterr().err
    split = json.dumps({"params": {"train_cost": {"holdout_fraction": 0.25}}})
    assert cost_net_seeds.main(["--root", str(root), "--seeds", "1", "--variant", f"x={split}"]) == 1
    assert "--variant x: sets train_cost.holdout_fraction, which every variant shares" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cost_net_seeds.main(["--root", str(root), "--variant", "x={not json"])
    assert "--variant x: not JSON" in capsys.readouterr().err
