"""benchmarks.model_ab's summary: per family, each group's cost over the best rival and the paired A / B."""
from __future__ import annotations

import pytest

from benchmarks.model_ab import group_rows


def row(split, family, a, b, best=2.0):
    return {"split": split, "task": f"{split}/{family}", "family": family, "best_rival_ms": best,
            "cost_ms": {"A0": a[0], "A1": a[1], "B0": b[0], "B1": b[1]}}


def test_groups_average_their_models_and_pair_a_with_b_per_task():
    rows = [row("test", "f1", (1.8, 2.2), (2.0, 2.0)),   # A 1.00, B 1.00 of the best rival
            row("test", "f1", (1.0, 1.0), (2.0, 2.0)),   # A 0.50, B 1.00
            row("test", "f2", (1.5, 1.5), (1.5, 1.5)),
            row("train", "f1", (3.0, 3.0), (2.0, 2.0))]
    out = group_rows(rows, ["A0", "A1"], ["B0", "B1"], seed=0)
    assert set(out) == {"f1", "f2", "test", "train:f1"}
    f1 = out["f1"]
    assert f1["tasks"] == 2 and f1["a_over_best_rival"] == pytest.approx(0.75) and f1["b_over_best_rival"] == 1.0
    assert f1["models_over_best_rival"] == pytest.approx({"A0": 0.7, "A1": 0.8, "B0": 1.0, "B1": 1.0})
    assert f1["a_over_b"] == pytest.approx(0.75) and f1["a_over_b_ci"] == pytest.approx([0.5, 1.0])
    assert out["test"]["tasks"] == 3 and out["test"]["a_over_b"] == pytest.approx((1.0 + 0.5 + 1.0) / 3)
    assert out["train:f1"]["a_over_b"] == pytest.approx(1.5) and out["train:f1"]["a_over_b_ci"] == [1.5, 1.5]
