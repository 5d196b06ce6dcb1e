"""experiments.device_error: a cost network's error on single devices, bucketed by how many tables they hold."""
from __future__ import annotations

import numpy as np
import pytest

from experiments.device_error import bucket_errors, main


def test_devices_are_bucketed_by_table_count_with_their_mape_and_signed_error():
    tables = np.array([1, 3, 5, 6, 10, 12])
    measured = np.array([1.0, 2.0, 4.0, 1.0, 2.0, 3.0])
    predicted = measured * np.array([1.1, 0.9, 1.0, 0.5, 0.7, 1.3])
    out = bucket_errors(tables, predicted, measured, width=5)
    assert list(out) == ["1-5", "6-10", "11-15"]
    assert out["1-5"]["devices"] == 3 and out["1-5"]["mape"] == pytest.approx(0.2 / 3)
    assert out["1-5"]["median_signed"] == pytest.approx(0.0)
    assert out["6-10"] == {"devices": 2, "mape": pytest.approx(0.4), "median_signed": pytest.approx(-0.4)}
    assert out["11-15"]["median_signed"] == pytest.approx(0.3)


def test_score_without_devices_or_checkpoints_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        main(["score", "models/cost_net.pt"])
    assert "score needs --devices and at least one checkpoint" in capsys.readouterr().err


def test_pools_other_than_train_and_test_are_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        main(["measure", "--out", "x.parquet", "--pools", "train,valid"])
    assert "--pools: expected test and/or train, got 'train,valid'" in capsys.readouterr().err
