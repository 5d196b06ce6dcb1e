"""experiments/remeasure.py: the held-out plans measured again, beside the cost network's predictions of them."""
from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import yaml

from experiments import remeasure


@pytest.fixture(autouse=True)
def allocator_setting_restored(monkeypatch):
    """The benchmark, a program, sets the allocator variable from params before torch starts: undone after each
    test, so the rest of the suite's process keeps its own setting."""
    from dreamshard.allocator import HUGE_PAGES_ENV

    monkeypatch.setenv(HUGE_PAGES_ENV, os.environ.get(HUGE_PAGES_ENV, "0"))


def test_a_deterministic_backend_repeats_exactly_and_the_network_scores_as_train_cost_scored_it(costed_project, tmp_path,
                                                                                              monkeypatch):
    """The analytic backend gives the same costs every time: every pass equals the collected plans (tau 1, no
    error); the network's figures against the collected plans are train_cost's own, and against each pass the same."""
    root, params = costed_project
    monkeypatch.chdir(tmp_path)  # --root, not the working folder, locates the project
    out, rows = tmp_path / "remeasure.json", tmp_path / "rows.parquet"
    assert remeasure.main(["--root", str(root), "--passes", "2", "--out", str(out), "--rows", str(rows)]) == 0
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
    assert remeasure.main(["--root", str(other), "--passes", "1", "--out", str(out)]) == 0
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
    assert remeasure.main(["--root", str(other), "--passes", "1"]) == 1
    err = capsys.readouterr().err
    assert "plans.parquet" in err and "train/nowhere/0000" in err
