"""benchmarks/mlperf_dcnv2.py on roomy ranks (no table cut: seconds): every planner's row, TorchRec's judgement."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torchrec", reason="torchrec is not installed")

from benchmarks import mlperf_dcnv2  # noqa: E402


def test_rows_are_judged_by_torchrec_and_written(tmp_path, monkeypatch):
    monkeypatch.setattr(mlperf_dcnv2, "OURS", ("size_greedy", "dreamshard"))
    out = tmp_path / "out"
    assert mlperf_dcnv2.main(["--out", str(out), "--batch-sizes", "512", "--hbm-gib", "64", "--time-limit", "120"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (run,) = summary["runs"]
    rows = {r["planner"]: r for r in run["rows"]}
    assert set(rows) == {"torchrec", "torchrec min_partition=64", "size_greedy", "dreamshard"}
    assert rows["dreamshard"]["skipped"].startswith("no checkpoint")  # no --models: said, not hidden
    ours = rows["size_greedy"]
    assert ours["fits_usable"] and 0 < ours["busiest_hbm_gib"] <= ours["usable_hbm_gib"] < 64
    assert ours["max_rank_perf_ms"] > 0 and ours["speedup_vs_torchrec"] > 0
    assert rows["torchrec"]["speedup_vs_torchrec"] == 1.0
    text = (out / "README.md").read_text()
    assert "| size_greedy |" in text and "not a measurement" in text
