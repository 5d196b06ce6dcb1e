"""Access-count bins estimated under one fitted Zipf exponent (dreamshard.data.bins), and the learned
sharders planning tables without histograms."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from dreamshard.data.bins import (
    META_KEY,
    BinEstimator,
    BinFitConfig,
    expected_bins,
    fit_tables_file,
    rank_groups,
    task_with_estimated_bins,
)
from dreamshard.data.dlrm import TableProfile, generate_lookups, table_statistics
from dreamshard.errors import DataFormatError
from dreamshard.learning.cost_model import CostNetConfig
from dreamshard.learning.features import FeatureScaler, table_features
from dreamshard.learning.policy import LearnedModel, PolicyNetConfig
from dreamshard.memory import MemoryModel
from dreamshard.plan import validate_plan
from dreamshard.sharders import make_sharder
from dreamshard.sharders.learned import PolicySharder
from dreamshard.tables import BIN_COLUMNS, NUM_BINS, Table, read_tables_file
from dreamshard.tasks import Task


def stats_frame(rows, pooling, batch, bins) -> pd.DataFrame:
    df = pd.DataFrame({"name": [f"t{i}" for i in range(len(rows))], "rows": rows, "pooling_factor": pooling,
                       "batch_size": batch})
    for k, c in enumerate(BIN_COLUMNS):
        df[c] = [b[k] for b in bins]
    return df


def simulated_stats(exponent: float, count: int, batch: int, seed: int) -> pd.DataFrame:
    """Tables whose bins are measured from lookups generated with `exponent` (the synthetic generator)."""
    rng = np.random.default_rng(seed)
    rows, pooling, bins = [], [], []
    for i in range(count):
        r = int(10 ** rng.uniform(2, 5))
        p = float(rng.uniform(1, 30))
        idx, lengths = generate_lookups(TableProfile(r, p, exponent), batch, seed * 1000 + i)
        s = table_statistics(idx, lengths)
        rows.append(s.rows)
        pooling.append(s.pooling_factor)
        bins.append(s.bins)
    return stats_frame(rows, pooling, [batch] * count, bins)


# ---------------------------------------------------------------- the estimate


@pytest.mark.parametrize("rows", [1, 7, 100, 12_345, 10**7, 2**40])
@pytest.mark.parametrize("pooling", [0.001, 1.0, 15.0, 400.0])
@pytest.mark.parametrize("exponent", [0.0, 0.8, 2.5])
def test_estimated_bins_are_fractions_summing_to_one(rows, pooling, exponent):
    bins = expected_bins(rows, pooling, 4096, exponent)
    assert bins.shape == (NUM_BINS,)
    assert np.isfinite(bins).all() and (bins >= 0).all() and (bins <= 1).all()
    assert bins.sum() == pytest.approx(1.0, abs=1e-9)


def test_nothing_looked_up_gives_zero_bins_like_the_process_stage():
    assert expected_bins(1000, 0.0, 4096, 0.8).tolist() == [0.0] * NUM_BINS
    assert table_statistics(np.zeros(0, dtype=np.int64), np.zeros(4, dtype=np.int64)).bins == [0.0] * NUM_BINS


@pytest.mark.parametrize("mean", [0.5, 3.0, 40.0, 5000.0])
def test_a_one_row_table_has_the_binned_poisson_distribution(mean):
    """All lookups hit the one row: its count is Poisson(B x pooling); binned as access_count_bins bins counts
    (1 | 2 | 3-4 | 5-8 | ... | > 2^15), conditional on being accessed."""
    counts = np.arange(1, 200_000)
    log_pmf = counts * math.log(mean) - mean - np.array([math.lgamma(c + 1) for c in counts])
    pmf = np.exp(log_pmf)
    which = np.minimum(np.ceil(np.log2(counts)).astype(int), NUM_BINS - 1)
    want = np.bincount(which, weights=pmf, minlength=NUM_BINS)
    want /= want.sum()
    np.testing.assert_allclose(expected_bins(1, mean / 100, 100, 1.3), want, atol=1e-9)


def test_rank_groups_cover_every_rank_once():
    for rows in (1, 2, 99, 101, 5000, 10**9):
        first, size = rank_groups(rows, 1.01)
        assert first[0] == 1 and size.sum() == rows and (size >= 1).all()
        assert np.array_equal(first[1:], first[:-1] + size[:-1])
    assert len(rank_groups(2**40, 1.01)[0]) < 3000  # memory grows with log(rows)


@pytest.mark.parametrize("exponent", [0.3, 1.0, 1.7])
def test_grouped_ranks_match_evaluating_every_rank(exponent):
    grouped = expected_bins(20_000, 12.0, 4096, exponent, 1.01)
    every = expected_bins(20_000, 12.0, 4096, exponent, 1 + 1e-12)
    assert len(rank_groups(20_000, 1 + 1e-12)[0]) == 20_000
    assert np.abs(grouped - every).sum() < 1e-4


@pytest.mark.parametrize("exponent", [0.4, 1.2])
def test_the_expectation_matches_the_mean_of_simulated_histograms(exponent):
    rows, pooling, batch = 30_000, 10.0, 2048
    measured = np.mean([table_statistics(*generate_lookups(TableProfile(rows, pooling, exponent), batch, seed)).bins
                        for seed in range(4)], axis=0)
    estimate = expected_bins(rows, pooling, batch, exponent)
    assert np.abs(estimate - measured).sum() < 0.03  # observed 0.003 (s = 0.4), 0.012 (s = 1.2)


# ---------------------------------------------------------------- the fit


def test_fit_recovers_the_exponent_of_exact_histograms():
    rng = np.random.default_rng(0)
    rows = [int(10 ** x) for x in rng.uniform(1, 6, 25)]
    pooling = rng.uniform(0.5, 50, 25).tolist()
    batch = [1024 if i % 3 else 4096 for i in range(25)]
    bins = [expected_bins(r, p, b, 1.13) for r, p, b in zip(rows, pooling, batch)]
    est = BinEstimator.fit(stats_frame(rows, pooling, batch, bins), fitted_on="exact")
    assert est.zipf_exponent == pytest.approx(1.13, abs=2e-3)
    assert est.l1_error < 1e-3
    assert est.batch_size == 1024  # the most common batch
    assert est.fitted_on == "exact (25 tables)"


@pytest.mark.parametrize("exponent", [0.5, 0.9, 1.3])
def test_fit_recovers_the_exponent_of_simulated_histograms(exponent):
    est = BinEstimator.fit(simulated_stats(exponent, 20, 1024, seed=3))
    assert est.zipf_exponent == pytest.approx(exponent, abs=0.05)  # observed within 0.006
    assert est.l1_error < 0.1
    assert est.mean_l1(simulated_stats(exponent, 5, 1024, seed=4)) < 0.1  # held-out tables


def test_fit_settings_are_checked_and_used():
    stats = simulated_stats(0.9, 6, 512, seed=5)
    narrow = BinEstimator.fit(stats, BinFitConfig(exponent_min=1.5, exponent_max=2.5, grid_step=0.5, tolerance=0.01))
    assert narrow.zipf_exponent == pytest.approx(1.5, abs=0.01)  # the best inside the range searched
    with pytest.raises(ValueError, match="exponent_min"):
        BinFitConfig(exponent_min=2.0, exponent_max=1.0)
    with pytest.raises(ValueError, match="tolerance"):
        BinFitConfig(grid_step=0.1, tolerance=0.5)


def test_fit_tables_file_selects_tables_and_names_bad_input(tmp_path):
    stats = simulated_stats(0.7, 8, 512, seed=6)
    path = tmp_path / "tables.parquet"
    stats.to_parquet(path)
    est = fit_tables_file(path, names=["t1", "t2", "t5"])
    assert est.fitted_on == f"{path}, selected tables (3 tables)"
    with pytest.raises(DataFormatError, match="no table.*'nope'"):
        fit_tables_file(path, names=["t1", "nope"])
    stats.drop(columns=["batch_size"]).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(DataFormatError, match=r"bad\.csv.*batch_size"):
        fit_tables_file(tmp_path / "bad.csv")
    broken = stats.copy()
    broken.loc[2, "bin_3"] = 1.5
    with pytest.raises(DataFormatError, match="fractions"):
        BinEstimator.fit(broken)
    with pytest.raises(DataFormatError, match="no such file"):
        fit_tables_file(tmp_path / "absent.parquet")


def test_estimator_round_trips_through_checkpoint_metadata(tmp_path):
    est = BinEstimator(0.8, 4096, "data/tables.parquet (120 tables)", 0.36)
    meta = {"algorithm": "dreamshard", META_KEY: est.to_dict()}
    path = tmp_path / "meta.pt"
    torch.save(meta, path)  # as a checkpoint stores its metadata, read back as checkpoints are
    assert BinEstimator.from_meta(torch.load(path, weights_only=True)) == est
    assert BinEstimator.from_meta({"algorithm": "dreamshard"}) is None
    with pytest.raises(DataFormatError, match="missing.*l1_error"):
        BinEstimator.from_meta({META_KEY: {"zipf_exponent": 1.0, "batch_size": 4, "fitted_on": "x",
                                           "rank_group_ratio": 1.01}})
    with pytest.raises(DataFormatError, match="batch_size"):
        BinEstimator.from_dict({**est.to_dict(), "batch_size": 0})


def test_with_estimated_bins_fills_only_tables_lacking_them():
    est = BinEstimator(0.9, 2048, "test", 0.1)
    measured = (1.0,) + (0.0,) * 16
    tables = [Table("a", 1000, 8, 3.0, measured), Table("b", 50_000, 16, 20.0), Table("c", 100, 4, 0.0)]
    filled, names = est.with_estimated_bins(tables)
    assert names == ("b", "c")
    assert filled[0] == tables[0]
    assert filled[1].bins == est.estimate(50_000, 20.0) == tuple(expected_bins(50_000, 20.0, 2048, 0.9))
    assert filled[2].bins == (0.0,) * NUM_BINS
    assert [(t.name, t.rows, t.dim, t.pooling_factor) for t in filled] == \
        [(t.name, t.rows, t.dim, t.pooling_factor) for t in tables]


def test_a_tables_file_may_leave_some_tables_bins_empty(tmp_path):
    df = pd.DataFrame({"name": ["a", "b"], "rows": [100, 200], "dim": [4, 8], "pooling_factor": [1.0, 2.0]})
    for k, c in enumerate(BIN_COLUMNS):
        df[c] = [1.0 if k == 0 else 0.0, float("nan")]
    df.to_csv(tmp_path / "t.csv", index=False)
    a, b = read_tables_file(tmp_path / "t.csv")
    assert a.bins == (1.0,) + (0.0,) * 16 and b.bins is None
    df.loc[1, "bin_0"] = 0.5
    df.to_parquet(tmp_path / "t.parquet")
    with pytest.raises(DataFormatError, match=r"'b'.*bin_1, .*bin_16 empty"):
        read_tables_file(tmp_path / "t.parquet")


# ---------------------------------------------------------------- learned sharders on tables without bins


def tiny_model(tables: list[Table], meta: dict | None = None) -> LearnedModel:
    """An untrained (seeded) DreamShard model: enough to decode plans."""
    gen = torch.Generator().manual_seed(0)
    cost = CostNetConfig(hidden=16, embed=8, head_hidden=8).build(gen)
    policy = PolicyNetConfig(hidden=16, embed=8, head_hidden=8).build(gen)
    scaler = FeatureScaler.fit(table_features(tables, MemoryModel()))
    cost.eval()
    policy.eval()
    return LearnedModel(cost, policy, scaler, meta or {})


@pytest.fixture(scope="module")
def measured_tables() -> list[Table]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(12):
        rows, pooling = int(10 ** rng.uniform(2, 5)), float(rng.uniform(1, 30))
        bins = table_statistics(*generate_lookups(TableProfile(rows, pooling, 0.8), 1024, i)).bins
        out.append(Table(f"t{i}", rows, int(rng.choice([4, 8, 16, 32])), pooling, tuple(bins)))
    return out


def test_policy_sharder_plans_tables_without_bins_with_an_estimator(measured_tables):
    model = tiny_model(measured_tables)
    bare = [Table(t.name, t.rows, t.dim, t.pooling_factor) for t in measured_tables]
    task = Task.uniform("bare", bare, 3, 1.0)
    est = BinEstimator(0.8, 1024, "test", 0.2)
    plan = PolicySharder("dreamshard", model, bins=est).shard(task)
    validate_plan(task, plan)
    filled = Task.uniform("bare", est.with_estimated_bins(bare)[0], 3, 1.0)
    assert plan == PolicySharder("dreamshard", model).shard(filled)  # the same as planning the estimated tables
    # a table with measured bins keeps them: mixing both gives the plan of the mixed table set
    mixed = Task.uniform("mixed", measured_tables[:6] + bare[6:], 3, 1.0)
    validate_plan(mixed, PolicySharder("dreamshard", model, bins=est, samples=3).shard(mixed))


def test_policy_sharder_without_an_estimator_refuses_tables_without_bins(measured_tables):
    model = tiny_model(measured_tables)
    task = Task.uniform("half", measured_tables[:5] + [Table("bare", 500, 8, 2.0)], 2, 1.0)
    with pytest.raises(DataFormatError, match=r"'bare'.*bin_0\.\.bin_16.*dreamshard profile"):
        PolicySharder("dreamshard", model).shard(task)
    with pytest.raises(DataFormatError, match=r"'bare'.*bin_0\.\.bin_16"):
        make_sharder("autoshard", model=model).shard(task)
    with pytest.raises(DataFormatError, match=r"'bare'.*bin_0\.\.bin_16"):
        task_with_estimated_bins(task, None, "neuroshard")
    # tables that all have bins need no estimator
    validate_plan(Task.uniform("ok", measured_tables, 2, 1.0),
                  PolicySharder("dreamshard", model).shard(Task.uniform("ok", measured_tables, 2, 1.0)))


def test_a_model_carrying_an_estimator_in_its_metadata_uses_it(measured_tables, tmp_path):
    est = BinEstimator(1.1, 1024, "test", 0.3)
    model = tiny_model(measured_tables, {"algorithm": "dreamshard", META_KEY: est.to_dict()})
    path = tmp_path / "model.pt"
    model.save(path)
    loaded = LearnedModel.load(path)
    sharder = make_sharder("dreamshard", model=loaded)
    assert isinstance(sharder, PolicySharder) and sharder.bins == est
    bare = Task.uniform("bare", [Table(t.name, t.rows, t.dim, t.pooling_factor) for t in measured_tables], 2, 1.0)
    plan = sharder.shard(bare)
    validate_plan(bare, plan)
    assert plan == PolicySharder("dreamshard", loaded, bins=est).shard(bare)
    broken = tiny_model(measured_tables, {META_KEY: {"zipf_exponent": -1}})
    with pytest.raises(DataFormatError, match="model metadata: bin_estimator"):
        PolicySharder("dreamshard", broken)


def test_cli_plans_a_tables_file_without_bins_and_says_they_were_estimated(measured_tables, tmp_path, capsys):
    from dreamshard.cli import main

    est = BinEstimator(0.9, 1024, "test tables", 0.25)
    path = tmp_path / "model.pt"
    tiny_model(measured_tables, {"algorithm": "dreamshard", META_KEY: est.to_dict()}).save(path)
    pd.DataFrame([{"name": t.name, "rows": t.rows, "dim": t.dim, "pooling_factor": t.pooling_factor}
                  for t in measured_tables]).to_csv(tmp_path / "tables.csv", index=False)
    out = tmp_path / "plan.json"
    argv = ["plan", "--tables", str(tmp_path / "tables.csv"), "--devices", "3", "--memory-gb", "1",
            "--algo", "dreamshard", "--model", str(path), "-o", str(out)]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert "access-count bins ESTIMATED for 12 of 12 tables" in stdout and "Zipf exponent 0.900" in stdout
    assert out.exists()
    # a heuristic reads no bins: nothing estimated, nothing said
    assert main(argv[:7] + ["--algo", "size_greedy", "-o", str(out)]) == 0
    assert "ESTIMATED" not in capsys.readouterr().out
