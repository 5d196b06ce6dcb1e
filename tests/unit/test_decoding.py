"""The NumPy step of planning (learning/decoding.py) against the PyTorch networks it stands for."""
from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from dreamshard.hardware.comm import Topology
from dreamshard.learning.cost_model import CostNetConfig
from dreamshard.learning.decoding import StepScorer, rank_devices
from dreamshard.learning.features import FeatureScaler, table_features
from dreamshard.learning.mdp import TaskContext
from dreamshard.learning.policy import LearnedModel, PolicyNetConfig
from dreamshard.memory import GB
from dreamshard.placement import place_tables
from dreamshard.plan import Plan
from dreamshard.sharders import make_sharder
from dreamshard.tables import NUM_BINS, Table
from dreamshard.tasks import Device, Task


def tables(seed: int, count: int) -> list[Table]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        bins = rng.dirichlet(np.ones(NUM_BINS))
        out.append(Table(f"t{seed}_{i}", int(10 ** rng.uniform(2, 5)), int(rng.choice([4, 16, 64, 128])),
                         float(rng.uniform(1, 60)), tuple(float(b) for b in bins)))
    return out


def tasks() -> list[Task]:
    pool = tables(0, 24)
    memory = int(GB)
    mixed = tuple(Device(memory, speed=s, host=h) for s, h in [(1.0, "a"), (2.0, "a"), (0.5, "b"), (1.5, "b"), (1.0, "b")])
    return [
        Task.uniform("four", pool[:12], 4, 1.0),
        Task.uniform("sixteen", pool, 16, 1.0),  # two hosts of 8
        Task("mixed", tuple(pool[:15]), mixed),  # speeds and named hosts
        Task.uniform("one", pool[:5], 1, 1.0),
    ]


def networks(comm: str, seed: int, lookup_groups: str = "device"):
    scaler = FeatureScaler.fit(np.concatenate([table_features(t.tables, t.memory) for t in tasks()]))
    cfg = CostNetConfig.with_topology(Topology(8, 150.0, 12.5, 10.0, 4), 512, comm=comm, scale_ms=0.3,
                                      lookup_groups=lookup_groups)
    return cfg.build(torch.Generator().manual_seed(seed)), PolicyNetConfig().build(
        torch.Generator().manual_seed(seed + 1)), scaler


@pytest.mark.parametrize("comm,groups", [("model", "device"), ("head", "device"), ("model", "kind")])
def test_the_numpy_step_gives_the_networks_costs_and_logits(comm, groups):
    """By kind, the pieces are of random lookup groups: a device's cost sums its groups' heads in both."""
    cost_net, policy, scaler = networks(comm, 3, groups)
    rng = np.random.default_rng(1)
    for task in tasks():
        kinds = rng.integers(4, size=len(task.tables)) if groups == "kind" else None
        ctx = TaskContext.build(task, cost_net, scaler, kinds)
        scorer = StepScorer.build(cost_net, policy, ctx)
        with torch.no_grad():
            penc = policy.encode(ctx.x)
        loads = []
        for _ in range(5):  # random partial plans: some tables placed, some devices empty
            placed = rng.random(len(task.tables)) < rng.uniform(0.2, 1.0)
            where = rng.integers(task.num_devices, size=len(task.tables))
            onehot = torch.zeros(task.num_devices, len(task.tables))
            for i in np.flatnonzero(placed):
                onehot[where[i], i] = 1.0
            load = onehot.double().numpy() @ scorer.weights
            with torch.no_grad():
                costs = cost_net.device_costs(onehot @ ctx.cost_enc, onehot @ ctx.widths, ctx.cluster)
                t = int(rng.integers(len(task.tables)))
                logits = policy.logits(onehot @ penc, costs, penc[t])
            np.testing.assert_allclose(scorer.device_costs(load), costs.numpy(), rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(scorer.logits(t, load), logits.numpy(), rtol=1e-4, atol=1e-5)
            loads.append(load)
        # several loads rated in one call (the cut search's moves) are rated as one by one
        np.testing.assert_allclose(scorer.device_costs(np.stack(loads)),
                                   np.stack([scorer.device_costs(x) for x in loads]), rtol=1e-12, atol=1e-12)


def torch_ranking(cost_net, policy, ctx, penc, t, state):
    """The devices for table t by the PyTorch networks' logits (what the sharder did before the NumPy step), ties
    within LOGIT_TIE to the lowest index as every decoder breaks them."""
    embed = ctx.cost_enc.shape[-1]
    load = torch.from_numpy(state.load).float()
    with torch.no_grad():
        costs = cost_net.device_costs(load[:, :embed], load[:, -2:], ctx.cluster)  # its traffic: 2 columns
        return rank_devices(policy.logits(load[:, embed:-2], costs, penc[t]).double().numpy())


def test_the_sharder_plans_with_the_numpy_step_as_with_the_networks():
    """PolicySharder's plan equals the one the PyTorch networks rank table by table (the reference decoder)."""
    cost_net, policy, scaler = networks("model", 5)
    model = LearnedModel(cost_net, policy, scaler, {})
    for task in tasks():
        ctx = TaskContext.build(task, cost_net, scaler)
        with torch.no_grad():
            penc = policy.encode(ctx.x)
        weights = torch.cat([ctx.cost_enc, penc, ctx.widths], dim=1).double().numpy()
        rank = partial(torch_ranking, cost_net, policy, ctx, penc)
        reference = Plan.from_assignment(task, place_tables(task, ctx.order, rank, weights))
        assert make_sharder("dreamshard", model=model).shard(task) == reference, task.name
