"""The learned parts on the deterministic analytic backend: features, cost network, DreamShard policy
training, the learned sharders and their checkpoints, and NeuroShard's cost models and search.

Tables are generated like the synthetic dataset (Poisson lengths, Zipf-ranked rows) so their
access-count bins are real histograms; train and test tasks draw from disjoint table pools.
Networks are small-step, seeded fits: each test states its threshold and what was observed.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from dreamshard.cli import main
from dreamshard.data.dlrm import TableProfile, generate_lookups
from dreamshard.errors import DataFormatError, InfeasibleTaskError
from dreamshard.evaluation.collect import CostJournal, collect, plans_to_measure
from dreamshard.evaluation.evaluate import canonical_assignments, exhaustive_optimum
from dreamshard.hardware.analytic import AnalyticBackend
from dreamshard.hardware.comm import host_exchange_ms, shard_traffic
from dreamshard.learning.cost_model import (
    CostData,
    CostNetConfig,
    NetworkEstimate,
    cost_data_from_plans,
    cost_data_from_rows,
    evaluate_cost_net,
    fit_cost_net,
    kendall_tau,
    median_device_ms,
    piece_features,
    plan_device_sums,
    plan_predictions,
    predict,
)
from dreamshard.learning.decoding import rank_devices
from dreamshard.learning.features import (
    FEATURE_NAMES,
    NUM_FEATURES,
    FeatureScaler,
    shard_features,
    table_features,
)
from dreamshard.learning.mdp import Episodes, TaskContext, greedy_devices, reinforce_loss, rollout
from dreamshard.learning.neuroshard import (
    AugmentConfig,
    NeuroShardModel,
    comm_dataset,
    comm_mape,
    compute_dataset,
    fit_comm_net,
    fit_compute_net,
)
from dreamshard.learning.policy import LearnedModel, PolicyNetConfig
from dreamshard.learning.train import (
    TrainConfig,
    Trainer,
    train_autoshard,
    train_dreamshard,
)
from dreamshard.memory import GB, MemoryModel
from dreamshard.plan import Plan, Shard, device_memory_bytes, row_blocks, validate_plan
from dreamshard.sharders import load_model, make_sharder
from dreamshard.sharders.cuts import ROW_WISE, _Universe, cut_options
from dreamshard.sharders.learned import PolicySharder
from dreamshard.sharders.search import (
    NeuroShardSharder,
    SearchConfig,
    _Evaluator,
    as_blocks,
    greedy_grid,
)
from dreamshard.tables import BIN_COLUMNS, NUM_BINS, Table, access_count_bins
from dreamshard.tasks import Task, host_name
from helpers import analytic

BATCH = 1024
# the policy-training configuration of these tests. The briefed one (cost_steps=100 at the default
# cost_lr, policy_updates=10) is too short to be reliable: its policies were worse than random on the
# test tasks for 2 of 5 seeds (ratios 0.82-1.2), the cost network being too rough to guide the policy.
# With this one, 5 of 5 seeds beat random: 0.79-0.85 of its cost on 2-device test tasks, 0.68-0.83 on
# the unseen 4-device ones.
TRAIN = {"iterations": 2, "plans_per_iteration": 5, "cost_steps": 300, "cost_lr": 3e-3, "policy_updates": 20,
         "episodes": 8, "policy_lr": 5e-3, "seed": 0}
# reproducibility does not need a good policy: a shorter run, trained twice
SHORT = {"cost_steps": 50, "policy_updates": 5}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # small networks: threads only add overhead and nondeterminism
    yield
    torch.set_num_threads(previous)


def make_tables(seed: int, count: int, prefix: str) -> list[Table]:
    """Heavy-tailed tables with bins from generated lookups (rows 1e2..1e5, Zipf 0.2..1.4)."""
    rng = np.random.default_rng(seed)
    tables = []
    for i in range(count):
        rows = int(10 ** rng.uniform(2, 5))
        pooling = float(min(rng.lognormal(math.log(7.0), 1.0), 100.0))
        alpha = float(rng.uniform(0.2, 1.4))
        idx, _ = generate_lookups(TableProfile(rows, pooling, alpha), 512, seed * 1000 + i)
        bins = access_count_bins(np.unique(idx, return_counts=True)[1])
        tables.append(Table(f"{prefix}{i:03d}", rows, int(rng.choice([4, 8, 16, 32, 64, 128])), pooling, tuple(bins)))
    return tables


def make_tasks(pool: list[Table], seed: int, count: int, sizes: tuple[int, int], devices: int, prefix: str,
               tight: bool = False) -> list[Task]:
    rng = np.random.default_rng(seed)
    memory = MemoryModel()
    tasks = []
    for k in range(count):
        chosen = [pool[int(i)] for i in rng.choice(len(pool), int(rng.integers(*sizes)), replace=False)]
        gb = 1.0
        if tight:  # devices barely hold the tables: 115% of an even share, at least the largest table
            sizes_b = [memory.shard_bytes(t.rows, t.dim) for t in chosen]
            gb = max(1.15 * sum(sizes_b) / devices, 1.01 * max(sizes_b)) / GB
        tasks.append(Task.uniform(f"{prefix}/{k}", chosen, devices, gb))
    return tasks


@pytest.fixture(scope="module")
def backend() -> AnalyticBackend:
    return analytic(batch_size=BATCH)


@pytest.fixture(scope="module")
def world():
    train_pool, test_pool = make_tables(1, 60, "tr"), make_tables(2, 60, "te")
    return {
        "train": make_tasks(train_pool, 10, 6, (8, 17), 2, "train"),
        "train_more": make_tasks(train_pool, 11, 4, (8, 17), 4, "train4"),
        "test2": make_tasks(test_pool, 20, 6, (8, 17), 2, "test2"),
        "test4": make_tasks(test_pool, 21, 4, (10, 21), 4, "test4"),
        "tight": make_tasks(test_pool, 22, 4, (8, 13), 3, "tight", tight=True),
    }


@pytest.fixture(scope="module")
def scaler(world) -> FeatureScaler:
    tasks = world["train"] + world["train_more"]
    return FeatureScaler.fit(np.concatenate([table_features(t.tables, t.memory) for t in tasks]))


def measured(backend, tasks, num_plans: int, seed: int, cut_fraction: float = 0.0) -> CostData:
    items = plans_to_measure(tasks, num_plans, 0.5, seed, "fp", cut_fraction)
    return cost_data_from_plans([(it.task, it.plan, backend.plan_cost(it.task, it.plan)) for it in items])


# ---------------------------------------------------------------- features


def test_scaler_standardises_log_features_and_passes_bins_through(world, scaler):
    tables = [t for task in world["train"] + world["train_more"] for t in task.tables]
    raw = table_features(tables, MemoryModel())
    assert raw.shape == (len(tables), NUM_FEATURES) and len(FEATURE_NAMES) == NUM_FEATURES == 4 + NUM_BINS
    x = scaler.transform(raw)
    assert x.dtype == np.float32
    np.testing.assert_allclose(x[:, :4].mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(x[:, :4].std(axis=0), 1.0, atol=1e-4)
    np.testing.assert_allclose(x[:, 4:], raw[:, 4:], rtol=1e-6)  # bins unscaled
    np.testing.assert_allclose(x[:, 0], (np.log1p(raw[:, 0]) - scaler.mean[0]) / scaler.std[0], rtol=1e-5)
    # features of a slice: its width and its bytes, the table's rows, pooling and bins
    t = tables[0]
    f = shard_features(t, 4, MemoryModel("fp16", "exact_adagrad"))
    assert f[0] == 4 and f[1] == t.rows and f[2] == t.pooling_factor
    assert f[3] == pytest.approx(t.rows * 4 * (2 + 4) / GB)
    # a constant column gets std 1, not a division by ~0
    same = FeatureScaler.fit(np.repeat(raw[:1], 5, axis=0))
    assert same.std[:4] == (1.0, 1.0, 1.0, 1.0)


def test_scaler_round_trip_and_rejects_other_features(scaler):
    d = json.loads(json.dumps(scaler.to_dict()))
    again = FeatureScaler.from_dict(d)
    assert again == scaler
    raw = np.abs(np.random.default_rng(0).normal(size=(3, NUM_FEATURES))) * 100
    np.testing.assert_array_equal(again.transform(raw), scaler.transform(raw))
    with pytest.raises(DataFormatError, match="feature scaler"):
        FeatureScaler.from_dict({**d, "features": d["features"][:-1]})


def test_same_table_same_features_in_two_tasks(world, scaler):
    t = world["test2"][0].tables[0]
    others = [x for x in world["test2"][1].tables if x.name != t.name][:5]
    a = Task.uniform("a", [t, *others], 2, 1.0)
    b = Task.uniform("b", [*world["test4"][0].tables[:7], t], 4, 2.0)
    xa = scaler.transform(table_features(a.tables, a.memory))
    xb = scaler.transform(table_features(b.tables, b.memory))
    np.testing.assert_array_equal(xa[0], xb[-1])
    net = CostNetConfig().build(torch.Generator().manual_seed(0))
    ca = TaskContext.build(a, net, scaler)
    cb = TaskContext.build(b, net, scaler)
    torch.testing.assert_close(ca.x[0], cb.x[-1], rtol=0, atol=0)


def test_a_table_without_bins_is_a_data_format_error_naming_it():
    with pytest.raises(DataFormatError, match="'bare'.*access-count bins"):
        table_features([Table("ok", 10, 4, 1.0, (1.0,) + (0.0,) * 16), Table("bare", 10, 4, 1.0)], MemoryModel())


# ---------------------------------------------------------------- cost network


def test_cost_data_subset_and_concat_are_consistent(world, backend):
    a = measured(backend, world["train"], 6, 0)
    b = measured(backend, world["train_more"], 4, 1)
    both = a.concat(b)
    assert both.num_plans == 10 and len(both.device_plan) == len(a.device_plan) + len(b.device_plan)

    def same(x: CostData, y: CostData):
        for field in ("shard_raw", "shard_device", "device_plan", "device_ms", "plan_cost_ms", "shard_out",
                      "shard_kind"):
            np.testing.assert_array_equal(getattr(x, field), getattr(y, field), err_msg=field)

    same(both.subset(range(6)), a)
    same(both.subset(range(6, 10)), b)
    same(both.subset(range(10)), both)
    same(CostData.empty().concat(a), a)
    # order follows the requested plans; each device row keeps its shards and costs
    swapped = both.subset([7, 2])
    np.testing.assert_array_equal(swapped.plan_cost_ms, both.plan_cost_ms[[7, 2]])
    same(swapped.subset([1]), a.subset([2]))
    same(swapped.subset([0]), b.subset([1]))
    assert (np.diff(swapped.device_plan) >= 0).all()
    # a device row's costs add up to the plan's cost for the slowest device
    for p in range(both.num_plans):
        totals = both.device_ms[both.device_plan == p].sum(axis=1)
        assert totals.max() == pytest.approx(both.plan_cost_ms[p])


def test_cost_data_from_collected_rows_equals_cost_data_from_plans(world, backend, tmp_path):
    items = plans_to_measure(world["train"], 8, 0.5, 4, "fp", cut_fraction=0.5, row_fraction=0.5)
    journal = CostJournal(tmp_path / "journal")
    collect(backend, items, journal, 3, {"batch_size": BATCH, "seed": 4})
    ids = list(dict.fromkeys(it.plan_id for it in items))
    by_id = {it.plan_id: it for it in items}
    rows = cost_data_from_rows(journal.read("plans", ids), journal.read("devices", ids), world["train"])
    direct = cost_data_from_plans([(by_id[i].task, by_id[i].plan, backend.plan_cost(by_id[i].task, by_id[i].plan))
                                   for i in ids])
    for field in ("shard_raw", "shard_device", "device_plan", "device_ms", "plan_cost_ms", "shard_out", "shard_kind"):
        np.testing.assert_allclose(getattr(rows, field), getattr(direct, field), rtol=1e-12, err_msg=field)
    assert {0, 1, 2} <= set(rows.shard_kind.tolist())  # whole tables, column slices and row blocks among them


def test_kendall_tau():
    assert kendall_tau(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40])) == 1.0
    assert kendall_tau(np.array([1, 2, 3, 4]), np.array([4, 3, 2, 1])) == -1.0
    assert kendall_tau(np.array([1, 2, 3]), np.array([1, 3, 2])) == pytest.approx(1 / 3)


def test_by_kind_a_device_costs_the_sum_of_its_lookup_groups_heads(world, scaler):
    """With lookup groups by kind, each TorchRec lookup group on a device (whole tables, column slices, row
    blocks) is one operator: the heads run on each group's sum and add up; an empty device costs nothing, and a
    device of whole tables costs what the fused network (same weights) says."""
    task = world["train_more"][0]  # 4 devices: 2 and 3 stay empty
    fused = CostNetConfig(scale_ms=0.5).build(torch.Generator().manual_seed(3))
    by_kind = CostNetConfig(scale_ms=0.5, lookup_groups="kind").build(torch.Generator().manual_seed(3))
    assert by_kind.width == 4 * (by_kind.config.embed + 1) and fused.width == fused.config.embed
    big, other = sorted(task.tables, key=lambda t: -t.dim)[:2]
    plan = Plan(task.num_devices, (Shard(big.name, 0, 0, big.dim // 2), Shard(big.name, 1, big.dim // 2, big.dim),
                                   Shard(other.name, 0, 0, other.dim)) +
                tuple(Shard(t.name, 1, 0, t.dim) for t in task.tables if t not in (big, other)))
    sums, _ = plan_device_sums(by_kind, scaler, task, plan)
    fused_sums, _ = plan_device_sums(fused, scaler, task, plan)
    with torch.no_grad():
        costs = by_kind.head_costs(sums)
        x = torch.from_numpy(scaler.transform(np.stack([
            piece_features(big, 0, big.rows, big.dim // 2, task.memory), table_features([other], task.memory)[0]])))
        slice_alone, other_alone = fused.head_costs(fused.encode(x))
        torch.testing.assert_close(costs[0], slice_alone + other_alone)  # device 0: a slice and a whole table
        # device 1: a slice and whole tables, two groups; as one fused operator it is the heads on the sum
        assert not torch.allclose(costs[1], fused.head_costs(fused_sums[1]), rtol=1e-3)
        whole = torch.from_numpy(scaler.transform(table_features(task.tables[:3], task.memory)))
        torch.testing.assert_close(by_kind.head_costs(by_kind.encode(whole).sum(0)),
                                   fused.head_costs(fused.encode(whole).sum(0)))
        assert len(costs) == 4 and torch.all(costs[2:] == 0) and torch.all(fused.head_costs(fused_sums[2:]) > 0)
    # the estimate of a plan, the decoders' NumPy step and the training rows all use these sums
    estimate = NetworkEstimate(by_kind, scaler).plan_cost(task, plan)
    assert [d.fwd_ms for d in estimate.devices] == pytest.approx(costs[:, 0].tolist(), rel=1e-6)


def test_by_kind_the_cut_search_rates_a_plan_with_cuts_as_the_network_estimate_does(world, backend, scaler):
    """The cut search's NumPy scorer (every piece's group block summed per device) and NetworkEstimate (the plan's
    pieces grouped by kind) are one estimate of a plan that holds whole tables, column slices and row blocks."""
    from dreamshard.sharders.cuts import CutConfig
    from dreamshard.sharders.pieces import Cut, cut_task, merge_pieces

    net = CostNetConfig.with_topology(backend.config.topology, BATCH, comm="model", lookup_groups="kind",
                                      scale_ms=0.5).build(torch.Generator().manual_seed(4))
    model = LearnedModel(net, PolicyNetConfig().build(torch.Generator().manual_seed(5)), scaler, {})
    for task in world["test4"][:2]:
        options = [cut_options(task, t, CutConfig()) for t in task.tables]
        sliced = next(t for t, o in zip(task.tables, options) if 2 in o)
        rows = next(t for t, o in zip(task.tables, options) if ROW_WISE in o and t is not sliced)
        cut, pieces = cut_task(task, {sliced.name: Cut(columns=2), rows.name: Cut(row_wise=True)})
        pins = dict(cut.pins)
        plan = merge_pieces(cut, Plan.from_assignment(cut, [pins.get(t.name, i % task.num_devices)
                                                            for i, t in enumerate(cut.tables)]), pieces)
        validate_plan(task, plan)
        u = _Universe.build(task, model, options)
        assert NetworkEstimate(net, scaler).plan_cost(task, plan).cost_ms == pytest.approx(_rated(u, task, plan),
                                                                                          rel=1e-4)


def _on_hosts(task: Task, per_host: int = 2, sharding: tuple[str, ...] = ("table", "column", "row", "host")) -> Task:
    """`task` with its devices named by host, `per_host` a host, allowing `sharding` (with "host": TorchRec's
    table_row_wise)."""
    return replace(task, devices=tuple(replace(d, host=host_name(i, per_host)) for i, d in enumerate(task.devices)),
                   sharding=sharding)


def test_the_cut_search_rates_a_table_row_wise_over_one_host_as_the_network_estimate_does(world, backend, scaler):
    """On two hosts, a table row-wise over one host's devices (TorchRec's table_row_wise) beside column slices
    and row blocks over every device: the cut search's load (its host columns: the two-level exchange, with the
    receiving host's share and the latencies) rates the plan as NetworkEstimate does (comm.host_exchange_ms)."""
    from dreamshard.sharders.cuts import CutConfig, host_cut
    from dreamshard.sharders.pieces import Cut, cut_task, merge_pieces

    net = CostNetConfig.with_topology(backend.config.topology, BATCH, comm="model", lookup_groups="kind",
                                      scale_ms=0.5).build(torch.Generator().manual_seed(4))
    model = LearnedModel(net, PolicyNetConfig().build(torch.Generator().manual_seed(5)), scaler, {})
    for task in world["test4"][:2]:
        task = _on_hosts(task)
        options = [cut_options(task, t, CutConfig(host_wise=True)) for t in task.tables]
        assert all(host_cut(0) not in o for o in (cut_options(task, t, CutConfig()) for t in task.tables))
        hosted = next(i for i, o in enumerate(options) if host_cut(1) in o)
        sliced = next(i for i, o in enumerate(options) if 2 in o and i != hosted)
        rows = next(i for i, o in enumerate(options) if ROW_WISE in o and i not in (hosted, sliced))
        names = [t.name for t in task.tables]
        for cuts in ({names[hosted]: Cut(row_wise=True, host=1, per_host=2), names[sliced]: Cut(columns=2),
                      names[rows]: Cut(row_wise=True)}, {names[sliced]: Cut(columns=2)}):
            cut, pieces = cut_task(task, cuts)
            pins = dict(cut.pins)
            plan = merge_pieces(cut, Plan.from_assignment(cut, [pins.get(t.name, i % task.num_devices)
                                                                for i, t in enumerate(cut.tables)]), pieces)
            validate_plan(task, plan)
            u = _Universe.build(task, model, options)
            estimate = NetworkEstimate(net, scaler).plan_cost(task, plan)
            searched = u.devices(u.load(*_cuts_where(task, plan))[0])
            assert [d.total_ms for d in estimate.devices] == pytest.approx(searched.tolist(), rel=1e-4)
            two_level = host_exchange_ms(plan, task, BATCH, net.config.topology)
            assert (two_level.min() > 0) == (names[hosted] in cuts)


MAPE_LIMIT = 0.35  # observed 0.18-0.23 over fit seeds 0-5 on held-out plans of unseen tables (untrained: 3.2)
TAU_LIMIT = 0.5  # observed 0.63-0.78 over fit seeds 0-5


def test_cost_net_learns_analytic_device_costs(world, backend, scaler):
    data = measured(backend, world["train"] + world["train_more"], 80, 0)
    held_out = measured(backend, world["test2"] + world["test4"], 30, 1)  # unseen tables
    net = CostNetConfig(scale_ms=median_device_ms(data)).build(torch.Generator().manual_seed(0))
    before = evaluate_cost_net(net, scaler, held_out)
    losses = fit_cost_net(net, scaler, data, steps=300, lr=5e-3, batch_plans=32, seed=0)
    assert len(losses) == 300 and np.mean(losses[-20:]) < 0.3 * np.mean(losses[:20])
    after = evaluate_cost_net(net, scaler, held_out)
    print("cost net held out:", {k: after[k] for k in ("device_compute_mape", "plan_device_max_kendall_tau")},
          "untrained:", before["device_compute_mape"])
    assert after["num_plans"] == 30
    assert after["device_compute_mape"] < MAPE_LIMIT
    assert after["plan_device_max_kendall_tau"] > TAU_LIMIT
    assert before["device_compute_mape"] > 2 * after["device_compute_mape"]
    # predictions of a subset are the subset of the predictions
    with torch.no_grad():
        dev_all, plan_all = predict(net, scaler, held_out)
        dev_sub, plan_sub = predict(net, scaler, held_out.subset([3, 5]))
    torch.testing.assert_close(plan_sub, plan_all[[3, 5]])
    rows = [np.flatnonzero(held_out.device_plan == p) for p in (3, 5)]
    torch.testing.assert_close(dev_sub, dev_all[np.concatenate(rows)])
    # same seed, same fit
    again = CostNetConfig(scale_ms=median_device_ms(data)).build(torch.Generator().manual_seed(0))
    assert fit_cost_net(again, scaler, data, steps=300, lr=5e-3, batch_plans=32, seed=0) == losses


# ---------------------------------------------------------------- DreamShard training


def train_once(world, backend, scaler, **overrides) -> Trainer:
    data = measured(backend, world["train"], 40, 0)
    trainer = Trainer(world["train"], backend, scaler, TrainConfig(**{**TRAIN, **overrides}), data)
    logs = train_dreamshard(trainer)
    assert len(logs) == TRAIN["iterations"]
    assert 0 < trainer.measurements == logs[-1].measurements <= TRAIN["iterations"] * TRAIN["plans_per_iteration"]
    assert trainer.data.num_plans == data.num_plans + trainer.measurements
    assert all(math.isfinite(log.cost_loss) and math.isfinite(log.policy_loss) for log in logs)
    return trainer


@pytest.fixture(scope="module")
def trained(world, backend, scaler) -> Trainer:
    return train_once(world, backend, scaler)


@pytest.fixture(scope="module")
def model(trained) -> LearnedModel:
    return trained.model("dreamshard", {"note": "test"})


def test_trained_policy_is_valid_and_beats_random(world, backend, model):
    sharder = make_sharder("dreamshard", model=model)
    assert isinstance(sharder, PolicySharder) and sharder.name == "dreamshard"
    ratios = []
    for task in world["test2"] + world["tight"]:
        plan = sharder.shard(task)
        validate_plan(task, plan)
        for s in plan.shards:  # whole tables only
            assert (s.col_start, s.col_end) == (0, next(t.dim for t in task.tables if t.name == s.table))
        if task in world["test2"]:
            mine = backend.plan_cost(task, plan).cost_ms
            rand = np.mean([backend.plan_cost(task, make_sharder("random", seed=s).shard(task)).cost_ms
                            for s in range(5)])
            ratios.append(mine / rand)
    print("dreamshard / random on test tasks:", np.round(ratios, 3))
    assert np.mean(ratios) < 0.95  # observed 0.79-0.85 over training seeds 0-4


def test_the_self_critical_policy_beats_random_too(world, backend, scaler):
    """baseline="greedy" (the pipeline's DreamShard): each episode against the policy's own greedy plan."""
    trainer = train_once(world, backend, scaler, baseline="greedy")
    sharder = make_sharder("dreamshard", model=trainer.model("dreamshard", {}))
    ratios = []
    for task in world["test2"] + world["test4"]:
        mine = backend.plan_cost(task, sharder.shard(task)).cost_ms
        ratios.append(mine / np.mean([backend.plan_cost(task, make_sharder("random", seed=s).shard(task)).cost_ms
                                      for s in range(5)]))
    print("self-critical dreamshard / random:", np.round(ratios, 3))
    assert np.mean(ratios) < 0.95


def test_an_episode_is_pushed_by_its_cost_against_the_baseline():
    """d loss / d log p of an episode is -(baseline - cost) / spread / B: cheaper episodes than the baseline get
    likelier, dearer ones less likely, one at the baseline is left alone (the entropy term off)."""
    def grad(baseline):
        log_prob = torch.zeros(3, requires_grad=True)
        ep = Episodes(torch.zeros(3, 2, dtype=torch.long), log_prob, torch.zeros(3), torch.tensor([1.0, 2.0, 3.0]),
                      torch.zeros(3, dtype=torch.bool))
        reinforce_loss(ep, ep.predicted_ms, 0.0, baseline).backward()
        return log_prob.grad
    mean, greedy = grad(None), grad(1.0)  # the batch's mean (2.0), and a greedy plan as cheap as the best episode
    assert mean[0] < 0 and mean[1] == 0 and mean[2] > 0
    assert torch.allclose(mean, grad(2.0))
    assert greedy[0] == 0 and 0 < greedy[1] < greedy[2]


def test_training_is_reproducible(world, backend, scaler):
    first, again = train_once(world, backend, scaler, **SHORT), train_once(world, backend, scaler, **SHORT)
    for (k, v), (k2, v2) in zip(first.policy.state_dict().items(), again.policy.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    for (k, v), (k2, v2) in zip(first.cost_net.state_dict().items(), again.cost_net.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    a = make_sharder("dreamshard", model=first.model("dreamshard", {}))
    b = make_sharder("dreamshard", model=again.model("dreamshard", {}))
    for task in world["test2"] + world["test4"]:
        assert a.shard(task) == b.shard(task)


def test_learned_model_save_load_round_trip(world, model, tmp_path):
    path = tmp_path / "models" / "dreamshard.pt"
    model.save(path)
    loaded = LearnedModel.load(path)
    assert loaded.meta == model.meta and loaded.scaler == model.scaler
    assert loaded.cost_net.config == model.cost_net.config
    a, b = make_sharder("dreamshard", model=model), make_sharder("dreamshard", model=load_model("dreamshard", path))
    for task in world["test2"] + world["test4"] + world["tight"]:
        assert a.shard(task) == b.shard(task)
    with pytest.raises(DataFormatError, match="no such model checkpoint"):
        LearnedModel.load(tmp_path / "absent.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(DataFormatError, match="not a model checkpoint"):
        LearnedModel.load(junk)
    other = tmp_path / "other.pt"
    torch.save({"format": "something-else"}, other)
    with pytest.raises(DataFormatError, match="expected a dreamshard-checkpoint/2 checkpoint"):
        LearnedModel.load(other)


def test_policy_plans_device_counts_it_was_not_trained_on(world, backend, model, trained):
    assert {t.num_devices for t in trained.tasks} == {2}
    sharder = make_sharder("dreamshard", model=model)
    ratios = []
    for task in world["test4"]:
        plan = sharder.shard(task)
        validate_plan(task, plan)
        used = {s.device for s in plan.shards}
        assert len(used) >= 2  # spreads the tables out
        rand = np.mean([backend.plan_cost(task, make_sharder("random", seed=s).shard(task)).cost_ms for s in range(5)])
        ratios.append(backend.plan_cost(task, plan).cost_ms / rand)
    print("dreamshard / random on unseen 4-device tasks:", np.round(ratios, 3))
    assert np.mean(ratios) < 1.0  # observed 0.68-0.83 over training seeds 0-4
    one_device = Task.uniform("solo", world["test4"][0].tables, 1, 2.0)
    assert {s.device for s in sharder.shard(one_device).shards} == {0}


def _assignment(task: Task, plan: Plan) -> list[int]:
    devices = {s.table: s.device for s in plan.shards}
    return [devices[t.name] for t in task.tables]


def test_sampling_keeps_the_plan_the_cost_network_rates_best(world, model):
    greedy = PolicySharder("dreamshard", model)
    sampled = make_sharder("dreamshard", model=model, samples=8, seed=3)
    assert isinstance(sampled, PolicySharder) and sampled.samples == 8
    strictly_better = 0
    for task in world["test2"] + world["test4"] + world["tight"]:
        ctx = TaskContext.build(task, model.cost_net, model.scaler)
        g, s = greedy.shard(task), sampled.shard(task)
        validate_plan(task, s)
        with torch.no_grad():
            pg = greedy.predicted_ms(ctx, _assignment(task, g))
            ps = sampled.predicted_ms(ctx, _assignment(task, s))
        assert ps <= pg * (1 + 1e-6)
        strictly_better += ps < pg * (1 - 1e-6)
        assert sampled.shard(task) == s  # seeded per task
    assert strictly_better >= 1  # sampling finds something the greedy decode does not, somewhere


def test_rivals_join_the_candidates_and_the_best_rated_plan_is_kept(world, model):
    """rivals: the greedy heuristics' plans are rated beside the policy's; the kept plan is rated no worse than
    any of them, and is a heuristic's only where the network rates it strictly better than the policy's."""
    heuristics = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")
    plain = PolicySharder("dreamshard", model)
    rivalled = make_sharder("dreamshard", model=model, rivals=heuristics)
    taken = 0
    for task in world["test2"] + world["test4"] + world["tight"]:
        ctx = TaskContext.build(task, model.cost_net, model.scaler)
        plan = rivalled.shard(task)
        validate_plan(task, plan)
        with torch.no_grad():
            kept = plain.predicted_ms(ctx, _assignment(task, plan))
            own = plain.predicted_ms(ctx, _assignment(task, plain.shard(task)))
            others = [plain.predicted_ms(ctx, _assignment(task, make_sharder(h).shard(task))) for h in heuristics]
        assert kept <= min([own, *others]) * (1 + 1e-6)
        if plan != plain.shard(task):
            taken += 1
            assert kept < own
    assert taken >= 1  # somewhere a heuristic's plan is rated better than the policy's
    for bad in (("random",), "size_greedy", ("no_such",)):
        with pytest.raises(ValueError, match="rivals: expected greedy heuristics"):
            make_sharder("dreamshard", model=model, rivals=bad)


def test_autoshard_respects_the_measurement_budget(world, backend, scaler):
    data = measured(backend, world["train"], 20, 0)
    trainer = Trainer(world["train"], backend, scaler,
                      TrainConfig(cost_steps=20, episodes=6, measurement_budget=15, seed=0), data)
    logs = train_autoshard(trainer)
    assert 0 < trainer.measurements <= 15
    assert len(logs) == 15 // 6
    assert trainer.data.num_plans == data.num_plans + trainer.measurements
    validate_plan(world["test2"][0], make_sharder("autoshard", model=trainer.model("autoshard", {})).shard(world["test2"][0]))
    none = Trainer(world["train"], backend, scaler,
                   TrainConfig(cost_steps=20, episodes=6, measurement_budget=5, seed=0), data)
    assert train_autoshard(none) == [] and none.measurements == 0


def test_trainer_rejects_bad_configs(world, backend, scaler):
    with pytest.raises(ValueError, match="episodes"):
        TrainConfig(episodes=0)
    with pytest.raises(ValueError, match="measurement_budget"):
        TrainConfig(measurement_budget=-1)
    with pytest.raises(ValueError, match="no training tasks"):
        Trainer([], backend, scaler, TrainConfig(), CostData.empty())
    with pytest.raises(ValueError, match="baseline: expected one of batch, greedy"):
        TrainConfig(baseline="mean")
    autoshard = Trainer(world["train"], backend, scaler, TrainConfig(cost_steps=5, baseline="greedy"),
                        measured(backend, world["train"], 5, 0))
    with pytest.raises(ValueError, match="AutoShard's rewards are measurements"):
        train_autoshard(autoshard)
    assert autoshard.measurements == 0


# ---------------------------------------------------------------- CLI with a learned model


@pytest.fixture(scope="module")
def model_file(model, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "dreamshard.pt"
    model.save(path)
    return path


def tables_frame(tables: list[Table], bins: bool = True) -> pd.DataFrame:
    rows = []
    for t in tables:
        row = {"name": t.name, "rows": t.rows, "dim": t.dim, "pooling_factor": t.pooling_factor}
        if bins:
            row.update(zip(BIN_COLUMNS, t.bins))
        rows.append(row)
    return pd.DataFrame(rows)


def _plan_argv(tables: Path, out: Path, *extra: str) -> list[str]:
    return ["plan", "--tables", str(tables), "--devices", "3", "--memory-gb", "1", "--algo", "dreamshard",
            "-o", str(out), *extra]


def test_cli_plans_with_a_dreamshard_model(world, model, model_file, tmp_path, capsys):
    tables = world["test4"][1].tables
    csv = tmp_path / "tables.csv"
    tables_frame(tables).to_csv(csv, index=False)
    out = tmp_path / "plan.json"
    assert main(_plan_argv(csv, out, "--model", str(model_file))) == 0
    plan = Plan.load_json(out)
    task = Task.uniform("tables", tables, 3, 1.0)
    validate_plan(task, plan)
    assert plan == make_sharder("dreamshard", model=model).shard(task)  # the same as the library
    assert json.loads(out.read_text())["algorithm"] == "dreamshard"
    sampled = tmp_path / "sampled.json"
    assert main(_plan_argv(csv, sampled, "--model", str(model_file), "--samples", "4")) == 0
    validate_plan(task, Plan.load_json(sampled))


def test_cli_plans_with_dreamshard_cut_by_default_when_given_a_model(world, model, model_file, tmp_path):
    tables = world["test4"][1].tables
    csv = tmp_path / "tables.csv"
    tables_frame(tables).to_csv(csv, index=False)
    task = Task.uniform("tables", tables, 3, 1.0)
    for extra, algorithm in ((["--model", str(model_file)], "dreamshard_cut"), ([], "size_lookup_greedy")):
        out = tmp_path / f"{algorithm}.json"
        argv = ["plan", "--tables", str(csv), "--devices", "3", "--memory-gb", "1", "-o", str(out), *extra]
        assert main(argv) == 0
        assert json.loads(out.read_text())["algorithm"] == algorithm
        plan = Plan.load_json(out)
        options = {"model": model} if algorithm == "dreamshard_cut" else {}
        assert plan == make_sharder(algorithm, **options).shard(task)  # the same as the library


def _one_line_error(argv, capsys, *words):
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("dreamshard: error:") and "\n" not in err and "Traceback" not in err, err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"


def test_cli_dreamshard_without_bins_or_model_is_a_one_line_error(world, model_file, tmp_path, capsys):
    tables = world["test2"][0].tables
    bare = tmp_path / "bare.csv"
    tables_frame(tables, bins=False).to_csv(bare, index=False)
    out = tmp_path / "plan.json"
    _one_line_error(_plan_argv(bare, out, "--model", str(model_file)), capsys, tables[0].name, "bin_0..bin_16")
    assert not out.exists()
    csv = tmp_path / "tables.csv"
    tables_frame(tables).to_csv(csv, index=False)
    _one_line_error(_plan_argv(csv, out), capsys, "dreamshard", "--model")
    _one_line_error(_plan_argv(csv, out, "--model", str(tmp_path / "absent.pt")), capsys, "absent.pt")
    assert not out.exists()


# ---------------------------------------------------------------- NeuroShard

SEARCH = SearchConfig(beams=2, depth=4, candidates=3, scale_steps=6)


@pytest.fixture(scope="module")
def neuro(world, backend, scaler) -> NeuroShardModel:
    pool = list({t.name: t for task in world["train"] + world["train_more"] for t in task.tables}.values())
    cfg = AugmentConfig(compute_samples=60, max_tables=8, memory_cap_gb=1.0, comm_samples=300,
                        dims=(4, 8, 16, 32, 64, 128), seed=0)
    data = compute_dataset(backend, pool, cfg, world["train"][0])
    assert data.num_plans == 60 and (data.device_ms[:, 2] == 0).all()
    assert len(data.device_plan) == 60 and data.plan_cost_ms == pytest.approx(data.device_ms[:, :2].sum(axis=1))
    compute, losses = fit_compute_net(data, scaler, steps=300, lr=5e-3, batch=32, seed=0)
    assert np.mean(losses[-20:]) < 0.3 * np.mean(losses[:20])
    cases = comm_dataset(backend, [1, 2, 3, 4], pool, cfg.dims, cfg)
    assert len(cases) == 300
    for traffic, offsets, target in cases[:20]:
        fwd = offsets.max() - offsets  # any forward times with these offsets give the same comm
        np.testing.assert_allclose(target, np.stack(backend.communication_cost(fwd, traffic), axis=-1),
                                   rtol=1e-9, atol=1e-12)
    comm, _ = fit_comm_net(cases[60:], steps=300, lr=5e-3, batch=64, seed=0)
    held = comm_mape(comm, cases[:60])
    print("neuroshard comm held-out MAPE:", round(held, 3))
    assert held < 0.5  # observed about 0.1-0.2
    return NeuroShardModel(compute, comm, scaler, {"backend": backend.name})


def _check_slices(task: Task, plan: Plan) -> None:
    validate_plan(task, plan)
    dims = {t.name: t.dim for t in task.tables}
    covered = {name: 0 for name in dims}
    for s in plan.shards:
        width = s.col_end - s.col_start
        assert width > 0 and width % 4 == 0 and s.col_start % 4 == 0
        covered[s.table] += width
    assert covered == dims  # each table's columns exactly once (validate_plan rules out overlaps)
    used = device_memory_bytes(task, plan)
    assert all(u <= d.memory_bytes for u, d in zip(used, task.devices))


def _score(ev: _Evaluator, task: Task, plan: Plan) -> float:
    index = {t.name: i for i, t in enumerate(task.tables)}
    shards = tuple((index[s.table], s.col_start, s.col_end) for s in plan.shards)
    enc = ev.encode(shards)
    dev = np.zeros((task.num_devices, enc.shape[1]))
    traffic = np.zeros((task.num_devices, 2))
    blocks = as_blocks(task, shards)
    for s, e, tr in zip(plan.shards, enc, ev.traffic(blocks)):
        dev[s.device] += e
        traffic[s.device] += tr
    return float(ev.score(dev, traffic, blocks))


def test_neuroshard_plans_are_valid_and_no_worse_than_its_greedy_start(world, neuro):
    sharder = make_sharder("neuroshard", model=neuro, search=SEARCH)
    assert isinstance(sharder, NeuroShardSharder)
    for task in world["test2"] + world["test4"] + world["tight"]:
        plan = sharder.shard(task)
        _check_slices(task, plan)
        ev = _Evaluator(neuro, task)
        root = tuple((i, 0, t.dim) for i, t in enumerate(task.tables))
        start = greedy_grid(ev, root, SEARCH)
        final = _score(ev, task, plan)
        if start is not None:
            assert final <= start[0] * (1 + 1e-6), (task.name, final, start[0])


def _table_with_bins(name: str, rows: int, dim: int, pooling: float, alpha: float, seed: int) -> Table:
    idx, _ = generate_lookups(TableProfile(rows, pooling, alpha), 512, seed)
    return Table(name, rows, dim, pooling, tuple(access_count_bins(np.unique(idx, return_counts=True)[1])))


def test_neuroshard_splits_the_table_that_dominates_the_step(neuro):
    """One table with most of the work on two devices: whole, it sets the step time on its device;
    its column halves on both devices share the work, so the search must split it."""
    hot = _table_with_bins("hot", 80_000, 128, 90.0, 0.6, 1)
    small = [_table_with_bins(f"small{i}", 500, 4, 1.0, 1.0, 2 + i) for i in range(3)]
    task = Task.uniform("one-hot-table", [hot, *small], 2, 1.0)
    plan = make_sharder("neuroshard", model=neuro, search=SEARCH).shard(task)
    _check_slices(task, plan)
    pieces = [s for s in plan.shards if s.table == "hot"]
    assert len(pieces) >= 2 and len({s.device for s in pieces}) == 2, plan.shards


def test_neuroshard_respects_memory_on_tight_tasks(world, neuro):
    sharder = NeuroShardSharder(neuro, SearchConfig(beams=3, depth=6, candidates=5))
    for task in world["tight"]:
        plan = sharder.shard(task)
        _check_slices(task, plan)
        used = device_memory_bytes(task, plan)
        assert max(u / d.memory_bytes for u, d in zip(used, task.devices)) > 0.5  # memory does bind here


def test_neuroshard_model_save_load_round_trip(world, neuro, tmp_path):
    path = tmp_path / "neuroshard.pt"
    neuro.save(path)
    loaded = NeuroShardModel.load(path)
    assert loaded.meta == neuro.meta and loaded.scaler == neuro.scaler
    a = make_sharder("neuroshard", model=neuro, search=SEARCH)
    b = make_sharder("neuroshard", model=load_model("neuroshard", str(path)),
                     search=SearchConfig(beams=2, depth=4, candidates=3, scale_steps=6))
    for task in world["test2"][:3] + world["test4"][:2] + world["tight"][:2]:
        assert a.shard(task) == b.shard(task)
    LearnedModel(neuro.compute, PolicyNetConfig().build(torch.Generator()), neuro.scaler, {}).save(tmp_path / "wrong.pt")
    with pytest.raises(DataFormatError, match="expected a 'neuroshard' checkpoint, found a 'policy' one"):
        NeuroShardModel.load(tmp_path / "wrong.pt")
    with pytest.raises(ValueError, match="needs a trained model"):
        make_sharder("neuroshard")


def test_neuroshard_infeasible_task_raises(world, neuro):
    tables = world["test4"][0].tables
    need = sum(MemoryModel().shard_bytes(t.rows, t.dim) for t in tables)
    task = Task.uniform("too-small", tables, 2, 0.45 * need / GB)  # 90% of what the tables need
    with pytest.raises(InfeasibleTaskError):
        make_sharder("neuroshard", model=neuro, search=SEARCH).shard(task)


def test_training_rollout_and_the_sharder_decode_the_same_plan(world, model):
    """One decoding rule: the greedy rollout on the estimated MDP (training) and PolicySharder (planning) give the
    same plan for the same model and task wherever the first choices fit (no dead end to back up from)."""
    checked = 0
    for task in world["test2"] + world["test4"] + world["train"]:
        ep = rollout(model.policy, model.cost_net, TaskContext.build(task, model.cost_net, model.scaler), 1,
                     greedy=True)
        if ep.dead.any():
            continue
        checked += 1
        assert Plan.from_assignment(task, ep.assignment[0].tolist()) == make_sharder("dreamshard", model=model).shard(task)
    assert checked >= 12


def test_both_decoders_break_a_tie_to_the_lowest_device_whatever_the_rounding():
    """Devices in one state tie; float32 (the rollout) and float64 (the planner) can round their logits apart
    either way. Within LOGIT_TIE both take the lowest index; beyond it, the better logit."""
    base = 1.2991957902908325
    rounded_up = np.nextafter(np.float32(base), np.float32(2))  # device 1 one float32 step above device 0
    assert greedy_devices(torch.tensor([[base, rounded_up, -torch.inf]], dtype=torch.float32)).tolist() == [0]
    assert greedy_devices(torch.tensor([[base, base + 1e-3, base - 1.0]])).tolist() == [1]  # a real gap
    assert rank_devices(np.array([base, float(rounded_up), base - 1.0])) == [0, 1, 2]
    assert rank_devices(np.array([base - 1.0, base, base + 3e-6, base + 1e-3])) == [3, 1, 2, 0]
    assert rank_devices(np.array([0.5, 2.0, 1.0])) == [1, 2, 0]
    noisy = np.random.default_rng(0).normal(size=(200, 8))
    assert all(rank_devices(row) == np.argsort(-row, kind="stable").tolist() for row in noisy)  # no tie: by logit


def small_tasks(backend) -> list[tuple[Task, float]]:
    """Ten tasks of six unseen tables on two devices, each with its brute-force optimum (every plan costed)."""
    pool = make_tables(2, 60, "te")
    rng = np.random.default_rng(0)
    out = []
    for k in range(10):
        task = Task.uniform(f"small/{k}", [pool[int(i)] for i in rng.choice(len(pool), 6, replace=False)], 2, 1.0)
        out.append((task, exhaustive_optimum(backend, task, "super_additive").optimum.cost_ms))
    return out


@pytest.fixture(scope="module")
def single_devices(world, backend) -> CostData:
    """300 single-device measurements of the training tables (as the collect_devices stage makes them)."""
    pool = list({t.name: t for task in world["train"] for t in task.tables}.values())
    cfg = AugmentConfig(compute_samples=300, max_tables=15, memory_cap_gb=1.0, seed=0)
    return compute_dataset(backend, pool, cfg, world["train"][0])


@pytest.fixture(scope="module")
def product_model(world, backend, scaler, single_devices) -> LearnedModel:
    """DreamShard as the pipeline trains it: communication from the all-to-all model, single devices in every fit."""
    data = measured(backend, world["train"], 40, 0)
    cost_config = CostNetConfig.with_topology(backend.config.topology, BATCH, comm="model")
    trainer = Trainer(world["train"], backend, scaler, TrainConfig(**TRAIN, baseline="greedy"), data,
                      devices=single_devices, cost_config=cost_config)
    train_dreamshard(trainer)
    return trainer.model("dreamshard", {})


def test_model_communication_and_single_devices_rank_the_plans_of_small_unseen_tasks(world, backend, scaler,
                                                                                     single_devices):
    """The cost network's plan ranking on tasks smaller than any it trained on, every plan costed. A comm head
    reads one device and cannot see the wait for the slowest forward: its ranking is near chance; the all-to-all
    model with single-device data ranks well, and its cheapest plan is near the optimum."""
    data = measured(backend, world["train"], 40, 0)
    tasks = small_tasks(backend)
    plans = [(t, Plan.from_assignment(t, a)) for t, _ in tasks for a in canonical_assignments(6, 2)]
    every = cost_data_from_plans([(t, p, backend.plan_cost(t, p)) for t, p in plans])
    per_task = len(plans) // len(tasks)
    result = {}
    for name, comm, devices in (("head", "head", None), ("model", "model", single_devices)):
        config = CostNetConfig.with_topology(backend.config.topology, BATCH, comm=comm, scale_ms=median_device_ms(data))
        net = config.build(torch.Generator().manual_seed(0))
        fit_cost_net(net, scaler, data, steps=300, lr=3e-3, batch_plans=32, seed=0, devices=devices)
        predicted, cost = plan_predictions(net, scaler, every)
        taus, found = [], []
        for k, (_, optimum) in enumerate(tasks):
            p, c = predicted[k * per_task:(k + 1) * per_task], cost[k * per_task:(k + 1) * per_task]
            taus.append(kendall_tau(p, c))
            found.append(c[int(np.argmin(p))] / optimum)
        result[name] = (float(np.mean(taus)), float(np.mean(found)))
    # observed: head tau 0.15, its cheapest-rated plans 1.21x the optimum; model 0.57 and 1.07x
    assert result["model"][0] >= 0.5 and result["head"][0] <= 0.3
    assert result["model"][1] < 1.1 < result["head"][1]


@pytest.mark.xfail(strict=True, reason="issue 13: trained as the pipeline trains it (communication from the model, "
                                       "single devices), DreamShard reaches the brute-force optimum of 6 of these 10 "
                                       "small tasks (mean 1.03x; 3 of 10, mean 1.34x, with the comm head and no single "
                                       "devices), where the better of two greedy heuristics is within 2.5% on all 10 "
                                       "(exactly on 8). Trained on these very 10 tasks it reaches 5-8 of 10 over 5 "
                                       "seeds (mean 1.004-1.015x): up to 3 other plans of a task lie within 2% of its optimum, "
                                       "closer than the cost network's error")
def test_the_policy_finds_the_known_optimum_of_small_tasks(backend, product_model):
    """Six unseen tables on two devices: every plan costed (exhaustive_optimum), the trained policy's against it."""
    sharder, reached, greedy, ratios = make_sharder("dreamshard", model=product_model), 0, [], []
    for task, optimum in small_tasks(backend):
        ratios.append(backend.plan_cost(task, sharder.shard(task)).cost_ms / optimum)
        reached += ratios[-1] <= 1 + 1e-9
        greedy.append(min(backend.plan_cost(task, make_sharder(h).shard(task)).cost_ms
                          for h in ("lookup_greedy", "size_lookup_greedy")) / optimum)
    assert max(greedy) < 1.03  # the bar is reachable: a plain heuristic is there
    assert reached >= 8


@pytest.mark.parametrize("learner", ["dreamshard", "autoshard"])
def test_trained_on_one_small_task_the_policy_reaches_its_known_optimum(backend, learner):
    """The learning itself, apart from generalising: trained on one small task (six tables, two devices, every plan
    costed by exhaustive_optimum), DreamShard on its estimated MDP and AutoShard on measured rewards reach that
    task's optimum. Per task a fresh scaler, 5 measured plans to start from, communication from the model;
    observed over seeds 0-3: AutoShard 7-8 of 10 exactly (the rest within 2.7%), DreamShard 7-9 of 10 (within
    8.5%; mean at most 1.012); untrained (policy_lr 1e-9) 4 of 10, mean 1.088; a random plan is one of 32."""
    reached, ratios, random_reached = 0, [], 0
    for task, optimum in small_tasks(backend):
        scaler = FeatureScaler.fit(table_features(task.tables, task.memory))
        cost_config = CostNetConfig.with_topology(backend.config.topology, BATCH, comm="model")
        data = measured(backend, [task], 5, 0)
        if learner == "dreamshard":
            config = TrainConfig(iterations=4, plans_per_iteration=8, cost_steps=300, cost_lr=3e-3, policy_updates=20,
                                 episodes=8, policy_lr=5e-3, baseline="greedy", seed=0)
        else:
            config = TrainConfig(measurement_budget=160, episodes=8, policy_lr=5e-3, cost_steps=100, cost_lr=3e-3,
                                 refit_steps=30, seed=0)
        trainer = Trainer([task], backend, scaler, config, data, cost_config=cost_config)
        (train_dreamshard if learner == "dreamshard" else train_autoshard)(trainer)
        plan = make_sharder("dreamshard", model=trainer.model(learner, {})).shard(task)
        ratios.append(backend.plan_cost(task, plan).cost_ms / optimum)
        reached += ratios[-1] <= 1 + 1e-9
        random_reached += backend.plan_cost(task, make_sharder("random", seed=0).shard(task)).cost_ms <= optimum * (1 + 1e-9)
    print(f"{learner} trained on each small task: optimum reached on {reached} of 10, ratios {np.round(ratios, 3)}; "
          f"random {random_reached}")
    assert reached >= 6 and np.mean(ratios) <= 1.02
    assert random_reached <= 3


# ---------------------------------------------------------------- DreamShard with cuts (sharders/cuts.py)


def _cut_optimum(backend, task: Task) -> float:
    """The cheapest plan of a 2-device task over every cut of every table (whole, column halves in either order,
    TorchRec's row-wise halves: block i on device i) and every placement of the whole tables, by the backend:
    the brute-force reference."""
    best = math.inf
    choices = []
    for t in task.tables:
        half, rows = 4 * (t.dim // 8), -(-t.rows // 2)
        ways = [None]
        if t.dim >= 8:
            ways += [[Shard(t.name, 0, 0, half), Shard(t.name, 1, half, t.dim)],
                     [Shard(t.name, 1, 0, half), Shard(t.name, 0, half, t.dim)]]
        if t.rows >= 2:
            ways.append([Shard(t.name, 0, 0, t.dim, 0, rows), Shard(t.name, 1, 0, t.dim, rows, t.rows)])
        choices.append(ways)
    for cut in itertools.product(*choices):
        whole = [t for t, c in zip(task.tables, cut) if c is None]
        pieces = [s for c in cut if c is not None for s in c]
        for devices in itertools.product(range(2), repeat=len(whole)):
            plan = Plan(2, tuple([Shard(t.name, d, 0, t.dim) for t, d in zip(whole, devices)] + pieces))
            if all(u <= task.capacity(d) for d, u in enumerate(device_memory_bytes(task, plan))):
                best = min(best, backend.plan_cost(task, plan).cost_ms)
    return best


@pytest.fixture(scope="module")
def cut_model(world, backend, scaler) -> LearnedModel:
    """DreamShard trained as the pipeline trains it: measured plans with cuts among them (collect.cut_fraction),
    single devices at random dims (collect_devices) and the all-to-all model for communication (train_cost.comm)."""
    data = measured(backend, world["train"], 60, 0, cut_fraction=0.3)
    pool = list({t.name: t for task in world["train"] + world["train_more"] for t in task.tables}.values())
    single = compute_dataset(backend, pool, AugmentConfig(compute_samples=100, max_tables=8, memory_cap_gb=1.0,
                                                          comm_samples=1, dims=(4, 8, 16, 32, 64, 128), seed=0),
                             world["train"][0])
    config = CostNetConfig.with_topology(backend.config.topology, BATCH, comm="model")
    trainer = Trainer(world["train"], backend, scaler, TrainConfig(**TRAIN), data, cost_config=config, devices=single)
    train_dreamshard(trainer)
    return trainer.model("dreamshard", {"note": "test"})


def test_dreamshard_cut_reaches_the_optimum_that_needs_a_cut(backend, cut_model):
    """One table with most of the work on two devices: every plan of whole tables leaves it on one device, so
    table-wise DreamShard stays far above the optimum; DreamShard with cuts, the same trained model, must come
    within 2% of the brute-force optimum over cuts and placements."""
    hot = _table_with_bins("hot", 80_000, 128, 90.0, 0.6, 1)
    small = [_table_with_bins(f"small{i}", 500, 4, 1.0, 1.0, 2 + i) for i in range(3)]
    task = Task.uniform("one-hot-table", [hot, *small], 2, 1.0)
    best = _cut_optimum(backend, task)
    cut_plan = make_sharder("dreamshard_cut", model=cut_model).shard(task)
    validate_plan(task, cut_plan)
    table_wise = make_sharder("dreamshard", model=cut_model).shard(task)
    cut_cost, whole_cost = backend.plan_cost(task, cut_plan).cost_ms, backend.plan_cost(task, table_wise).cost_ms
    print(f"optimum {best:.4f} ms, dreamshard_cut {cut_cost:.4f}, dreamshard {whole_cost:.4f}")
    assert cut_cost <= 1.02 * best
    assert whole_cost > 1.02 * best
    assert len({s.device for s in cut_plan.shards if s.table == "hot"}) == 2


def test_dreamshard_cut_lays_a_hot_table_over_one_host_where_the_task_allows_it(backend, cut_model):
    """Two hosts of two devices and a table with most of the work, which the task lets be whole or row-wise over
    one host's devices (TorchRec's table_row_wise) only: DreamShard with cuts lays it over one host, which the
    backend measures cheaper than table-wise DreamShard's plan; without host cuts (the default) it stays whole."""
    from dreamshard.sharders.cuts import CutConfig

    hot = _table_with_bins("hot", 80_000, 128, 90.0, 0.6, 1)
    small = [_table_with_bins(f"small{i}", 500, 4, 1.0, 1.0, 2 + i) for i in range(6)]
    task = Task.uniform("hot-on-two-hosts", [hot, *small], 4, 1.0, per_host=2, sharding=("table", "host"))
    plan = make_sharder("dreamshard_cut", model=cut_model, cuts=CutConfig(host_wise=True)).shard(task)
    validate_plan(task, plan)
    assert sorted(s.device for s in plan.shards if s.table == "hot") in ([0, 1], [2, 3])
    whole = make_sharder("dreamshard", model=cut_model).shard(task)
    assert backend.plan_cost(task, plan).cost_ms < backend.plan_cost(task, whole).cost_ms
    kept = make_sharder("dreamshard_cut", model=cut_model).shard(task)  # host_wise off by default
    assert len([s for s in kept.shards if s.table == "hot"]) == 1


def test_dreamshard_cut_plans_are_valid_and_never_rated_worse_than_dreamshard(world, cut_model):
    """Every test task, tight ones included: valid plans (memory, each table's columns and rows once, row-wise
    blocks where TorchRec puts them), and, where no table must be cut (must_cut_share 0), the cost network rates
    them no worse than table-wise DreamShard's (the search starts from its plan and only takes gains; a table that
    must be cut may cost more cut, by the lookup groups' dists)."""
    from dreamshard.sharders.cuts import CutConfig, CutSearchSharder

    def sharder(**config):
        out = make_sharder("dreamshard_cut", model=cut_model, cuts=CutConfig(must_cut_share=0.0, **config))
        assert isinstance(out, CutSearchSharder)
        return out

    default = make_sharder("dreamshard_cut", model=cut_model)
    for task in world["test2"] + world["test4"] + world["tight"]:
        plan = sharder().shard(task)
        for each in (default.shard(task), plan):
            validate_plan(task, each)
            for t in task.tables:
                rows = sorted((s.row_start, s.row_end, s.device) for s in each.shards
                              if s.table == t.name and s.is_row_range)
                if rows:  # TorchRec's row-wise layout: block i on device i
                    assert rows == [(a, b, d) for d, (a, b) in enumerate(row_blocks(t.rows, task.num_devices))]
        whole = make_sharder("dreamshard", model=cut_model).shard(task)
        u = _Universe.build(task, cut_model, [cut_options(task, t, CutConfig()) for t in task.tables])
        assert _rated(u, task, plan) <= _rated(u, task, whole) * (1 + 1e-9), task.name
        # the start near TorchRec's plans (row_start) only adds a candidate: never rated worse than without it
        two_starts = sharder(row_start=True).shard(task)
        validate_plan(task, two_starts)
        assert _rated(u, task, two_starts) <= _rated(u, task, plan) * (1 + 1e-9), task.name
        # so do the starts with the costliest tables row-wise (row_shares)
        shares = sharder(row_shares=[0.25, 0.5]).shard(task)
        validate_plan(task, shares)
        assert _rated(u, task, shares) <= _rated(u, task, plan) * (1 + 1e-9), task.name
        # and the start with the dominant tables row-wise (on by default): without it, never rated better
        fewer = sharder(dominant_start=False).shard(task)
        validate_plan(task, fewer)
        assert _rated(u, task, plan) <= _rated(u, task, fewer) * (1 + 1e-9), task.name
    for bad in ([0.0], [1.5], "0.25", [True]):
        with pytest.raises(ValueError, match="row_shares: expected a list of shares in"):
            CutConfig(row_shares=bad)


def test_dominant_start_cuts_the_largest_tables_too_where_its_blocks_leave_no_room(backend, cut_model, monkeypatch):
    """A dominant table's row-wise blocks go to every device; where a large whole table then fits on none, the
    dominant start is infeasible. dominant_room > 0 retries it with the largest other tables row-wise too."""
    from dreamshard.sharders.cuts import CutConfig, CutSearchSharder

    hot = _table_with_bins("hot", 80_000, 128, 90.0, 0.6, 1)
    big = _table_with_bins("big", 96_000, 128, 1.0, 1.0, 9)  # more bytes than hot, little work
    small = [_table_with_bins(f"small{i}", 500, 4, 1.0, 1.0, 2 + i) for i in range(3)]
    probe = Task.uniform("probe", [hot], 2, 1.0)
    block = probe.shard_bytes(hot, hot.rows // 2)
    # devices that hold the big table whole, or the hot one and the small ones, but not the big one beside a block
    memory_gb = (probe.shard_bytes(big) + block / 2) / GB
    task = Task.uniform("room", [hot, big, *small], 2, memory_gb)
    assert task.shard_bytes(big) <= task.capacity(0) < task.shard_bytes(big) + block
    starts: list[set[str]] = []
    search = CutSearchSharder._search

    def spy(self, task, u, options, cuts, where):
        starts.append({t.name for t, k in zip(task.tables, cuts) if k == ROW_WISE})
        return search(self, task, u, options, cuts, where)

    monkeypatch.setattr(CutSearchSharder, "_search", spy)
    plans = {}
    for room in (0, 1):
        starts.clear()
        # no table must be cut, so that the plans differ by the starts alone (a must-cut end may be rated dearer)
        plans[room] = make_sharder("dreamshard_cut", model=cut_model,
                                   cuts=CutConfig(dominant_room=room, must_cut_share=0.0)).shard(task)
        validate_plan(task, plans[room])
        found = [s for s in starts if "hot" in s]
        assert found == ([] if room == 0 else [{"hot", "big"}]), (room, starts)
    u = _Universe.build(task, cut_model, [cut_options(task, t, CutConfig()) for t in task.tables])
    assert _rated(u, task, plans[1]) <= _rated(u, task, plans[0]) * (1 + 1e-9)  # only a start more
    with pytest.raises(ValueError, match="dominant_room: expected an integer >= 0"):
        CutConfig(dominant_room=-1)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="dominant_share: expected a number in"):
            CutConfig(dominant_share=bad)


def test_cut_gain_keeps_whole_tables_unless_a_plan_with_cuts_is_rated_that_much_cheaper(backend, cut_model):
    """`cut_gain`: a plan with cuts replaces the best plan of whole tables the search saw only where the cost
    network rates it cheaper by at least that share. On the one-hot-table task the cut plan's rated gain is g:
    just under g it stays, just over g the plan is of whole tables, never rated worse than table-wise DreamShard."""
    from dreamshard.sharders.cuts import CutConfig

    hot = _table_with_bins("hot", 80_000, 128, 90.0, 0.6, 1)
    small = [_table_with_bins(f"small{i}", 500, 4, 1.0, 1.0, 2 + i) for i in range(3)]
    task = Task.uniform("one-hot-table", [hot, *small], 2, 1.0)
    u = _Universe.build(task, cut_model, [cut_options(task, t, CutConfig()) for t in task.tables])

    def plan(gain: float) -> Plan:
        # must_cut_share off: the hot table is costlier alone than a fair share (the next test)
        out = make_sharder("dreamshard_cut", model=cut_model,
                           cuts=CutConfig(cut_gain=gain, must_cut_share=0.0)).shard(task)
        validate_plan(task, out)
        return out

    def has_cuts(p: Plan) -> bool:
        return len(p.shards) > len({s.table for s in p.shards})

    cut, whole = plan(0.0), plan(0.99)
    assert has_cuts(cut) and not has_cuts(whole)
    gain = 1 - _rated(u, task, cut) / _rated(u, task, whole)
    assert 0.05 < gain < 0.95, gain
    assert sorted(map(str, plan(0.9 * gain).shards)) == sorted(map(str, cut.shards))
    assert sorted(map(str, plan(min(0.99, 1.1 * gain)).shards)) == sorted(map(str, whole.shards))
    table_wise = make_sharder("dreamshard", model=cut_model).shard(task)
    assert _rated(u, task, whole) <= _rated(u, task, table_wise) * (1 + 1e-9)
    for bad in (-0.1, 1.0, True, "0.02"):
        with pytest.raises(ValueError, match="cut_gain: expected a number in"):
            CutConfig(cut_gain=bad)


def test_a_table_costlier_alone_than_a_fair_share_is_cut_even_where_whole_tables_are_rated_cheaper(cut_model,
                                                                                                monkeypatch):
    """`must_cut_share`: on the one-hot-table task the hot table alone is rated costlier than a device's fair share.
    With a cut_gain no plan with cuts can meet (0.99), the plan is of whole tables unless must_cut_share applies;
    then the hot table is cut all the same, and only it. So too where every plan that cuts it is rated dearer
    than any plan of whole tables (the network's rating of the search's ends made 1000 ms dearer when hot is cut)."""
    from dreamshard.sharders.cuts import CutConfig

    hot = _table_with_bins("hot", 80_000, 128, 90.0, 0.6, 1)
    small = [_table_with_bins(f"small{i}", 500, 4, 1.0, 1.0, 2 + i) for i in range(3)]
    task = Task.uniform("one-hot-table", [hot, *small], 2, 1.0)

    def devices_of(share: float) -> dict[str, set[int]]:
        plan = make_sharder("dreamshard_cut", model=cut_model,
                            cuts=CutConfig(cut_gain=0.99, must_cut_share=share)).shard(task)
        validate_plan(task, plan)
        return {t.name: {s.device for s in plan.shards if s.table == t.name} for t in task.tables}

    assert all(len(d) == 1 for d in devices_of(0.0).values())  # off: whole tables
    on = devices_of(1.0)
    assert len(on["hot"]) == 2 and all(len(on[t.name]) == 1 for t in small)
    assert all(len(d) == 1 for d in devices_of(50.0).values())  # no table is rated 50 fair shares
    rated = _Universe.cost
    monkeypatch.setattr(_Universe, "cost", lambda u, cuts, where: rated(u, cuts, where) + 1000.0 * (cuts[0] != 1))
    assert all(len(d) == 1 for d in devices_of(0.0).values())
    assert len(devices_of(1.0)["hot"]) == 2
    for bad in (-1.0, True, "1"):
        with pytest.raises(ValueError, match="must_cut_share: expected a number >= 0"):
            CutConfig(must_cut_share=bad)


def test_min_row_rows_keeps_smaller_tables_from_row_wise_cuts():
    """Off (0) by default: measured, a floor on the rows of a row-wise cut made more plans dearer than cheaper
    (results/cut_designs/min-row-rows)."""
    from dreamshard.sharders.cuts import CutConfig

    small, big = Table("small", 3000, 32, 50.0), Table("big", 200_000, 32, 5.0)
    task = Task.uniform("floor", [small, big], 4, 1.0)
    assert all(ROW_WISE in cut_options(task, t, CutConfig()) for t in (small, big))
    floor = CutConfig(min_row_rows=4096)
    assert ROW_WISE not in cut_options(task, small, floor) and ROW_WISE in cut_options(task, big, floor)
    assert cut_options(task, small, floor)[:2] == [1, 2]  # column slices stay
    with pytest.raises(ValueError, match="min_row_rows: expected an integer >= 0"):
        CutConfig(min_row_rows=-1)


def _rated(u, task: Task, plan: Plan) -> float:
    """The cost network's device-max estimate of `plan`, through the universe's pieces (sharders/cuts.py)."""
    return u.cost(*_cuts_where(task, plan))


def _cuts_where(task: Task, plan: Plan) -> tuple[list[int], list[list[int]]]:
    """`plan` as the cut search holds it: each table's cut and its pieces' devices."""
    from dreamshard.sharders.cuts import host_cut

    cuts, where = [], []
    for t in task.tables:
        shards = sorted((s for s in plan.shards if s.table == t.name), key=lambda s: (s.row_start, s.col_start))
        on_host = shards[0].is_row_range and len(shards) < task.num_devices  # row-wise over one host's devices
        cuts.append(host_cut(shards[0].device // (task.per_host() or 1)) if on_host
                    else ROW_WISE if shards[0].is_row_range else len(shards))
        where.append([s.device for s in shards])
    return cuts, where


# ---------------------------------------------------------------- cost estimators


def test_every_cost_estimator_rates_a_plan_as_its_own_search_does(world, model, neuro, backend):
    """The CostEstimator of each model (the cost network's NetworkEstimate, a NeuroShardModel) rates a plan as the
    model's own search scores it: the cut search's scorer, NeuroShard's evaluator. Neither is a measurement; the
    backend is. Re-planning takes any of them."""
    from dreamshard.hardware.base import CostEstimator
    from dreamshard.learning.cost_model import NetworkEstimate
    from dreamshard.sharders.replan import replan

    network = NetworkEstimate(model.cost_net, model.scaler)
    estimators: list[CostEstimator] = [network, neuro, backend]
    from dataclasses import replace

    for task in world["test4"][:2]:  # devices of different speeds: each estimate computes at a device's speed
        task = replace(task, devices=tuple(replace(d, speed=v) for d, v in zip(task.devices, (1.0, 0.5, 2.0, 1.0))))
        plan = make_sharder("size_lookup_greedy").shard(task)
        where = [[next(s.device for s in plan.shards if s.table == t.name)] for t in task.tables]
        u = _Universe.build(task, model, [[1] for _ in task.tables])
        assert network.plan_cost(task, plan).cost_ms == pytest.approx(u.cost([1] * len(task.tables), where), rel=1e-4)
        ev = _Evaluator(neuro, task)
        blocks = as_blocks(task, [(i, 0, t.dim) for i, t in enumerate(task.tables)])
        enc = ev.encode(blocks)
        sums = np.zeros((task.num_devices, enc.shape[-1]))
        traffic = np.zeros((task.num_devices, 2))
        for i, t in enumerate(task.tables):
            sums[where[i][0]] += enc[i]
            traffic[where[i][0]] += shard_traffic(t, t.dim)
        assert neuro.plan_cost(task, plan).cost_ms == pytest.approx(float(ev.score(sums, traffic, blocks)), rel=1e-4)
        costs = [e.plan_cost(task, plan) for e in estimators]
        assert [c.measured for c in costs] == [False, False, backend.measured]
        assert all(len(c.devices) == task.num_devices and c.cost_ms > 0 for c in costs)
        for estimator in estimators:  # re-planning takes any estimator; with no budget it keeps the plan
            r = replan(task, plan, make_sharder("size_lookup_greedy"), 0, estimator)
            assert r.plan.key() == plan.key() and r.cost_ms == pytest.approx(estimator.plan_cost(task, plan).cost_ms)
