"""Tools that summarise kept runs, on the runs they were made for: tools/gpu_uvm.py's smoke path on CPU (its CUDA
rows need a GPU: results/gpu/), tools/journal_summary.py on the journal an H200 run left (b65536_peer), and
benchmarks/pool_tasks.py on the paper-scale passes of dlrm-80-4."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tools import gpu_uvm, journal_summary

H200_JOURNAL = Path("results/gpu/b65536_peer/eval_journal")


def test_uvm_check_smoke_on_cpu_writes_its_rows_with_provenance(tmp_path):
    gpu_uvm.main(["--out", str(tmp_path), "--device", "cpu", "--factors", ",", "--batch", "128", "--rows", "5000",
                  "--batches", "2", "--alphas", "0.6,1.2"])
    record = json.loads((tmp_path / "uvm.json").read_text())
    assert record["batch"] == 128 and record["torch"] and record["fbgemm_gpu"] and "gpu_uvm" in record["command"]
    assert [r["alpha"] for r in record["rows"]] == [0.6, 1.2]
    for row in record["rows"]:  # HBM only on CPU: each row is its own reference
        assert row["load_factor"] is None and row["fixed_over_hbm"] == row["rotating_over_hbm"] == 1.0
        assert row["fixed_ms"] > 0 and math.isfinite(row["rotating_ms"])


def test_uvm_check_refuses_cached_rows_on_cpu(tmp_path):
    with pytest.raises(SystemExit):
        gpu_uvm.main(["--out", str(tmp_path), "--device", "cpu", "--factors", "0.1"])
    assert not (tmp_path / "uvm.json").exists()


def test_journal_summary_reports_the_journaled_tasks_with_the_stages_paired_ratios(tmp_path):
    journal_summary.main([str(H200_JOURNAL), str(tmp_path)])
    metrics = json.loads((tmp_path / "eval_partial.json").read_text())
    rows = pd.concat([pd.read_parquet(f) for f in sorted(H200_JOURNAL.glob("task-*.parquet"))])
    assert metrics["device"] == ["NVIDIA H200"] and metrics["measured"]
    assert metrics["tasks"]["test/dlrm-80-16"] == 3 and metrics["tasks"]["test/dlrm-20-4"] == 2
    assert not any(k.startswith("train/") for k in metrics["tasks"])  # the run evaluated no training task
    # the paired ratio is the mean over tasks of cost / torchrec_full's cost on the same task
    test = rows[(rows["split"] == "test") & (rows["family"] == "dlrm-80-8")].pivot(index="task", columns="algorithm",
                                                                                  values="cost_ms")
    expected = (test["dreamshard_cut"] / test["torchrec_full"]).mean()
    got = metrics["families"]["dlrm-80-8"]["dreamshard_cut"]["vs_torchrec_full"]
    assert got["mean_ratio"] == pytest.approx(expected) and got["ci_low"] <= expected <= got["ci_high"]
    assert (tmp_path / "eval_cost_ratio.png").stat().st_size > 0
    assert set(pd.read_csv(tmp_path / "eval_cost_ratio.csv")["family"]) >= {"dlrm-20-4", "dlrm-80-16"}


def test_journal_summary_pools_every_family_against_its_own_torchrec_peer(tmp_path):
    """The H200 run with TorchRec told the cluster: per family the peer is the TorchRec planner of lowest mean cost;
    `pooled` pairs every test task with its own family's peer."""
    journal = H200_JOURNAL
    journal_summary.main([str(journal), str(tmp_path), "--name", "eval_summary.json"])
    metrics = json.loads((tmp_path / "eval_summary.json").read_text())
    rows = pd.concat([pd.read_parquet(f) for f in sorted(journal.glob("task-*.parquet"))])
    costs = rows.pivot(index="task", columns="algorithm", values="cost_ms")
    family = rows.groupby("task")["family"].first()
    means = rows.groupby(["family", "algorithm"])["cost_ms"].mean().unstack()
    peer = {f: means.loc[f, ["torchrec", "torchrec_full"]].idxmin() for f in means.index}
    assert {f: metrics["families"][f]["torchrec_peer"] for f in peer} == peer
    expected = (costs["dreamshard_cut"] / [costs.loc[t, peer[family[t]]] for t in costs.index]).mean()
    got = metrics["pooled"]["dreamshard_cut"]["vs_torchrec_peer"]
    assert got["tasks"] == 12 and got["mean_ratio"] == pytest.approx(expected)
    assert got["ci_low"] <= expected <= got["ci_high"]
    # what results/gpu/README.md quotes is what the journal gives
    kept = json.loads(Path("results/gpu/b65536_peer/eval_summary.json").read_text())
    assert kept["pooled"] == metrics["pooled"] and kept["families"] == metrics["families"]


def test_journal_summary_names_a_folder_without_task_files(tmp_path):
    shutil.copytree(H200_JOURNAL, tmp_path / "j", ignore=shutil.ignore_patterns("task-*"))
    with pytest.raises(SystemExit, match="no task-"):
        journal_summary.main([str(tmp_path / "j"), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_rotating_batches_split_one_draw_unless_asked_for_a_draw_each():
    """`one`: consecutive slices of one draw (the same hot rows, as a job's steps); `seeds`: a draw per batch."""
    import numpy as np

    from dreamshard.data.dlrm import TableProfile, generate_lookups

    profile = TableProfile(50_000, 5.0, 1.2)
    split = gpu_uvm.batches_of(generate_lookups, profile, 256, 4, "one")
    whole_idx, whole_len = generate_lookups(profile, 4 * 256, 0)
    assert [len(lengths) for _, lengths in split] == [256] * 4
    assert all(int(lengths.sum()) == len(idx) for idx, lengths in split)
    assert np.array_equal(np.concatenate([i for i, _ in split]), whole_idx)
    assert np.array_equal(np.concatenate([n for _, n in split]), whole_len)
    seeded = gpu_uvm.batches_of(generate_lookups, profile, 256, 4, "seeds")
    assert all(np.array_equal(i, generate_lookups(profile, 256, s)[0]) for s, (i, _) in enumerate(seeded))

    def hottest(idx):
        values, counts = np.unique(idx, return_counts=True)
        return int(values[counts.argmax()])

    # one draw keeps the hottest row where it is; a new seed scatters the ranks anew
    assert hottest(split[0][0]) == hottest(split[3][0])
    assert hottest(seeded[0][0]) != hottest(seeded[3][0])


PAPER_80_4 = [Path("results/cut_designs/paper-2026-11-27/80-4-first20"), Path("results/cut_designs/paper-2026-11-27/80-4-next20")]


def test_pooled_tasks_give_the_mean_of_every_tasks_paired_ratio(tmp_path):
    from benchmarks import pool_tasks

    pool_tasks.main([*map(str, PAPER_80_4), "--out", str(tmp_path)])
    pooled = json.loads((tmp_path / "pooled.json").read_text())["families"]["dlrm-80-4"]
    rows = pd.concat([pd.read_csv(d / "tasks.csv") for d in PAPER_80_4]).pivot(index="task", columns="sharder",
                                                                               values="cost_ms")
    ratios = rows["params"] / rows["torchrec_full"]
    assert pooled["params"]["tasks"] == 40 == len(ratios)
    assert pooled["params"]["mean"] == pytest.approx(ratios.mean())
    assert pooled["params"]["ci_low"] < ratios.mean() < pooled["params"]["ci_high"]
    assert pooled["torchrec_full"]["mean"] == 1.0


def test_pooling_a_run_twice_is_refused(tmp_path):
    from benchmarks import pool_tasks

    with pytest.raises(SystemExit, match="more than one run"):
        pool_tasks.main([str(PAPER_80_4[1]), str(PAPER_80_4[1]), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
