"""dreamshard.project.model_error: each cost model's error on measured plans, per family, against oracles: rows
whose "measured" cost is the model's own estimate (no error, tau 1) or its reverse ranking (tau -1)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_fallback import MEMORY, training_tables, untrained_model

from dreamshard.plan import Plan
from dreamshard.project.model_error import learned_estimates, model_error, plan_of_row, torchrec_estimates
from dreamshard.tasks import Task


def tasks_and_plans() -> list[tuple[Task, list[Plan]]]:
    out = []
    for k in range(2):
        tables = training_tables()[6 * k:6 * k + 6]
        task = Task.uniform(f"test/f/{k:04d}", tables, 3, 1.0, MEMORY, "f")
        plans = [Plan.from_assignment(task, a) for a in ([0, 1, 2, 0, 1, 2], [0, 0, 1, 1, 2, 2], [0, 0, 0, 1, 1, 2],
                                                         [2, 1, 0, 0, 1, 2])]
        out.append((task, plans))
    return out


def rows(estimate, sign: float = 1.0) -> pd.DataFrame:
    return pd.DataFrame([{"task": task.name, "family": task.family, "shards": json.dumps(p.to_dict()["shards"]),
                          "cost_ms": estimate(task, p) if sign > 0 else 100.0 - estimate(task, p)}
                         for task, plans in tasks_and_plans() for p in plans])


def test_a_model_rating_its_own_estimates_has_no_error_and_ranks_them_exactly():
    est = learned_estimates(untrained_model())["cost_network"]
    tasks = [t for t, _ in tasks_and_plans()]
    same = model_error(rows(est), tasks, {"cost_network": est})["f"]["cost_network"]
    assert same["mape"] == pytest.approx(0.0, abs=1e-9) and same["tau"] == pytest.approx(1.0)
    assert same["bias"] == pytest.approx(0.0, abs=1e-9)
    assert (same["plans"], same["tasks_ranked"]) == (8, 2)
    reverse = model_error(rows(est, -1.0), tasks, {"cost_network": est})["f"]["cost_network"]
    assert reverse["tau"] == pytest.approx(-1.0) and reverse["mape"] > 0.5
    frame = rows(est)
    task, plans = tasks_and_plans()[0]
    assert plan_of_row(next(frame.itertuples()), task) == plans[0]


def test_torchrec_estimates_are_torchrec_ratings_and_calibration_scales_compute():
    pytest.importorskip("torchrec")
    from dreamshard.interop.calibration import PerfCalibration
    from dreamshard.interop.torchrec import torchrec_batch, torchrec_perf_estimate

    task, plans = tasks_and_plans()[0]
    plain = torchrec_estimates(512, None, None)
    assert plain(task, plans[0]) == pytest.approx(torchrec_perf_estimate(task, plans[0], torchrec_batch(task, 512)).cost_ms)
    est = torchrec_perf_estimate(task, plans[0], torchrec_batch(task, 512))
    tripled = PerfCalibration((("table_wise", 3.0),), (("table_wise", 3.0),), 1, 0.0, 0.0)
    compute = np.array([b["fwd_compute"] + b["bwd_compute"] for b in est.rank_breakdown_ms])
    expected = max(r + 2 * c for r, c in zip(est.rank_ms, compute))
    assert torchrec_estimates(512, None, None, tripled)(task, plans[0]) == pytest.approx(expected, rel=1e-6)


def test_a_blend_recovers_the_weights_of_costs_made_from_its_two_models():
    """fitted_blend's oracle: "measured" costs exactly exp(0.1) x first^0.7 x second^0.2 give those weights back."""
    from dreamshard.project.model_error import fitted_blend

    def first(task, plan):
        return 1.0 + len({s.device for s in plan.shards}) + 0.1 * sum(s.device * s.width for s in plan.shards)

    def second(task, plan):
        return 2.0 + sum((s.device + 1) ** 2 for s in plan.shards)

    made = rows(lambda t, p: float(np.exp(0.1) * first(t, p) ** 0.7 * second(t, p) ** 0.2))
    blend, weights = fitted_blend(made, [t for t, _ in tasks_and_plans()], first, second)
    assert weights == pytest.approx((0.1, 0.7, 0.2), abs=1e-6)
    task, plans = tasks_and_plans()[0]
    assert blend(task, plans[1]) == pytest.approx(made["cost_ms"].iloc[1], rel=1e-6)


def test_another_folders_models_rate_plans_as_they_do_loaded_there(tmp_path):
    """learned_estimates_of (tools.model_error --also): the checkpoints at another project folder's model paths
    (relative to it) rate a plan exactly as those models do; a folder without them fails, naming the file."""
    from dataclasses import replace

    import torch
    import yaml

    from dreamshard.learning.cost_model import CostNetConfig
    from dreamshard.learning.neuroshard import CommNetConfig, NeuroShardModel
    from dreamshard.project.model_error import learned_estimates_of

    model = replace(untrained_model(), meta={"algorithm": "dreamshard"})
    gen = torch.Generator().manual_seed(1)
    neuro = NeuroShardModel(CostNetConfig().build(gen), CommNetConfig().build(gen), model.scaler, {})
    paths = {"dreamshard_model": "m/ds.pt", "neuroshard_model": "m/ns.pt", "autoshard_model": "m/a.pt",
             "rnn_model": "m/r.pt"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"paths": paths}))
    (tmp_path / "m").mkdir()
    model.save(tmp_path / "m/ds.pt")
    neuro.save(tmp_path / "m/ns.pt")
    rated = learned_estimates_of(tmp_path)
    expected = learned_estimates(model, neuro)
    assert set(rated) == {"cost_network", "neuroshard"}
    for task, plans in tasks_and_plans():
        for p in plans:
            assert rated["cost_network"](task, p) == pytest.approx(expected["cost_network"](task, p))
            assert rated["neuroshard"](task, p) == pytest.approx(expected["neuroshard"](task, p))
    (tmp_path / "m/ns.pt").unlink()
    with pytest.raises(Exception, match="ns.pt"):
        learned_estimates_of(tmp_path)
