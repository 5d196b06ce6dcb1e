"""experiments/cost_net.py: the cost network fitted as train_cost fits it over seeds and variants, its error on
single devices bucketed by table count, and the held-out plans measured again beside its predictions."""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import yaml

from experiments import cost_net


@pytest.fixture(autouse=True)
def allocator_setting_restored(monkeypatch):
    """Each study, a program, sets the allocator variable from params before torch starts: undone after each
    test, so the rest of the suite's process keeps its own setting."""
    from dreamshard.hardware.allocator import HUGE_PAGES_ENV

    monkeypatch.setenv(HUGE_PAGES_ENV, os.environ.get(HUGE_PAGES_ENV, "0"))


def test_a_missing_or_unknown_subcommand_is_a_usage_error_naming_them(capsys):
    for argv in ([], ["device_error"]):
        with pytest.raises(SystemExit):
            cost_net.main(argv)
        assert "seeds,device-error,remeasure" in capsys.readouterr().err


# ------------------------------------------------------------------ seeds

def test_the_stage_seed_gives_the_stages_own_held_out_figures_and_variants_change_them(costed_project, tmp_path,
                                                                                       monkeypatch):
    root, params = costed_project
    monkeypatch.chdir(tmp_path)  # --root, not the working folder, locates the project
    out = tmp_path / "seeds.json"
    lr = json.dumps({"params": {"train_cost": {"lr": 0.05}}})
    no_single = json.dumps({"params": {"train_cost": {"device_data": False}}, "widths": {"embed": 16}})
    assert cost_net.main(["seeds", "--root", str(root), "--seeds", "2", "--variant", f"lr={lr}",
                          "--variant", f"bare={no_single}", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    stage = json.loads((root / params["paths"]["cost_model_metrics"]).read_text())["held_out"]
    assert params["train_cost"]["seed"] == 0 and result["held_out_plans"] == stage["num_plans"]
    first = result["variants"]["params"]["per_seed"][0]  # the stage's seed, the stage's split: its own figures
    for key in cost_net.METRICS:
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
    assert cost_net.main(["seeds", "--root", str(root), "--seeds", "1", "--variant", f"x={bad}"]) == 1
    assert "params.train_cost.learning_rate: not in params.yaml" in capsys.readouterr().err
    wide = json.dumps({"widths": {"depth": 3}})
    assert cost_net.main(["seeds", "--root", str(root), "--seeds", "1", "--variant", f"x={wide}"]) == 1
    assert "unknown key(s) depth" in capsys.readouterr().err
    split = json.dumps({"params": {"train_cost": {"holdout_fraction": 0.25}}})
    assert cost_net.main(["seeds", "--root", str(root), "--seeds", "1", "--variant", f"x={split}"]) == 1
    assert "--variant x: sets train_cost.holdout_fraction, which every variant shares" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cost_net.main(["seeds", "--root", str(root), "--variant", "x={not json"])
    assert "--variant x: not JSON" in capsys.readouterr().err


# ------------------------------------------------------------------ device-error

def test_devices_are_bucketed_by_table_count_with_their_mape_and_signed_error():
    tables = np.array([1, 3, 5, 6, 10, 12])
    measured = np.array([1.0, 2.0, 4.0, 1.0, 2.0, 3.0])
    predicted = measured * np.array([1.1, 0.9, 1.0, 0.5, 0.7, 1.3])
    out = cost_net.bucket_errors(tables, predicted, measured, width=5)
    assert list(out) == ["1-5", "6-10", "11-15"]
    assert out["1-5"]["devices"] == 3 and out["1-5"]["mape"] == pytest.approx(0.2 / 3)
    assert out["1-5"]["median_signed"] == pytest.approx(0.0)
    assert out["6-10"] == {"devices": 2, "mape": pytest.approx(0.4), "median_signed": pytest.approx(-0.4)}
    assert out["11-15"]["median_signed"] == pytest.approx(0.3)


def test_score_without_devices_or_checkpoints_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        cost_net.main(["device-error", "score", "models/cost_net.pt"])
    assert "score needs --devices and at least one checkpoint" in capsys.readouterr().err


def test_pools_other_than_train_and_validation_are_a_usage_error(capsys):
    """The test pool among them: design never reads it."""
    for pools in ("train,valid", "test"):
        with pytest.raises(SystemExit):
            cost_net.main(["device-error", "measure", "--out", "x.parquet", "--pools", pools])
        assert f"--pools: expected validation and/or train, got '{pools}'" in capsys.readouterr().err


# ------------------------------------------------------------------ remeasure

def test_a_deterministic_backend_repeats_exactly_and_the_network_scores_as_train_cost_scored_it(costed_project, tmp_path,
                                                                                              monkeypatch):
    """The analytic backend gives the same costs every time: every pass equals the collected plans (tau 1, no
    error); the network's figures against the collected plans are train_cost's own, and against each pass the same."""
    root, params = costed_project
    monkeypatch.chdir(tmp_path)  # --root, not the working folder, locates the project
    out, rows = tmp_path / "remeasure.json", tmp_path / "rows.parquet"
    assert cost_net.main(["remeasure", "--root", str(root), "--passes", "2", "--out", str(out), "--rows", str(rows)]) == 0
    result = json.loads(out.read_text())
    stage = json.loads((root / params["paths"]["cost_model_metrics"]).read_text())["held_out"]
    assert result["plans"] == stage["num_plans"] and result["devices"] == stage["num_devices"]
    assert result["backend"] == "analytic" and result["measured"] is False and len(result["passes"]) == 2
    for a in result["pass_vs_collected"] + result["pass_vs_previous_pass"]:
        assert a["plan_kendall_tau"] == pytest.approx(1.0)
        assert a["plan_mape"] == pytest.approx(0.0, abs=1e-9) and a["device_compute_mape"] == pytest.approx(0.0, abs=1e-9)
        assert a["plan_median_ratio"] == pytest.approx(1.0)
    net = result["network"]
    assert net["vs_collected"]["plan_kendall_tau"] == pytest.approx(stage["plan_device_max_kendall_tau"], rel=1e-6)
    assert net["vs_collected"]["plan_mape"] == pytest.approx(stage["plan_device_max_mape"], rel=1e-6)
    assert net["vs_collected"]["device_compute_mape"] == pytest.approx(stage["device_compute_mape"], rel=1e-6)
    for a in net["vs_pass"] + [net["vs_mean_of_measurements"]]:
        assert a == pytest.approx(net["vs_collected"])
    frame = pd.read_parquet(rows)  # every pass's plan rows, as collect writes them
    collected = pd.read_parquet(root / params["paths"]["costs"] / "plans.parquet").set_index("plan_id")
    assert sorted(frame["pass"].unique()) == [0, 1] and len(frame) == 2 * result["plans"]
    assert frame["cost_ms"].to_numpy() == pytest.approx(collected.loc[frame["plan_id"], "cost_ms"].to_numpy())


def test_a_checkpoint_that_learned_from_the_held_out_plans_is_not_scored_on_them(costed_project, tmp_path):
    root, params = costed_project
    other = tmp_path / "project"
    other.mkdir()
    changed = json.loads(json.dumps(params))
    changed["train_cost"]["learn_from_held_out"] = True
    (other / "params.yaml").write_text(yaml.safe_dump(changed))  # the same (absolute) data paths
    out = tmp_path / "remeasure.json"
    assert cost_net.main(["remeasure", "--root", str(other), "--passes", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["network"] is None and result["pass_vs_previous_pass"] == []


def test_plans_of_tasks_the_project_lacks_are_an_error_naming_the_file(costed_project, tmp_path, capsys):
    root, params = costed_project
    other = tmp_path / "project"
    other.mkdir()
    changed = json.loads(json.dumps(params))
    plans = pd.read_parquet(root / params["paths"]["costs"] / "plans.parquet")
    plans["task_id"] = "train/nowhere/0000"
    costs = tmp_path / "costs"
    costs.mkdir()
    plans.to_parquet(costs / "plans.parquet")
    pd.read_parquet(root / params["paths"]["costs"] / "devices.parquet").to_parquet(costs / "devices.parquet")
    changed["paths"]["costs"] = str(costs)
    (other / "params.yaml").write_text(yaml.safe_dump(changed))
    assert cost_net.main(["remeasure", "--root", str(other), "--passes", "1"]) == 1
    err = capsys.readouterr().err
    assert "plans.parquet" in err and "train/nowhere/0000" in err
