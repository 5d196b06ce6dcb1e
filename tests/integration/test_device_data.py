"""Single-device measurements (dreamshard/learning/devices.py, stage collect_devices) and the cost network's
communication from the all-to-all model (CostNetConfig.comm = "model"), on the analytic backend."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from dreamshard.errors import DataFormatError
from dreamshard.hardware.analytic import AnalyticBackend
from dreamshard.hardware.base import ComputeCost
from dreamshard.hardware.comm import Topology, communication_ms, dist_latency_ms
from dreamshard.learning.cost_model import CostNetConfig, DeviceLinks, cost_data_from_plans, device_predictions
from dreamshard.learning.devices import (
    DeviceJournal,
    cost_data_from_device_rows,
    device_samples,
    measure_samples,
    pending,
)
from dreamshard.plan import Plan
from dreamshard.project.fit_data import load_single_devices
from dreamshard.project.params import ParamsError
from dreamshard.tasks import Task
from helpers import TINY_EXTRA as EXTRA
from helpers import analytic as analytic_backend
from stages import collect_devices


@pytest.fixture(scope="module")
def data(tiny_project):
    level = tiny_project("tasks")
    tasks = level.tasks("train")
    pool = list({t.name: t for task in tasks for t in task.tables}.values())
    return level.params, tasks, pool


@pytest.fixture
def analytic() -> AnalyticBackend:
    return analytic_backend(batch_size=512)


class Crashing:
    """Delegates to a backend; compute_cost raises once `fail_after` operators were measured."""

    def __init__(self, inner, fail_after: int) -> None:
        self.inner, self.fail_after, self.calls = inner, fail_after, 0
        self.name, self.measured = inner.name, inner.measured

    def device_name(self):
        return self.inner.device_name()

    def compute_cost(self, task, shards):
        if self.calls >= self.fail_after:
            raise RuntimeError("injected crash")
        self.calls += 1
        return self.inner.compute_cost(task, shards)

    def plan_cost_from(self, task, plan, compute):
        return self.inner.plan_cost_from(task, plan, compute)


def test_samples_are_seeded_fit_the_cap_and_use_the_dims(data):
    _, tasks, pool = data
    a = device_samples(pool, 30, 4, 0.01, [4, 8], tasks[0], seed=1)
    assert a == device_samples(pool, 30, 4, 0.01, [4, 8], tasks[0], seed=1)
    assert a != device_samples(pool, 30, 4, 0.01, [4, 8], tasks[0], seed=2)
    names = {t.name for t in pool}
    for s in a:
        assert 1 <= len(s.tables) <= 4 and {t.dim for t in s.tables} <= {4, 8} and {t.name for t in s.tables} <= names
        assert sum(tasks[0].memory.shard_bytes(t.rows, t.dim) for t in s.tables) <= 0.01 * 2**30


def test_resume_after_a_crash_loses_and_repeats_nothing(data, analytic, tmp_path):
    _, tasks, pool = data
    samples = device_samples(pool, 12, 4, 1.0, [4, 8, 16], tasks[0], seed=0)
    reference = measure_samples(analytic, samples, tasks[0], EXTRA)
    journal = DeviceJournal(tmp_path / "journal")
    crashing = Crashing(analytic, fail_after=7)
    with pytest.raises(RuntimeError, match="injected crash"):
        for chunk in pending(samples, journal.done(), 3):
            journal.write_chunk(measure_samples(crashing, chunk, tasks[0], EXTRA))
    assert journal.done() == {s.index for s in samples[:6]}  # two whole chunks; the crashed one is not there
    counter = Crashing(analytic, fail_after=10**9)
    for chunk in pending(samples, journal.done(), 3):
        journal.write_chunk(measure_samples(counter, chunk, tasks[0], EXTRA))
    assert counter.calls == len(samples) - 6
    pd.testing.assert_frame_equal(journal.read(samples), pd.DataFrame(reference))


def test_rows_give_the_measured_costs_back_and_bad_rows_are_named(data, analytic):
    _, tasks, pool = data
    samples = device_samples(pool, 6, 3, 1.0, [4, 16], tasks[0], seed=0)
    rows = pd.DataFrame(measure_samples(analytic, samples, tasks[0], EXTRA))
    d = cost_data_from_device_rows(rows, pool, tasks[0], "devices.parquet")
    assert d.num_plans == len(samples) and (d.device_plan == np.arange(len(samples))).all()
    np.testing.assert_allclose(d.device_ms[:, :2], rows[["fwd_ms", "bwd_ms"]].to_numpy())
    assert (d.device_ms[:, 2] == 0).all()
    widths = np.zeros(len(samples))
    np.add.at(widths, d.shard_device, d.shard_raw[:, 0])
    assert widths.tolist() == [float(sum(s)) for s in rows["dims"]]
    with pytest.raises(DataFormatError, match="devices.parquet: missing column"):
        cost_data_from_device_rows(rows.drop(columns="dims"), pool, tasks[0], "devices.parquet")
    with pytest.raises(DataFormatError, match=r"devices.parquet: sample \d+: table\(s\) t-other"):
        cost_data_from_device_rows(rows.assign(tables=[["t-other"]] * len(rows)), pool, tasks[0], "devices.parquet")


def test_collect_devices_stage_end_to_end_and_its_reader(data, tmp_path):
    params, tasks, _ = data
    params = copy.deepcopy(params)
    params["paths"]["single_devices"] = str(tmp_path / "single_devices")  # the tiny project is read-only
    collect_devices.run(params)
    out = Path(params["paths"]["single_devices"])
    assert sorted(p.name for p in out.iterdir()) == ["devices.parquet"]  # the journal is merged and gone
    rows = pd.read_parquet(out / "devices.parquet")
    assert len(rows) <= params["collect_devices"]["samples"] and rows["sample"].is_monotonic_increasing
    assert set(rows["backend"]) == {"analytic"} and not rows["measured"].any() and (rows["batch_size"] == 512).all()
    single = load_single_devices(params, tasks)
    assert single is not None and single.num_plans == len(rows)
    assert load_single_devices({**params, "train_cost": {**params["train_cost"], "device_data": False}}, tasks) is None
    collect_devices.run(params)  # a rerun: the same rows
    pd.testing.assert_frame_equal(pd.read_parquet(out / "devices.parquet"), rows)
    bad = copy.deepcopy(params)
    bad["collect_devices"]["samples"] = 0
    with pytest.raises(ParamsError, match="collect_devices.samples: expected an integer >= 1"):
        collect_devices.run(bad)


# ---------------------------------------------------------------- communication from the model


def test_model_communication_is_the_all_to_all_of_the_predicted_forwards():
    """The oracle: hardware/comm.py's communication_ms, given the network's own forward predictions."""
    topology = Topology(devices_per_host=2, intra_host_gbps=100.0, inter_host_gbps=5.0, latency_us=20.0)
    config = CostNetConfig.with_topology(topology, 1024, comm="model", scale_ms=3.0)
    net = config.build(torch.Generator().manual_seed(0))
    sums = torch.rand(2, 3, config.embed, generator=torch.Generator().manual_seed(1))  # 2 plans of 3 devices
    dims = torch.tensor([[[64.0, 90.0], [8.0, 12.0], [200.0, 400.0]], [[0.0, 0.0], [32.0, 30.0], [32.0, 50.0]]])
    cluster = DeviceLinks.of(config, [1.0, 2.0, 1.0])
    with torch.no_grad():
        got = net.device_costs(sums, dims, cluster).double().numpy()
        heads = net.head_costs(sums).double().numpy()
        plan = net.plan_cost(sums, dims, cluster).double().numpy()
    for p in range(2):
        fwd = heads[p, :, 0] / [1.0, 2.0, 1.0]
        f_comm, b_comm = communication_ms(fwd, dims[p].double().numpy(), 1024, topology)
        np.testing.assert_allclose(got[p, :, 0], fwd, rtol=1e-5)
        dists = sum(dist_latency_ms(1, 3, topology))  # one lookup group per device: one set of dists
        np.testing.assert_allclose(got[p, :, 2], f_comm + b_comm + dists, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(plan[p], (got[p].sum(axis=1)).max(), rtol=1e-6)
    with pytest.raises(ValueError, match="traffic"):
        net.device_costs(sums)
    one = net.device_costs(sums[:, :1], dims[:, :1], DeviceLinks.of(config, [1.0]))
    assert (one[..., 2] == 0).all()  # a single device exchanges nothing


def test_the_config_refuses_unknown_settings():
    with pytest.raises(ValueError, match="comm: expected one of"):
        CostNetConfig(comm="measured")
    with pytest.raises(ValueError, match="batch_size"):
        CostNetConfig(batch_size=0)


def test_device_predictions_read_each_plan_on_its_own(analytic):
    """device_predictions under the model: each plan's rows as device_costs sees that plan alone."""
    from dreamshard.tables import Table

    tables = [Table(f"t{i}", 1000 * (i + 1), 8 * (i + 1), 5.0 + i, tuple([1.0] + [0.0] * 16)) for i in range(5)]
    task = Task.uniform("x", tables, 2, 1.0)
    plans = [Plan.from_assignment(task, a) for a in ([0, 1, 0, 1, 0], [1, 1, 1, 0, 0])]
    data = cost_data_from_plans([(task, p, analytic.plan_cost(task, p)) for p in plans])
    from dreamshard.learning.features import FeatureScaler, table_features

    scaler = FeatureScaler.fit(table_features(tables, task.memory))
    net = CostNetConfig.with_topology(Topology(), 512, comm="model").build(torch.Generator().manual_seed(0))
    all_rows = device_predictions(net, scaler, data)
    for p in range(2):
        alone = device_predictions(net, scaler, data.subset([p]))
        np.testing.assert_allclose(all_rows[data.device_plan == p], alone, rtol=1e-6)


def test_samples_are_measured_in_rounds_and_keep_their_medians_and_every_round(data, analytic):
    _, tasks, pool = data
    samples = device_samples(pool, 4, 3, 1.0, [4, 8], tasks[0], seed=0)
    inner = analytic

    class Drifting:
        """A machine whose speed changes from round to round: the r-th round costs factors[r] x the analytic cost."""
        name, measured, factors, calls = inner.name, inner.measured, (1.0, 1.6, 0.7), 0

        def device_name(self):
            return inner.device_name()

        def compute_cost(self, task, shards):
            cost = inner.compute_cost(task, shards)
            f = self.factors[self.calls // len(samples)]
            self.calls += 1
            return ComputeCost(cost.fwd_ms * f, cost.bwd_ms * f)

        def plan_cost_from(self, task, plan, compute):
            return inner.plan_cost_from(task, plan, compute)

    drifting = Drifting()
    rows = measure_samples(drifting, samples, tasks[0], EXTRA, rounds=3)
    steady = measure_samples(inner, samples, tasks[0], EXTRA)
    assert drifting.calls == 3 * len(samples)
    for row, once in zip(rows, steady, strict=True):
        assert len(row["fwd_ms_rounds"]) == 3 and len(set(row["fwd_ms_rounds"])) > 1
        assert row["fwd_ms"] == pytest.approx(np.median(row["fwd_ms_rounds"]))
        assert row["bwd_ms"] == pytest.approx(np.median(row["bwd_ms_rounds"]))
        assert once["fwd_ms_rounds"] == [once["fwd_ms"]]


def test_the_network_feeds_its_communication_the_traffic_the_backends_do(analytic):
    """A sequence table sends a row per id and a replica sends nothing: the cost network's communication (its
    plan estimates, its training data, the MDP's widths) counts what hardware.comm.plan_traffic counts."""
    from dataclasses import replace

    from dreamshard.hardware.comm import plan_traffic
    from dreamshard.learning.cost_model import plan_device_sums
    from dreamshard.learning.features import FeatureScaler, table_features
    from dreamshard.learning.mdp import TaskContext
    from dreamshard.plan import Shard
    from dreamshard.tables import Table

    tables = [Table(f"t{i}", 1000 * (i + 1), 8 * (i + 1), 5.0 + i, tuple([1.0] + [0.0] * 16)) for i in range(3)]
    tables[1] = replace(tables[1], sequence=True)
    task = replace(Task.uniform("x", tables, 2, 1.0), sharding=("table", "row", "data"))
    plan = Plan(2, (Shard("t0", 0, 0, 8, replica=True), Shard("t0", 1, 0, 8, replica=True),
                    Shard("t1", 0, 0, 16, 0, 500), Shard("t1", 1, 0, 16, 500, 2000), Shard("t2", 1, 0, 24)))
    traffic = plan_traffic(plan, task)
    widths = traffic[:, 0].tolist()
    assert widths == [16 * 6.0 * 500 / 2000, 16 * 6.0 * 1500 / 2000 + 24]  # not the raw 8 + 16 and 8 + 16 + 24
    # the ids: t1's by its rows' share, t2's all, t0's none (a replica); 8 B each and a 4 B length per shard
    assert traffic[:, 1].tolist() == pytest.approx([6.0 * 500 / 2000 * 8 + 4, 6.0 * 1500 / 2000 * 8 + 4 + 7.0 * 8 + 4])
    scaler = FeatureScaler.fit(table_features(tables, task.memory))
    net = CostNetConfig.with_topology(Topology(), 512, comm="model").build(torch.Generator().manual_seed(0))
    np.testing.assert_allclose(plan_device_sums(net, scaler, task, plan)[1], traffic)
    data = cost_data_from_plans([(task, plan, analytic.plan_cost(task, plan))])
    summed = np.zeros((2, 2))
    np.add.at(summed, data.shard_device, data.shard_out)
    np.testing.assert_allclose(summed, traffic)
    ctx = TaskContext.build(task, net, scaler)
    # whole tables, a sequence table's rows
    assert ctx.widths[:, 0].tolist() == pytest.approx([8.0, 16 * 6.0, 24.0])
    assert ctx.widths[:, 1].tolist() == pytest.approx([5.0 * 8 + 4, 6.0 * 8 + 4, 7.0 * 8 + 4])
