"""benchmarks/dmp_fidelity.py: its numbers on hand-made inputs, and its smoke run end to end (two gloo ranks
running TorchRec's DistributedModelParallel, our backend on the same plans), written outside the repo."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from benchmarks import dmp_fidelity as dmpf
from helpers import PROJECT_ROOT as ROOT

# ---------------------------------------------------------------- the numbers


def test_the_link_fit_recovers_latency_and_bandwidth():
    sizes = [1024, 65536, 1 << 20, 4 << 20]
    ms = [0.05 + b / 2e9 * 1e3 for b in sizes]  # 50 us + 2 GB/s
    fit = dmpf.fit_link(sizes, ms)
    assert fit["latency_us"] == pytest.approx(50.0, rel=1e-6) and fit["gbps"] == pytest.approx(2.0, rel=1e-6)
    assert fit["r2"] == pytest.approx(1.0)
    # a negative intercept is held at 0, the line through the origin
    held = dmpf.fit_link([1000, 2000, 3000], [0.0009, 0.0021, 0.0030])
    assert held["latency_us"] == 0.0 and held["gbps"] == pytest.approx(1.0, rel=0.05)
    with pytest.raises(ValueError, match="do not grow"):
        dmpf.fit_link([1000, 2000], [0.5, 0.4])


def test_tau_is_that_of_the_two_orderings_and_pooled_by_pairs():
    assert dmpf.task_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert dmpf.task_tau([1, 2, 3], [30, 20, 10]) == -1.0
    assert dmpf.task_tau([1, 2, 3], [10, 30, 20]) == pytest.approx(1 / 3)  # one pair of three swapped
    assert math.isnan(dmpf.task_tau([1], [2]))
    # 3 plans (6 ordered pairs, tau -1/3) and 2 plans (2 pairs, tau 1): (-2 + 2) / 8
    assert dmpf.pooled_tau([([1, 2, 3], [20, 30, 10]), ([1, 2], [5, 6])]) == pytest.approx(0.0)
    assert dmpf.pooled_tau([([1, 2, 3], [1, 2, 3]), ([1], [1])]) == 1.0  # a task of one plan has no pairs


def test_dmps_split_tau_orders_its_even_rounds_against_its_odd_ones():
    # plan a's even rounds 1, 1 and odd rounds 5; b's 2, 2 and 1; c's 3 and 3: evens order a < b < c, odds b < c < a
    readings = [[1.0, 5.0, 1.0], [2.0, 1.0, 2.0], [3.0, 3.0]]
    assert dmpf.split_tau(readings) == pytest.approx(dmpf.task_tau([1, 2, 3], [5, 1, 3]))
    assert dmpf.split_tau([[1.0, 1.0], [2.0, 2.0]]) == 1.0
    assert math.isnan(dmpf.split_tau([[1.0], [2.0]]))  # one round: no halves
    assert math.isnan(dmpf.split_tau([[1.0, 2.0]]))  # one plan: no pairs


def test_our_best_plan_against_torchrecs_in_both_worlds():
    names = ["size_greedy", "random", "lookup_greedy=dim_greedy", "torchrec_full"]
    ours = [8.0, 1.0, 9.0, 10.0]  # random is cheapest but not ours: size_greedy is our best
    dmp = [30.0, 10.0, 35.0, 40.0]
    v = dmpf.best_vs_torchrec(names, ours, dmp)
    assert v["ours"] == "size_greedy" and v["torchrec"] == "torchrec_full"
    assert v["ratio_our_cost"] == pytest.approx(0.8) and v["ratio_dmp"] == pytest.approx(0.75)
    assert v["claims_win"] and v["dmp_agrees"] is True
    v = dmpf.best_vs_torchrec(names, ours, [50.0, 10.0, 35.0, 40.0])  # DMP has ours dearer: the sign disagrees
    assert v["claims_win"] and v["dmp_agrees"] is False
    v = dmpf.best_vs_torchrec(names, [9.5, 1.0, 9.9, 10.0], dmp)  # 5% cheaper: no claim
    assert not v["claims_win"] and v["dmp_agrees"] is None
    # torchrec where torchrec_full did not plan; nothing to compare without TorchRec's plan
    assert dmpf.best_vs_torchrec(["size_greedy", "torchrec"], [1.0, 2.0], [1.0, 2.0])["torchrec"] == "torchrec"
    assert dmpf.best_vs_torchrec(["size_greedy", "dim_greedy"], [1.0, 2.0], [1.0, 2.0]) is None


def test_disagreements_are_the_pairs_ordered_the_other_way():
    names = ["a", "b", "c"]
    found = dmpf.disagreements(names, [1.0, 2.0, 3.0], [10.0, 30.0, 20.0])
    assert found == [{"cheaper_by_our_cost": "b", "cheaper_by_dmp": "c", "our_gap": pytest.approx(0.5),
                      "dmp_gap": pytest.approx(0.5)}]
    assert dmpf.disagreements(names, [1.0, 2.0, 3.0], [10.0, 30.0, 20.0], min_gap=0.6) == []
    assert dmpf.disagreements(names, [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == []


# ---------------------------------------------------------------- the smoke run


@pytest.mark.slow  # 10-30 s on 2 cores: two gloo ranks that import TorchRec, and the backend's kernels
def test_smoke_run_times_every_plan_in_dmp_and_by_our_cost(tmp_path):
    pytest.importorskip("torchrec", reason="torchrec is not installed")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path / "out"
    kept = ROOT / "results" / "dmp-fidelity"
    before = {p.name: p.stat().st_mtime_ns for p in kept.iterdir()} if kept.exists() else None
    # the link given, not fitted: a loaded machine's all-to-all times need not grow with the bytes (fit_link is
    # tested on its own above)
    res = subprocess.run([sys.executable, "-m", "benchmarks.dmp_fidelity", "--smoke", "--out", str(out),
                          "--link", "100,2", "--iterations", "3"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["smoke"] and summary["run"]["settings"]["batch"] == 32
    assert summary["run"]["settings"]["iterations"] == 3 and math.isnan(summary["dmp_split_tau"])  # 1 round
    assert len(summary["tasks"]) == 2
    for row in summary["tasks"]:
        assert row["task"].startswith("train/")  # the training pool's tables only
        assert 0.5 <= row["fill"] <= 0.85 and 4 <= row["tables"] <= 6
        assert 2 <= len(row["plans"]) <= 3 and not row["failed"]
        sharders = [n for p in row["plans"] for n in p["sharder"].split("=")]
        assert sorted(sharders) == sorted(dmpf.SMOKE_SHARDERS)
        for p in row["plans"]:
            assert p["our_cost_ms"] > 0 and p["dmp_ms"] > 0 and len(p["dmp_ms_rounds"]) == 1
            assert p["our_comm_ms"] > 0  # the all-to-all over the fitted link
        link = row["link"]
        assert (link["latency_us"], link["gbps"], link["given"]) == (100.0, 2.0, True)
        assert link["bytes"] == list(dmpf.SMOKE_FIT_BYTES) and len(link["ms"]) == 3
        # tau is that of the two orderings of the task's plans
        want = dmpf.task_tau([p["our_cost_ms"] for p in row["plans"]], [p["dmp_ms"] for p in row["plans"]])
        assert row["tau"] == pytest.approx(want)
        assert row["vs_torchrec"]["torchrec"] == "torchrec_full"
    assert set(summary["criteria"]) >= {"tasks", "min_plans", "pooled_tau", "claims", "claims_dmp_agrees", "met"}
    assert summary["criteria"]["met"] is False  # 2 tasks are below the bar, whatever tau
    readme = (out / "README.md").read_text()
    assert readme.startswith("**Answer: not settled") and "commit" in readme and "cores" in readme
    assert (out / "dmp_fidelity.png").read_bytes()[:4] == b"\x89PNG"
    # its outputs went to --out alone: nothing in the repo's results folder
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "dmp_fidelity.png", "summary.json"]
    assert before == ({p.name: p.stat().st_mtime_ns for p in kept.iterdir()} if kept.exists() else None)
