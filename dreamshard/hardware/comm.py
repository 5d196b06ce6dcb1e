"""All-to-all communication model for model-parallel embeddings.

Every backend adds it to its compute: the forward all-to-all of pooled outputs (row shards send partial
sums), the wait for the slowest device's forward, and the backward exchange, over intra- and inter-host
links; sequence tables send a row per id, data-parallel replicas send no outputs, and their dense gradients are
all-reduced in the backward.
The model and what it leaves out: docs/cost-backends.md.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dreamshard.hardware.base import ComputeCost, DeviceCost, PlanCost
from dreamshard.hardware.topology import Topology
from dreamshard.plan import Plan
from dreamshard.tables import Table
from dreamshard.tasks import Task


def host_of(topology: Topology, n: int, hosts: Sequence[int] | None = None) -> np.ndarray:
    """Host index of each of n devices: `hosts` when given (Task.host_ids), else consecutive devices_per_host."""
    if hosts is None:
        return np.arange(n) // topology.devices_per_host
    if len(hosts) != n:
        raise ValueError(f"hosts: {len(hosts)} given for {n} devices")
    return np.asarray(hosts)


def seconds_per_byte(topology: Topology, n: int, hosts: Sequence[int] | None = None) -> np.ndarray:
    """[n, n] seconds per byte of each link d -> e (0 on the diagonal: a device's own share stays local)."""
    host = host_of(topology, n, hosts)
    same = host[:, None] == host[None, :]
    gbps = np.where(same, topology.intra_host_gbps, topology.inter_host_gbps)
    spb = 1.0 / (gbps * 1e9)
    np.fill_diagonal(spb, 0.0)  # a device's own share stays local
    return spb


def transfer_ms(dim_sums: Sequence[float], batch_size: int, topology: Topology,
                hosts: Sequence[int] | None = None) -> np.ndarray:
    """Forward all-to-all transfer time of each device, ms (the backward one is the same): the sums over the links
    of `seconds_per_byte`, taken host by host (linear in devices, where the [n, n] links took 100000^2 x 8 bytes
    for 100000 devices)."""
    n = len(dim_sums)
    if n == 1:
        return np.zeros(1)
    block = batch_size / n * np.asarray(dim_sums, dtype=np.float64) * topology.output_bytes  # bytes d -> e
    _, host, per_host = np.unique(host_of(topology, n, hosts), return_inverse=True, return_counts=True)
    intra, inter = 1.0 / (topology.intra_host_gbps * 1e9), 1.0 / (topology.inter_host_gbps * 1e9)
    peers = per_host[host] - 1  # the other devices of d's host
    send = block * (peers * intra + (n - 1 - peers) * inter)  # d's blocks to every e
    on_host = np.bincount(host, weights=block)[host]  # the blocks of d's host, d's own among them
    recv = (on_host - block) * intra + (block.sum() - on_host) * inter  # every e's block to d
    return (topology.latency_us * 1e-6 + np.maximum(send, recv)) * 1e3


def forward_wait_ms(fwd_compute_ms: Sequence[float] | np.ndarray) -> np.ndarray:
    """What each device's forward all-to-all spends waiting for the slowest device's forward compute, ms; a
    device's fwd_comm_ms is this plus its own transfer (none with one device)."""
    fwd = np.asarray(fwd_compute_ms, dtype=np.float64)
    return fwd.max() - fwd if len(fwd) > 1 else np.zeros(len(fwd))


def communication_ms(
    fwd_compute_ms: Sequence[float], dim_sums: Sequence[float], batch_size: int, topology: Topology,
    hosts: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(fwd_comm_ms, bwd_comm_ms) per device, including the forward wait for the slowest device."""
    fwd = np.asarray(fwd_compute_ms, dtype=np.float64)
    transfer = transfer_ms(dim_sums, batch_size, topology, hosts)
    if len(fwd) == 1:
        return np.zeros(1), np.zeros(1)
    # send and receive swap roles in the backward pass; max(send, recv) is symmetric in them
    return forward_wait_ms(fwd) + transfer, transfer


def allreduce_ms(nbytes: float, n: int, topology: Topology, hosts: Sequence[int] | None = None) -> float:
    """A ring all-reduce of `nbytes` over n devices, ms: each device sends and receives 2 (n-1)/n of it over the
    ring's slowest link (between hosts when the devices span several), plus one latency; 0 for one device."""
    if n == 1 or nbytes == 0:
        return 0.0
    spread = len(set(host_of(topology, n, hosts).tolist())) > 1
    gbps = topology.inter_host_gbps if spread else topology.intra_host_gbps
    return (topology.latency_us * 1e-6 + 2 * (n - 1) / n * nbytes / (gbps * 1e9)) * 1e3


def replica_gradient_bytes(task: Task, plan: Plan) -> int:
    """Bytes of the dense gradients the plan's data-parallel tables all-reduce each step (one replica's worth
    per table: every weight of it, in the weights' precision)."""
    tables = {t.name: t for t in task.tables}
    names = {s.table for s in plan.shards if s.replica}
    return sum(task.memory.weight_bytes(tables[n].rows, tables[n].dim, tables[n].precision) for n in sorted(names))


def output_widths(plan: Plan, task: Task | None = None) -> list[float]:
    """Per device, the output elements per sample its shards send through the all-to-all: a pooled shard's width,
    a sequence table's (an EmbeddingCollection's: a row per id) width x its ids per sample (its pooling factor, a
    row block's share of them), nothing for a data-parallel replica. Without `task`, every shard counts as pooled."""
    tables = {t.name: t for t in task.tables} if task is not None else {}
    out = [0.0] * plan.num_devices
    for s in plan.shards:
        t = tables.get(s.table)
        out[s.device] += (0.0 if s.replica else float(s.width)) if t is None else \
            output_width(t, s.width, s.num_rows(t.rows), s.replica)
    return out


def output_width(table: Table, width: int, rows: int | None = None, replica: bool = False) -> float:
    """The output elements per sample a shard of `width` columns (and `rows` of the rows; all by default) of
    `table` sends through the all-to-all (output_widths): what the backends and the cost network both count."""
    if replica:
        return 0.0
    if table.sequence:
        return width * table.pooling_factor * (table.rows if rows is None else rows) / table.rows
    return float(width)


def assemble_plan_cost(backend, plan: Plan, compute: Sequence[ComputeCost], batch_size: int,
                       topology: Topology, comm: str = "model", hosts: Sequence[int] | None = None,
                       task: Task | None = None) -> PlanCost:
    """Add the modelled all-to-all to per-device compute costs (`hosts`: Task.host_ids), and the all-reduce of
    data-parallel replicas' gradients (`task` needed when the plan has replicas)."""
    dim_sums = output_widths(plan, task)
    fwd_comm, bwd_comm = communication_ms([c.fwd_ms for c in compute], dim_sums, batch_size, topology, hosts)
    if any(s.replica for s in plan.shards):
        if task is None:
            raise ValueError("assemble_plan_cost: the plan has data-parallel replicas; pass its task")
        bwd_comm = bwd_comm + allreduce_ms(replica_gradient_bytes(task, plan), plan.num_devices, topology, hosts)
    devices = tuple(DeviceCost(c.fwd_ms, c.bwd_ms, float(f), float(b)) for c, f, b in zip(compute, fwd_comm, bwd_comm))
    return PlanCost(devices, backend.name, backend.device_name(), backend.measured, comm)
