"""DreamShard's cost network: predicts a fused operator's costs from its tables' features.

A table encoder whose sums per device feed heads for forward, backward and communication cost, and a plan
head on the max over devices; communication may come from the all-to-all model instead of its head, since
a head reading one device cannot see the wait for the slowest. Architecture, loss and the choices measured:
docs/learning.md.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import nn

from dreamshard.errors import DataFormatError
from dreamshard.hardware.base import DeviceCost, PlanCost
from dreamshard.hardware.comm import (
    DIST_GROUP_MASK,
    Topology,
    dist_latencies,
    host_exchange_ms,
    plan_traffic,
    seconds_per_byte,
    shard_traffic,
)
from dreamshard.learning.features import NUM_FEATURES, RANGE_FEATURES, FeatureScaler, shard_features
from dreamshard.memory import DEFAULT_BATCH_SIZE, MemoryModel
from dreamshard.plan import LOOKUP_KINDS, Plan, lookup_kind
from dreamshard.tables import Table
from dreamshard.tasks import Task

TARGET_EPS_MS = 0.01
DIST_GROUPS = torch.from_numpy(DIST_GROUP_MASK)  # comm.DIST_GROUP_MASK, once, for dist_latency_ms
DEVICE_TARGETS = ("fwd_ms", "bwd_ms", "comm_ms")
PLAN_ESTIMATES = ("device_max", "head")
COMM_SOURCES = ("head", "model")
LOOKUP_GROUPS = ("device", "kind")


def linear(fan_in: int, fan_out: int, generator: torch.Generator) -> nn.Linear:
    """nn.Linear with PyTorch's default initialisation drawn from `generator`, not the global RNG."""
    layer = nn.Linear(fan_in, fan_out, device="meta").to_empty(device="cpu")
    with torch.no_grad():
        nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
        bound = 1 / math.sqrt(fan_in)
        nn.init.uniform_(layer.bias, -bound, bound, generator=generator)
    return layer


def mlp(*sizes: int, generator: torch.Generator) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(linear(sizes[i], sizes[i + 1], generator))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def log_cost(ms: torch.Tensor) -> torch.Tensor:
    return torch.log(ms + TARGET_EPS_MS)


LEGACY_TOPOLOGY_FIELDS = ("devices_per_host", "intra_host_gbps", "inter_host_gbps", "latency_us", "output_bytes")


@dataclass(frozen=True)
class CostNetConfig:
    """Everything that shapes a CostNet; a checkpoint stores it beside the weights."""

    hidden: int = 128
    embed: int = 32
    head_hidden: int = 64
    scale_ms: float = 1.0  # heads output softplus x scale_ms: the median measured device cost
    plan_estimate: str = "device_max"
    comm: str = "head"  # a device's communication: the comm head, or the all-to-all model (module docstring)
    # the all-to-all the "model" communication assumes: samples per step and the cluster's links (a Topology; a
    # stored config's dict of its fields is read back as one)
    batch_size: int = DEFAULT_BATCH_SIZE
    topology: Topology = Topology()
    # a device's compute: "device", the heads on the sum of all its pieces (one fused operator); "kind", the heads
    # on each TorchRec lookup group's sum (plan.LOOKUP_KINDS), summed over the groups it holds, as the backends
    # measure by kind (FbgemmConfig.lookup_groups)
    lookup_groups: str = "device"

    def __post_init__(self) -> None:
        if isinstance(self.topology, dict):  # as a checkpoint stores it
            object.__setattr__(self, "topology", Topology(**self.topology))
        if not isinstance(self.topology, Topology):
            raise ValueError(f"topology: expected a Topology, got {type(self.topology).__name__}")
        if self.plan_estimate not in PLAN_ESTIMATES:
            raise ValueError(f"plan_estimate: expected one of {PLAN_ESTIMATES}, got {self.plan_estimate!r}")
        if self.comm not in COMM_SOURCES:
            raise ValueError(f"comm: expected one of {COMM_SOURCES}, got {self.comm!r}")
        if self.lookup_groups not in LOOKUP_GROUPS:
            raise ValueError(f"lookup_groups: expected one of {LOOKUP_GROUPS}, got {self.lookup_groups!r}")
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            raise ValueError(f"batch_size: expected an integer >= 1, got {self.batch_size!r}")

    @property
    def group_count(self) -> int:
        """Lookup groups a device's sum keeps apart: one per kind, or the one fused operator."""
        return len(LOOKUP_KINDS) if self.lookup_groups == "kind" else 1

    @classmethod
    def with_topology(cls, topology: Topology, batch_size: int, **fields) -> CostNetConfig:
        """A config whose "model" communication is the all-to-all of `topology` at `batch_size`."""
        return cls(batch_size=batch_size, topology=topology, **fields)

    @staticmethod
    def stored_fields(stored: dict) -> dict:
        """A stored config's fields as this class takes them: checkpoints before the topology was one field kept
        its fields flat (LEGACY_TOPOLOGY_FIELDS); those before lookup groups summed a device's pieces as one
        ("device")."""
        if "lookup_groups" not in stored:
            stored = {**stored, "lookup_groups": "device"}
        flat = {k: stored[k] for k in LEGACY_TOPOLOGY_FIELDS if k in stored}
        if not flat or "topology" in stored:
            return stored
        return {**{k: v for k, v in stored.items() if k not in flat}, "topology": flat}

    def build(self, generator: torch.Generator) -> CostNet:
        return CostNet(self, generator)


@dataclass(frozen=True)
class DeviceLinks:
    """What a plan estimate needs of a task's devices besides their tables."""

    speed: torch.Tensor  # [D] relative compute speed (Device.speed): a device computes in reference cost / speed
    seconds_per_byte: torch.Tensor  # [D, D] of each link (0 on the diagonal), hardware/comm.py

    @classmethod
    def of(cls, config: CostNetConfig, speeds, hosts=None) -> DeviceLinks:
        """The cluster of devices of `speeds` on `hosts` (Task.host_ids; None: consecutive devices per host)."""
        n = len(speeds)
        spb = seconds_per_byte(config.topology, n, hosts)
        return cls(torch.tensor(speeds, dtype=torch.float32), torch.from_numpy(spb).float())


class CostNet(nn.Module):
    def __init__(self, config: CostNetConfig, generator: torch.Generator) -> None:
        super().__init__()
        self.config = config
        self.scale_ms = config.scale_ms
        self.plan_estimate = config.plan_estimate
        self.encoder = mlp(NUM_FEATURES, config.hidden, config.embed, generator=generator)
        self.device_heads = nn.ModuleList([mlp(config.embed, config.head_hidden, 1, generator=generator)
                                           for _ in DEVICE_TARGETS])
        self.plan_head = mlp(config.embed, config.head_hidden, 1, generator=generator)

    @property
    def width(self) -> int:
        """Columns of a piece's encoding (`encode`): embed, or (embed + a count) per lookup group."""
        embed = self.config.embed
        return embed if self.config.lookup_groups == "device" else self.config.group_count * (embed + 1)

    def encode(self, x: torch.Tensor, kinds: torch.Tensor | np.ndarray | None = None) -> torch.Tensor:
        """[..., 21] scaled features -> [..., width]: sum these over a device's shards. With lookup groups by
        kind, a piece's embedding and a count of 1 sit in the block of its kind (`kinds` [...], indices into
        plan.LOOKUP_KINDS; None: whole tables), so that a device's sum holds each group's sum and size."""
        enc = torch.relu(self.encoder(x))
        if self.config.lookup_groups == "device":
            return enc
        k = torch.zeros(enc.shape[:-1], dtype=torch.long) if kinds is None else torch.as_tensor(kinds).long()
        block = torch.cat([enc, torch.ones(*enc.shape[:-1], 1)], dim=-1)
        onehot = nn.functional.one_hot(k, self.config.group_count).to(enc.dtype)
        return (onehot[..., None] * block[..., None, :]).flatten(-2)

    def _groups(self, device_sum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[..., width] -> each lookup group's summed embedding [..., G, embed] and piece count [..., G]."""
        blocks = device_sum.unflatten(-1, (self.config.group_count, self.config.embed + 1))
        return blocks[..., :-1], blocks[..., -1]

    def totals(self, device_sum: torch.Tensor) -> torch.Tensor:
        """[..., width] -> [..., embed] the embedding sum over every group: the plan head's input."""
        return device_sum if self.config.lookup_groups == "device" else self._groups(device_sum)[0].sum(dim=-2)

    def head_costs(self, device_sum: torch.Tensor) -> torch.Tensor:
        """[..., width] -> [..., 3] the heads' (fwd, bwd, comm) ms of a reference device: what the fit trains. By
        kind: the sum over the device's non-empty groups of the heads on each."""
        if self.config.lookup_groups == "device":
            return self._heads(device_sum)
        sums, counts = self._groups(device_sum)
        costs = self._heads(sums)
        return torch.where(counts[..., None] > 0.5, costs, torch.zeros_like(costs)).sum(dim=-2)

    def _heads(self, embedding: torch.Tensor) -> torch.Tensor:
        raw = torch.cat([h(embedding) for h in self.device_heads], dim=-1)
        return nn.functional.softplus(raw) * self.scale_ms

    def transfer_ms(self, dims: torch.Tensor, cluster: DeviceLinks) -> torch.Tensor:
        """[..., D] dim sums -> [..., D] forward all-to-all transfer ms (hardware/comm.py transfer_ms)."""
        return self.exchange_ms(dims * self.config.topology.output_bytes, cluster)

    def exchange_ms(self, bytes_per_sample: torch.Tensor, cluster: DeviceLinks) -> torch.Tensor:
        """[..., D] bytes per sample -> [..., D] all-to-all ms (hardware/comm.py exchange_ms; input_dist_ms)."""
        n = bytes_per_sample.shape[-1]
        if n == 1:
            return torch.zeros_like(bytes_per_sample)
        block = self.config.batch_size / n * bytes_per_sample  # bytes d -> e
        send = block * cluster.seconds_per_byte.sum(dim=1)
        recv = block @ cluster.seconds_per_byte  # [d] = sum_e block_e spb[e, d]
        return (self.config.topology.latency_us * 1e-6 + torch.maximum(send, recv)) * 1e3

    def dist_latency_ms(self, device_sum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[..., D, width] -> (forward, backward) [..., 1] ms of the dists' latencies beyond `exchange_ms`'s
        (hardware/comm.py dist_latency_ms) on D > 1 devices: by kind, one set per lookup group (DIST_KINDS) with
        pieces on any device; one lookup group per device ("device"), a single set."""
        if self.config.lookup_groups == "device":
            groups = torch.ones(*device_sum.shape[:-2], 1, dtype=device_sum.dtype)
        else:
            counts = self._groups(device_sum)[1].sum(dim=-2)  # [..., G] pieces of each group over the devices
            groups = ((counts > 0.5) & DIST_GROUPS).sum(dim=-1, keepdim=True).clamp(min=1).to(device_sum.dtype)
        return dist_latencies(groups, self.config.topology.latency_us * 1e-3)

    def device_costs(self, device_sum: torch.Tensor, traffic: torch.Tensor | None = None,
                     cluster: DeviceLinks | None = None) -> torch.Tensor:
        """[..., D, width] -> [..., D, 3] predicted (fwd, bwd, comm) ms of each device of a plan: compute at the
        devices' speeds (`cluster`; None: all at the reference speed), communication by `config.comm` (the
        "model" needs the devices' traffic [..., D, 2] (hardware.comm.plan_traffic) and `cluster`)."""
        costs = self.head_costs(device_sum)
        compute = costs[..., :2] if cluster is None else costs[..., :2] / cluster.speed[:, None]
        if self.config.comm == "head":
            return torch.cat([compute, costs[..., 2:]], dim=-1)
        if traffic is None or cluster is None:
            raise ValueError("a cost network with comm='model' needs the devices' traffic and their cluster")
        fwd = compute[..., 0]
        if fwd.shape[-1] == 1:
            return torch.cat([compute, torch.zeros_like(costs[..., 2:])], dim=-1)
        traffic = traffic.to(fwd.dtype)
        # the input dist, the wait for the slowest forward, the outputs out and their gradients back, and the
        # latencies of each lookup group's dists (comm.py)
        fwd_dists, bwd_dists = self.dist_latency_ms(device_sum)
        comm = self.exchange_ms(traffic[..., 1], cluster) + fwd.max(dim=-1, keepdim=True).values - fwd + \
            2 * self.transfer_ms(traffic[..., 0], cluster) + fwd_dists + bwd_dists
        return torch.cat([compute, comm[..., None]], dim=-1)

    def plan_cost(self, device_sums: torch.Tensor, traffic: torch.Tensor | None = None,
                  cluster: DeviceLinks | None = None) -> torch.Tensor:
        """[..., D, width] -> [...] predicted plan cost ms, by `plan_estimate` (traffic, cluster: device_costs')."""
        if self.plan_estimate == "device_max":
            return self.device_costs(device_sums, traffic, cluster).sum(dim=-1).max(dim=-1).values
        return self.plan_from_max(self.totals(device_sums).max(dim=-2).values)

    def plan_from_max(self, max_embedding: torch.Tensor) -> torch.Tensor:
        return nn.functional.softplus(self.plan_head(max_embedding).squeeze(-1)) * self.scale_ms


def plan_piece_features(task: Task, plan: Plan) -> tuple[list[np.ndarray], list[int], list[int]]:
    """The raw features of every piece `plan` places, device by device, each piece's device and its lookup group
    (an index into plan.LOOKUP_KINDS)."""
    tables = {t.name: t for t in task.tables}
    raw, owner, kinds = [], [], []
    for d in range(plan.num_devices):
        for s in plan.device_shards(d):
            table = tables[s.table]
            r0, r1 = s.rows(table.rows)
            raw.append(piece_features(table, r0, r1, s.width, task.memory))
            owner.append(d)
            kinds.append(kind_index(r1 - r0, s.width, table, s.replica))
    return raw, owner, kinds


def kind_index(num_rows: int, width: int, table: Table, replica: bool = False) -> int:
    """The plan.LOOKUP_KINDS index of `num_rows` x `width` of `table`."""
    return LOOKUP_KINDS.index(lookup_kind(num_rows, width, table.rows, table.dim, replica))


def folded_encodings(net: CostNet, scaler: FeatureScaler, raw: np.ndarray,
                     kinds: Sequence[int] | np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pieces' raw features [n, 21] -> (their scaled features, folded (FeatureScaler.fold) [n, 21]; their encodings
    [n, width], each the sum of its folded pieces'): what every estimate of the network reads."""
    folded, weight = scaler.fold(np.asarray(raw).reshape(-1, NUM_FEATURES))
    x = torch.from_numpy(scaler.transform(folded))
    with torch.no_grad():
        enc = net.encode(x, None if kinds is None else np.asarray(kinds, dtype=np.int64))
    return x, enc * torch.from_numpy(weight).to(enc.dtype)[:, None]


def plan_device_sums(net: CostNet, scaler: FeatureScaler, task: Task, plan: Plan) -> tuple[torch.Tensor, np.ndarray]:
    """Each device's summed encoding of the pieces `plan` puts on it ([D, width]), and its traffic [D, 2]
    (hardware.comm.plan_traffic, as the backends count it)."""
    raw, owner, kinds = plan_piece_features(task, plan)
    _, enc = folded_encodings(net, scaler, np.asarray(raw), kinds)
    with torch.no_grad():
        sums = torch.zeros(plan.num_devices, enc.shape[-1]).index_add(0, torch.tensor(owner, dtype=torch.long), enc)
    return sums, plan_traffic(plan, task, net.config.topology)


FOLD_EXPONENTS = tuple(round(0.05 * i, 2) for i in range(1, 21))  # the exponents fit_fold_exponent tries


def fit_fold_exponent(net: CostNet, scaler: FeatureScaler, tasks: Sequence[Task]) -> FeatureScaler:
    """`scaler` with the fold_exponent under which folding agrees with the network inside its own range.

    A dim beyond the training range is priced as k in-range slices weighing k ** e (FeatureScaler.fold). Inside the
    range both ways are defined: each task's tables, dealt to its devices in turn, are rated unfolded and with dims
    above half and a quarter of the training high folded (k = 2, 4: as 256 and 512 fold over 128). The exponent
    (of FOLD_EXPONENTS) whose folded device compute is off the unfolded by the least mean log ratio is kept: a
    wider row costs less than k narrower ones, which weight k overrated (results/holdout/fold-probe)."""
    if scaler.high is None or "dim" not in scaler.folds or not tasks:
        return scaler
    at = RANGE_FEATURES.index("dim")
    plans = [(t, Plan.from_assignment(t, [i % t.num_devices for i in range(len(t.tables))])) for t in tasks]

    def compute(sc: FeatureScaler) -> np.ndarray:
        return np.array([d.fwd_ms + d.bwd_ms for t, p in plans for d in NetworkEstimate(net, sc).plan_cost(t, p).devices])

    unfolded = compute(scaler)
    caps = [replace(scaler, high=tuple(h / div if i == at else h for i, h in enumerate(scaler.high)))
            for div in (2, 4)]
    # each exponent's log ratio of folded to unfolded device compute, device by device of every cap
    logs = {e: np.concatenate([np.log(compute(replace(c, fold_exponent=e)) / unfolded) for c in caps])
            for e in FOLD_EXPONENTS}
    # the devices a fold changes (at weight k it always moves their rating); the others would only dilute the fit
    moved = np.abs(logs[1.0]) > 1e-9
    if not moved.any():
        return scaler  # no table wide enough to fold: nothing to fit on

    def off(e: float) -> float:
        return abs(float(np.mean(logs[e][moved])))

    return replace(scaler, fold_exponent=min(FOLD_EXPONENTS, key=off))


@dataclass
class NetworkEstimate:
    """The cost network's estimate of a plan (a CostEstimator, never a measurement): each device's predicted fwd
    and bwd at its speed, and its communication by `config.comm`. The all-to-all model ("model") splits into the
    forward wait plus transfer and the backward transfer; the network's own head ("head") predicts their sum,
    reported as forward communication."""

    net: CostNet
    scaler: FeatureScaler
    name: str = "cost_network"

    def plan_cost(self, task: Task, plan: Plan) -> PlanCost:
        n = plan.num_devices
        sums, traffic = plan_device_sums(self.net, self.scaler, task, plan)
        cluster = DeviceLinks.of(self.net.config, task.speeds(), task.host_ids())
        with torch.no_grad():
            costs = self.net.device_costs(sums, torch.tensor(traffic, dtype=torch.float32), cluster).double().numpy()
        if self.net.config.comm == "model" and n > 1:  # the backward: the output transfer and dists (device_costs)
            with torch.no_grad():
                transfer = self.net.transfer_ms(torch.tensor(traffic[:, 0], dtype=torch.float32), cluster)
                back = (transfer + self.net.dist_latency_ms(sums)[1]).double().numpy()
            comm = [(c - t, t) for c, t in zip(costs[:, 2], back)]
        else:
            comm = [(c, 0.0) for c in costs[:, 2]]
        if self.net.config.comm == "model":  # table_row_wise tables' outputs, both ways (comm.host_exchange_ms)
            two_level = host_exchange_ms(plan, task, self.net.config.batch_size, self.net.config.topology)
            comm = [(c + t, b + t) for (c, b), t in zip(comm, two_level)]
        devices = tuple(DeviceCost(float(f), float(b), float(cf), float(cb))
                        for (f, b, _), (cf, cb) in zip(costs, comm))
        return PlanCost(devices, self.name, "model", False, self.net.config.comm)


# ---------------------------------------------------------------- data


@dataclass
class CostData:
    """Measured plans flattened: shards -> device rows -> plans."""

    shard_raw: np.ndarray  # [M, 21] raw features
    shard_device: np.ndarray  # [M] index of the shard's device row
    device_plan: np.ndarray  # [K] index of the device row's plan
    device_ms: np.ndarray  # [K, 3] fwd, bwd, comm
    plan_cost_ms: np.ndarray  # [P]
    shard_out: np.ndarray  # [M, 2] each shard's traffic per sample (hardware.comm.shard_traffic)
    shard_kind: np.ndarray  # [M] each shard's lookup group, an index into plan.LOOKUP_KINDS

    @property
    def num_plans(self) -> int:
        return len(self.plan_cost_ms)

    @classmethod
    def empty(cls) -> CostData:
        return cls(np.zeros((0, NUM_FEATURES)), np.zeros(0, np.int64), np.zeros(0, np.int64),
                   np.zeros((0, 3)), np.zeros(0), np.zeros((0, 2)), np.zeros(0, np.int64))

    def subset(self, which: Sequence[int] | np.ndarray) -> CostData:
        plans = np.asarray(which, dtype=np.int64)
        plan_map = np.full(self.num_plans, -1)
        plan_map[plans] = np.arange(len(plans))
        devices = np.flatnonzero(plan_map[self.device_plan] >= 0)
        devices = devices[np.argsort(plan_map[self.device_plan[devices]], kind="stable")]
        dev_map = np.full(len(self.device_plan), -1)
        dev_map[devices] = np.arange(len(devices))
        shards = np.flatnonzero(dev_map[self.shard_device] >= 0)
        return CostData(self.shard_raw[shards], dev_map[self.shard_device[shards]],
                        plan_map[self.device_plan[devices]], self.device_ms[devices], self.plan_cost_ms[plans],
                        self.shard_out[shards], self.shard_kind[shards])

    def concat(self, other: CostData) -> CostData:
        return CostData(
            np.concatenate([self.shard_raw, other.shard_raw]),
            np.concatenate([self.shard_device, other.shard_device + len(self.device_plan)]),
            np.concatenate([self.device_plan, other.device_plan + self.num_plans]),
            np.concatenate([self.device_ms, other.device_ms]),
            np.concatenate([self.plan_cost_ms, other.plan_cost_ms]),
            np.concatenate([self.shard_out, other.shard_out]),
            np.concatenate([self.shard_kind, other.shard_kind]),
        )


def piece_features(table: Table, row_start: int, row_end: int, width: int, memory: MemoryModel) -> np.ndarray:
    """The features of rows [row_start, row_end) x `width` columns of `table` (Table.piece)."""
    return shard_features(table.piece(row_start, row_end, width), width, memory)


def cost_data_from_plans(task_plans: Sequence[tuple[Task, Plan, PlanCost]]) -> CostData:
    """CostData of measured plans."""
    raw: list[np.ndarray] = []
    shard_dev: list[int] = []
    dev_plan: list[int] = []
    dev_ms: list[tuple[float, float, float]] = []
    plan_cost_ms: list[float] = []
    outs: list[tuple[float, float]] = []
    kinds: list[int] = []
    for p, (task, plan, cost) in enumerate(task_plans):
        features, owner, piece_kinds = plan_piece_features(task, plan)
        raw += features
        kinds += piece_kinds
        tables = {t.name: t for t in task.tables}
        outs += [shard_traffic(tables[s.table], s.width, s.num_rows(tables[s.table].rows), s.replica)
                 for d in range(plan.num_devices) for s in plan.device_shards(d)]  # plan_piece_features' order
        shard_dev += [len(dev_plan) + d for d in owner]  # the plan's device rows follow those already there
        for dc in cost.devices:
            dev_plan.append(p)
            dev_ms.append((dc.fwd_ms, dc.bwd_ms, dc.fwd_comm_ms + dc.bwd_comm_ms))
        plan_cost_ms.append(cost.cost_ms)
    return CostData(np.asarray(raw).reshape(-1, NUM_FEATURES), np.asarray(shard_dev, np.int64),
                    np.asarray(dev_plan, np.int64), np.asarray(dev_ms).reshape(-1, 3), np.asarray(plan_cost_ms),
                    np.asarray(outs, dtype=np.float64).reshape(-1, 2), np.asarray(kinds, np.int64))


def cost_data_from_rows(plans, devices, tasks: Sequence[Task]) -> CostData:
    """CostData from the collect stage's plans/devices frames (rows in the same plan order)."""
    missing = [c for c in ("tables", "col_starts", "col_ends", "row_starts", "row_ends") if c not in devices.columns]
    if missing:
        raise DataFormatError(f"collected device rows: no column {', '.join(missing)}: collected by another version "
                              "of the collect stage; collect again")
    plan_index = {pid: i for i, pid in enumerate(plans["plan_id"])}
    by_task = {t.name: ({tb.name: tb for tb in t.tables}, t.memory) for t in tasks}
    raw, shard_dev, dev_plan, dev_ms, outs, kinds = [], [], [], [], [], []
    for k, row in enumerate(devices.itertuples(index=False)):
        tables, memory = by_task[row.task_id]
        for name, start, end, r0, r1 in zip(row.tables, row.col_starts, row.col_ends, row.row_starts, row.row_ends):
            raw.append(piece_features(tables[name], int(r0), int(r1), int(end - start), memory))
            outs.append(shard_traffic(tables[name], int(end - start), int(r1 - r0)))
            kinds.append(kind_index(int(r1 - r0), int(end - start), tables[name]))
            shard_dev.append(k)
        dev_plan.append(plan_index[row.plan_id])
        dev_ms.append((row.fwd_ms, row.bwd_ms, row.fwd_comm_ms + row.bwd_comm_ms))
    return CostData(np.asarray(raw).reshape(-1, NUM_FEATURES), np.asarray(shard_dev, np.int64),
                    np.asarray(dev_plan, np.int64), np.asarray(dev_ms).reshape(-1, 3),
                    plans["cost_ms"].to_numpy(dtype=np.float64), np.asarray(outs, dtype=np.float64).reshape(-1, 2),
                    np.asarray(kinds, np.int64))


# ---------------------------------------------------------------- training


def _device_sums(net: CostNet, scaler: FeatureScaler, data: CostData) -> torch.Tensor:
    """[K, width] the summed encodings of each device row's shards."""
    enc = net.encode(torch.from_numpy(scaler.transform(data.shard_raw)), data.shard_kind)
    return torch.zeros(len(data.device_plan), enc.shape[-1]).index_add(0, torch.from_numpy(data.shard_device), enc)


def predict(net: CostNet, scaler: FeatureScaler, data: CostData) -> tuple[torch.Tensor, torch.Tensor]:
    """The heads' (device [K, 3], plan [P]) costs, ms: what the fit compares with the measurements."""
    dev = _device_sums(net, scaler, data)
    device_y = net.head_costs(dev)
    total = net.totals(dev)
    index = torch.from_numpy(data.device_plan)[:, None].expand(-1, total.shape[-1])
    plan_emb = torch.full((data.num_plans, total.shape[-1]), -torch.inf).scatter_reduce(0, index, total, "amax")
    return device_y, net.plan_from_max(plan_emb)


def device_predictions(net: CostNet, scaler: FeatureScaler, data: CostData) -> np.ndarray:
    """[K, 3] predicted (fwd, bwd, comm) ms of each device row, communication by `net.config.comm` (the "model"
    reads each plan's devices together: devices on consecutive hosts, all at the reference speed)."""
    with torch.no_grad():
        dev = _device_sums(net, scaler, data)
        if net.config.comm == "head":
            return net.head_costs(dev).numpy().astype(np.float64)
        out = np.zeros((len(data.device_plan), 3))
        dims = np.zeros((len(data.device_plan), 2))
        np.add.at(dims, data.shard_device, data.shard_out)
        for p in range(data.num_plans):
            rows = np.flatnonzero(data.device_plan == p)
            cluster = DeviceLinks.of(net.config, [1.0] * len(rows))
            out[rows] = net.device_costs(dev[rows], torch.from_numpy(dims[rows]).float(), cluster).numpy()
        return out


def adam_fit(module: nn.Module, num_items: int, batch_loss: Callable[[np.ndarray], torch.Tensor],
             steps: int, lr: float, batch_size: int, seed: int) -> list[float]:
    """The one training loop of the cost models: Adam with linear lr decay over seeded minibatches.

    `batch_loss(indices)` returns the loss of a minibatch of item indices.
    """
    gen = np.random.default_rng(seed)
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / max(steps, 1))
    losses = []
    module.train()
    for _ in range(steps):
        loss = batch_loss(gen.choice(num_items, size=min(batch_size, num_items), replace=False))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    module.eval()
    return losses


def fit_cost_net(net: CostNet, scaler: FeatureScaler, data: CostData, steps: int, lr: float,
                 batch_plans: int, seed: int, devices: CostData | None = None,
                 batch_devices: int = 128) -> list[float]:
    """Sum of the four squared log errors (three device costs, the plan cost) of a minibatch of plans, plus
    with `devices` (single-device measurements: one device per plan, no communication) the two compute
    errors of a minibatch of `batch_devices` of them; loss per step."""
    device_rng = np.random.default_rng([seed, 1])  # the single-device minibatches

    def batch_loss(plans: np.ndarray) -> torch.Tensor:
        batch = data.subset(plans)
        device_y, plan_y = predict(net, scaler, batch)
        device_true = torch.from_numpy(batch.device_ms).float()
        plan_true = torch.from_numpy(batch.plan_cost_ms).float()
        loss = ((log_cost(device_y) - log_cost(device_true)) ** 2).mean(dim=0).sum() + \
            ((log_cost(plan_y) - log_cost(plan_true)) ** 2).mean()
        if devices is not None and devices.num_plans:
            some = devices.subset(device_rng.choice(devices.num_plans, size=min(batch_devices, devices.num_plans),
                                                    replace=False))
            single_y, _ = predict(net, scaler, some)
            single_true = torch.from_numpy(some.device_ms[:, :2]).float()
            loss = loss + ((log_cost(single_y[:, :2]) - log_cost(single_true)) ** 2).mean(dim=0).sum()
        return loss

    return adam_fit(net, data.num_plans, batch_loss, steps, lr, batch_plans, seed)


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-a of two rankings (pairs tied in either count as neither)."""
    a, b = np.asarray(a), np.asarray(b)
    da = np.sign(a[:, None] - a[None, :])
    db = np.sign(b[:, None] - b[None, :])
    n = len(a)
    return float((da * db).sum() / (n * (n - 1))) if n > 1 else float("nan")


def evaluate_cost_net(net: CostNet, scaler: FeatureScaler, data: CostData) -> dict[str, float | int | str]:
    """MAPE of device costs (compute; compute + comm) and of plan costs, Kendall tau of plan costs.

    Plan costs are given for both estimates: the plan head (plan_*) and the max over
    devices of their predicted costs (plan_device_max_*).
    """
    with torch.no_grad():
        _, plan_y = predict(net, scaler, data)
    pred = device_predictions(net, scaler, data)
    compute_pred, compute_true = pred[:, :2].sum(axis=-1), data.device_ms[:, :2].sum(axis=-1)
    dev_pred, dev_true = pred.sum(axis=-1), data.device_ms.sum(axis=-1)
    keep = compute_true > 0  # devices without tables cost 0: no percentage error
    plan_pred = plan_y.numpy()
    device_max = np.full(data.num_plans, -np.inf)
    np.maximum.at(device_max, data.device_plan, dev_pred)
    return {
        "device_compute_mape": float(np.mean(np.abs(compute_pred[keep] - compute_true[keep]) / compute_true[keep])),
        "device_mape": float(np.mean(np.abs(dev_pred[keep] - dev_true[keep]) / dev_true[keep])),
        "plan_mape": float(np.mean(np.abs(plan_pred - data.plan_cost_ms) / data.plan_cost_ms)),
        "plan_kendall_tau": kendall_tau(plan_pred, data.plan_cost_ms),
        "plan_device_max_mape": float(np.mean(np.abs(device_max - data.plan_cost_ms) / data.plan_cost_ms)),
        "plan_device_max_kendall_tau": kendall_tau(device_max, data.plan_cost_ms),
        "plan_estimate_used": net.plan_estimate,
        "num_plans": data.num_plans,
        "num_devices": int(len(data.device_plan)),
    }


def measurement_noise(plans, devices) -> dict[str, float | int] | None:
    """How far one measurement lies from the median of its rounds, over the collect stage's plans and devices
    frames (rows of the same plans): the floor under any cost model's error against these rows. None when the
    rows hold fewer than 2 rounds.

    single_round_compute_mape: over devices with compute and over rounds, |fwd + bwd of the round - the row's
    fwd + bwd (the medians)| / the row's; single_round_plan_kendall_tau: over rounds, Kendall's tau of the plans'
    costs in that round against their costs (the medians' plan costs)."""
    if "cost_ms_rounds" not in plans.columns or plans.empty or int(plans["rounds"].min()) < 2:
        return None
    rounds = int(plans["rounds"].min())
    compute = (devices["fwd_ms"] + devices["bwd_ms"]).to_numpy()
    each = np.stack([np.add(f[:rounds], b[:rounds]) for f, b in zip(devices["fwd_ms_rounds"], devices["bwd_ms_rounds"])])
    keep = compute > 0
    per_round = np.stack(plans["cost_ms_rounds"].map(lambda c: np.asarray(c[:rounds])).to_list())
    cost = plans["cost_ms"].to_numpy()
    return {"rounds": rounds, "plans": len(plans),
            "single_round_compute_mape": float(np.mean(np.abs(each[keep] - compute[keep, None]) / compute[keep, None])),
            "single_round_plan_kendall_tau": float(np.mean([kendall_tau(per_round[:, r], cost) for r in range(rounds)]))}



def plan_predictions(net: CostNet, scaler: FeatureScaler, data: CostData,
                     estimate: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per plan of `data`, in its order: (predicted, measured) plan cost, ms.

    The points behind `evaluate_cost_net`'s plan metrics: `estimate` "device_max" gives the values of its
    plan_device_max_* entries, "head" those of its plan_* entries; the default is the net's own
    `plan_estimate` (the one reported as plan_estimate_used and used for rewards).
    """
    estimate = net.plan_estimate if estimate is None else estimate
    if estimate not in PLAN_ESTIMATES:
        raise ValueError(f"estimate: expected one of {PLAN_ESTIMATES}, got {estimate!r}")
    if estimate == "head":
        with torch.no_grad():
            _, plan_y = predict(net, scaler, data)
        predicted = plan_y.numpy().astype(np.float64)
    else:
        predicted = np.full(data.num_plans, -np.inf)
        np.maximum.at(predicted, data.device_plan, device_predictions(net, scaler, data).sum(axis=-1))
    return predicted, np.asarray(data.plan_cost_ms, dtype=np.float64).copy()


def median_device_ms(data: CostData) -> float:
    """The cost scale of a new network: the median measured device cost."""
    totals = data.device_ms.sum(axis=-1)
    positive = totals[totals > 0]
    return float(np.median(positive)) if positive.size else 1.0


def save_cost_net(net: CostNet, scaler: FeatureScaler, path: str | Path) -> None:
    """The network's config, weights and feature scaler in one checkpoint (dreamshard.learning.checkpoints)."""
    from dreamshard.learning.checkpoints import save_checkpoint

    save_checkpoint(path, "cost_net", {"cost_net": net}, scaler, {})


def load_cost_net(path: str | Path) -> tuple[CostNet, FeatureScaler]:
    """What `save_cost_net` wrote; a clear error naming the file otherwise."""
    from dreamshard.learning.checkpoints import load_checkpoint

    checkpoint = load_checkpoint(path, "cost_net")
    return cast(CostNet, checkpoint.networks["cost_net"]), checkpoint.scaler
