"""All-to-all communication model for model-parallel embeddings.

Every backend adds it to its compute: the input dist (each shard's ids and lengths, sent to its device before
the lookups: a column slice gets all of its table's, a row block the ids in its rows), the forward all-to-all of
pooled outputs (row shards send partial sums), the wait for the slowest device's forward, and the backward
exchange of the outputs' gradients, over intra- and inter-host links; sequence tables send a row per id,
data-parallel replicas send no ids nor outputs, and their dense gradients are all-reduced in the backward;
tables in TorchRec's table_row_wise layout reduce-scatter within their host, then exchange across hosts;
each lookup kind runs its own input dist (three collectives) and output dist (one each way): their latencies.
A device's traffic: [output elements, input bytes] per sample (`shard_traffic`, `plan_traffic`).
The model and what it leaves out: docs/cost-backends.md.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from dreamshard.hardware.base import ComputeCost, DeviceCost, PlanCost
from dreamshard.hardware.topology import Topology
from dreamshard.plan import LOOKUP_KINDS, Plan, host_of_blocks, lookup_kind
from dreamshard.tables import Table
from dreamshard.tasks import Task

# what a journal keys rows priced by this model with, so that a changed model measures them again (2: the input dist;
# 3: table_row_wise's two-level exchange; 4: dists per lookup kind)
MODEL_VERSION = 4
# TorchRec's KJTAllToAll: an all-to-all of the splits, then one of the lengths and one of the ids
INPUT_DIST_COLLECTIVES = 3
# the lookup kinds that run an input and an output dist (plan.LOOKUP_KINDS but data: a replica's ids stay local)
DIST_KINDS = ("table", "column", "row")
# the same as a mask over plan.LOOKUP_KINDS: the cost models' lookup groups (by kind) that run dists
DIST_GROUP_MASK = np.array([k in DIST_KINDS for k in LOOKUP_KINDS])


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


def transfer_ms(dim_sums: Sequence[float] | np.ndarray, batch_size: int, topology: Topology,
                hosts: Sequence[int] | None = None) -> np.ndarray:
    """Forward all-to-all of pooled outputs, each device's transfer time, ms (the backward one is the same)."""
    return exchange_ms(np.asarray(dim_sums, dtype=np.float64) * topology.output_bytes, batch_size, topology, hosts)


def input_dist_ms(id_bytes: Sequence[float] | np.ndarray, batch_size: int, topology: Topology,
                  hosts: Sequence[int] | None = None) -> np.ndarray:
    """The input dist, each device's transfer time, ms: device d receives from every other device the ids and
    lengths of that device's B/n samples for d's shards (`id_bytes` per sample): the output exchange reversed."""
    return exchange_ms(id_bytes, batch_size, topology, hosts)


def exchange_ms(bytes_per_sample: Sequence[float] | np.ndarray, batch_size: int, topology: Topology,
                hosts: Sequence[int] | None = None) -> np.ndarray:
    """An all-to-all in which device d and each other device e exchange B/n x bytes_per_sample[d] bytes: each
    device's time, ms: latency + the larger of its send and receive time over the links of `seconds_per_byte`, the
    sums taken host by host (linear in devices, where the [n, n] links took 100000^2 x 8 bytes for 100000)."""
    n = len(bytes_per_sample)
    if n == 1:
        return np.zeros(1)
    block = batch_size / n * np.asarray(bytes_per_sample, dtype=np.float64)  # bytes d -> e
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
    fwd_compute_ms: Sequence[float], traffic: np.ndarray | Sequence[Sequence[float]], batch_size: int,
    topology: Topology, hosts: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(fwd_comm_ms, bwd_comm_ms) per device given its traffic [D, 2] (`plan_traffic`): the forward is the input
    dist, the wait for the slowest device and the output transfer; the backward, the outputs' gradients back."""
    fwd = np.asarray(fwd_compute_ms, dtype=np.float64)
    traffic = as_traffic(traffic, len(fwd))
    if len(fwd) == 1:
        return np.zeros(1), np.zeros(1)
    transfer = transfer_ms(traffic[:, 0], batch_size, topology, hosts)
    # send and receive swap roles in the backward pass; max(send, recv) is symmetric in them
    return input_dist_ms(traffic[:, 1], batch_size, topology, hosts) + forward_wait_ms(fwd) + transfer, transfer


def dist_groups(plan: Plan, task: Task) -> int:
    """How many lookup groups of `plan` run their own dists (TorchRec shards a module by sharding type, each with
    its input and output dist): `dist_group_count` of its shards' lookup kinds. table_row_wise and grid blocks
    count as row-wise, as the cost models' lookup groups do; sequence tables by their kind too (the cost models
    know none)."""
    tables = {t.name: t for t in task.tables}
    return dist_group_count(lookup_kind(s.num_rows(tables[s.table].rows), s.width, tables[s.table].rows,
                                        tables[s.table].dim, s.replica) for s in plan.shards)


def dist_group_count(kinds: Iterable[str]) -> int:
    """The distinct DIST_KINDS among lookup kinds `kinds` (plan.LOOKUP_KINDS)."""
    return len(set(kinds) & set(DIST_KINDS))


def dist_latency_ms(groups: int, n: int, topology: Topology) -> tuple[float, float]:
    """(forward, backward) ms of `groups` (at least one) lookup groups' dists on n devices (`dist_latencies`);
    0 on one device."""
    if n == 1:
        return 0.0, 0.0
    return dist_latencies(max(groups, 1), topology.latency_us * 1e-3)


def dist_latencies(groups, latency_ms):
    """(forward, backward) ms of the dists' latencies beyond the one each `exchange_ms` charges, for `groups` >= 1
    lookup groups (a number, or an array or tensor of them: the cost models' twins call this too): each group's
    input dist is INPUT_DIST_COLLECTIVES collectives and its outputs one each way, every device joining each."""
    return latency_ms * ((INPUT_DIST_COLLECTIVES + 1) * groups - 2), latency_ms * (groups - 1)


def as_traffic(traffic: np.ndarray | Sequence[Sequence[float]], n: int) -> np.ndarray:
    """`traffic` as a [n, 2] float array; a clear error for any other shape (a list of dim sums, say)."""
    out = np.asarray(traffic, dtype=np.float64)
    if out.shape != (n, 2):
        raise ValueError(f"traffic: expected [{n}, 2] (output elements, input bytes per sample of each device), "
                         f"got shape {out.shape}")
    return out


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


def output_width(table: Table, width: int, rows: int | None = None, replica: bool = False) -> float:
    """The output elements per sample a shard of `width` columns (and `rows` of the rows; all by default) of
    `table` sends through the all-to-all (`shard_traffic`'s first part)."""
    if replica:
        return 0.0
    if table.sequence:
        return width * table.pooling_factor * (table.rows if rows is None else rows) / table.rows
    return float(width)


def input_bytes(table: Table, rows: int | None = None, replica: bool = False,
                topology: Topology | None = None) -> float:
    """The bytes per sample of a shard's input dist (`rows` of the table's rows; all by default): the ids its rows
    get (the table's pooling x rows / table rows, as Table.piece counts a block's lookups) and one length per
    feature; every column slice gets them all; none for a data-parallel replica (its ids stay local)."""
    if replica:
        return 0.0
    topo = topology or Topology()
    share = 1.0 if rows is None else rows / table.rows
    return table.pooling_factor * share * topo.index_bytes + table.features * topo.length_bytes


def shard_traffic(table: Table, width: int, rows: int | None = None, replica: bool = False,
                  topology: Topology | None = None) -> tuple[float, float]:
    """(output elements, input bytes) per sample of a shard: what the backends and the cost models both count."""
    return output_width(table, width, rows, replica), input_bytes(table, rows, replica, topology)


def plan_traffic(plan: Plan, task: Task, topology: Topology | None = None) -> np.ndarray:
    """[D, 2] each device's traffic per sample: the sums of its shards' `shard_traffic`; the outputs of tables in
    TorchRec's table_row_wise layout travel by `host_exchange_ms` instead (their ids as any row block's)."""
    tables = {t.name: t for t in task.tables}
    two_level = host_layouts(plan, task)
    out = np.zeros((plan.num_devices, 2))
    for s in plan.shards:
        t = tables[s.table]
        traffic = shard_traffic(t, s.width, s.num_rows(t.rows), s.replica, topology)
        out[s.device] += (0.0, traffic[1]) if s.table in two_level else traffic
    return out


def host_layouts(plan: Plan, task: Task) -> dict[str, int]:
    """The tables `plan` lays out as TorchRec's table_row_wise (plan.host_of_blocks), each with its host."""
    if task.per_host() is None:
        return {}
    placed: dict[str, list] = {}
    for s in plan.shards:
        placed.setdefault(s.table, []).append(s)
    found = {}
    for t in task.tables:
        host = host_of_blocks(task, t, placed.get(t.name, []))
        if host is not None:
            found[t.name] = host
    return found


def host_block_bytes(table: Table, per_host: int, num_devices: int, batch_size: int,
                     topology: Topology) -> tuple[float, float, float]:
    """A table_row_wise table's output bytes, one way (host_exchange_ms): each device of its host reduce-scatters
    the first over the intra-host link and sends the second across hosts; each device of another host receives
    the third."""
    out = batch_size * output_width(table, table.dim) * topology.output_bytes  # B x width bytes
    hosts = num_devices // per_host
    return out * (per_host - 1) / per_host, (hosts - 1) * out / num_devices, out / num_devices


def host_exchange_ms(plan: Plan, task: Task, batch_size: int, topology: Topology) -> np.ndarray:
    """[D] ms each device spends on the outputs of table_row_wise tables (`host_layouts`), one way (the backward's
    gradients take as long): TorchRec reduce-scatters a table's partial sums among its host's L devices (each
    sends and receives (L-1)/L of its B x width outputs over the intra-host link), then each of them sends the
    sums for the B/N samples of its local rank on each other host to that host's device of the same local rank
    (over the inter-host link): an all-to-all with 1/L of a flat row-wise exchange's inter-host bytes. One latency
    per collective; 0 where the plan has no such table."""
    n = plan.num_devices
    layouts = host_layouts(plan, task)
    if not layouts:
        return np.zeros(n)
    per_host = task.per_host()
    assert per_host is not None  # host_layouts found tables
    tables = {t.name: t for t in task.tables}
    intra, send, recv = np.zeros(n), np.zeros(n), np.zeros(n)
    for name, h in layouts.items():
        own = np.arange(h * per_host, (h + 1) * per_host)
        table_intra, table_send, table_recv = host_block_bytes(tables[name], per_host, n, batch_size, topology)
        intra[own] += table_intra
        send[own] += table_send
        recv[np.setdiff1d(np.arange(n), own)] += table_recv
    reduce_scatter = topology.latency_us * 1e-6 + intra / (topology.intra_host_gbps * 1e9)
    exchange = topology.latency_us * 1e-6 + np.maximum(send, recv) / (topology.inter_host_gbps * 1e9)
    return (reduce_scatter + exchange) * 1e3


def assemble_plan_cost(backend, plan: Plan, compute: Sequence[ComputeCost], batch_size: int,
                       topology: Topology, task: Task, comm: str = "model",
                       hosts: Sequence[int] | None = None) -> PlanCost:
    """Add the modelled input dist and all-to-all to per-device compute costs (`hosts`: Task.host_ids), the
    latencies of each lookup group's dists, and the all-reduce of data-parallel replicas' gradients."""
    traffic = plan_traffic(plan, task, topology)
    fwd_comm, bwd_comm = communication_ms([c.fwd_ms for c in compute], traffic, batch_size, topology, hosts)
    two_level = host_exchange_ms(plan, task, batch_size, topology)
    fwd_dists, bwd_dists = dist_latency_ms(dist_groups(plan, task), plan.num_devices, topology)
    fwd_comm, bwd_comm = fwd_comm + two_level + fwd_dists, bwd_comm + two_level + bwd_dists
    if any(s.replica for s in plan.shards):
        bwd_comm = bwd_comm + allreduce_ms(replica_gradient_bytes(task, plan), plan.num_devices, topology, hosts)
    devices = tuple(DeviceCost(c.fwd_ms, c.bwd_ms, float(f), float(b)) for c, f, b in zip(compute, fwd_comm, bwd_comm))
    return PlanCost(devices, backend.name, backend.device_name(), backend.measured, comm)
