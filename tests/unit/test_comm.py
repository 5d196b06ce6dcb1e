"""The all-to-all model (dreamshard.hardware.comm) and how plan costs add it to compute."""
from __future__ import annotations

import numpy as np
import pytest

from dreamshard.hardware.base import ComputeCost
from dreamshard.hardware.comm import (
    Topology,
    assemble_plan_cost,
    communication_ms,
    dist_latency_ms,
    transfer_ms,
)
from dreamshard.plan import Plan, Shard, validate_plan
from dreamshard.tables import Table
from dreamshard.tasks import Task
from helpers import analytic as backend

# ---------------------------------------------------------------- communication model


def test_transfer_two_devices_on_one_host():
    # B = 1000 over 2 devices: blocks of 500 samples; 4 B per element; 100 GB/s; 10 us latency
    topo = Topology(devices_per_host=8, intra_host_gbps=100.0, inter_host_gbps=1.0, latency_us=10.0, output_bytes=4)
    # device 0 sends 500 x 64 x 4 = 128,000 B (1.28 us) and receives 500 x 32 x 4 = 64,000 B (0.64 us);
    # device 1 the reverse: both take latency + 1.28 us = 11.28 us
    np.testing.assert_allclose(transfer_ms([64, 32], 1000, topo), [0.01128, 0.01128], rtol=1e-12)


def test_transfer_four_devices_on_two_hosts():
    # hosts {0, 1} and {2, 3}; intra 100 GB/s, inter 10 GB/s; 5 us latency; 2 B per element
    topo = Topology(devices_per_host=2, intra_host_gbps=100.0, inter_host_gbps=10.0, latency_us=5.0, output_bytes=2)
    # B = 800 over 4 devices: a block is 200 samples x dim x 2 B = 400 x dim B -> 6400, 12800, 19200, 25600
    # d0: send 6400/100e9 + 2 x 6400/10e9 = 1.344 us; recv 12800/100e9 + (19200 + 25600)/10e9 = 4.608 us
    # d1: send 12800/100e9 + 2 x 12800/10e9 = 2.688 us; recv 6400/100e9 + (19200 + 25600)/10e9 = 4.544 us
    # d2: send 19200/100e9 + 2 x 19200/10e9 = 4.032 us; recv 25600/100e9 + (6400 + 12800)/10e9 = 2.176 us
    # d3: send 25600/100e9 + 2 x 25600/10e9 = 5.376 us; recv 19200/100e9 + (6400 + 12800)/10e9 = 2.112 us
    expected = np.array([5 + 4.608, 5 + 4.544, 5 + 4.032, 5 + 5.376]) / 1000
    transfer = transfer_ms([16, 32, 48, 64], 800, topo)
    np.testing.assert_allclose(transfer, expected, rtol=1e-12)

    fwd = [1.0, 2.5, 0.5, 2.0]  # device 1 is the slowest: the others wait for it
    fwd_comm, bwd_comm = communication_ms(fwd, [[16, 0], [32, 0], [48, 0], [64, 0]], 800, topo)
    # no ids to send: the input dist is its latency alone (5 us)
    np.testing.assert_allclose(fwd_comm, np.array([1.5, 0.0, 2.0, 0.5]) + 0.005 + expected, rtol=1e-12)
    np.testing.assert_allclose(bwd_comm, expected, rtol=1e-12)


def test_one_device_has_no_communication():
    topo = Topology()
    np.testing.assert_array_equal(transfer_ms([128], 4096, topo), [0.0])
    fwd_comm, bwd_comm = communication_ms([3.0], [[128, 40]], 4096, topo)
    np.testing.assert_array_equal(fwd_comm, [0.0])
    np.testing.assert_array_equal(bwd_comm, [0.0])


def test_communication_grows_with_dims_and_batch():
    topo = Topology()
    base = transfer_ms([32, 32], 1024, topo)
    assert (transfer_ms([64, 64], 1024, topo) > base).all()
    assert (transfer_ms([32, 32], 2048, topo) > base).all()
    # a device alone on its host pays the slow link
    assert transfer_ms([32, 32], 1024, Topology(devices_per_host=1))[0] > base[0]


@pytest.mark.parametrize("kwargs", [dict(devices_per_host=0), dict(intra_host_gbps=0.0), dict(inter_host_gbps=-1.0),
                                    dict(latency_us=-1.0), dict(output_bytes=0)])
def test_topology_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match="topology"):
        Topology(**kwargs)


def test_assemble_plan_cost_adds_the_all_to_all():
    topo = Topology(devices_per_host=8, intra_host_gbps=100.0, latency_us=10.0, output_bytes=4)
    tables = [Table("a", 1000, 16, 1.0), Table("b", 1000, 32, 1.0), Table("c", 1000, 8, 1.0)]
    task = Task.uniform("asm", tables, 2, 1.0)
    # table b split by columns: [0, 16) on device 0, [16, 32) on device 1 -> dim sums 16 + 16 = 32 and 16 + 8 = 24
    plan = Plan(2, (Shard("a", 0, 0, 16), Shard("b", 0, 0, 16), Shard("b", 1, 16, 32), Shard("c", 1, 0, 8)))
    validate_plan(task, plan)
    compute = [ComputeCost(2.0, 3.0), ComputeCost(1.0, 1.5)]
    cost = assemble_plan_cost(backend(), plan, compute, 1000, topo, task)
    # blocks 500 x 32 x 4 = 64,000 B and 500 x 24 x 4 = 48,000 B; each device: 10 us + 0.64 us
    transfer = 0.01064
    # the input dist: each shard's ids (1 per sample, 8 B) and length (4 B), b's twice (once per slice): 24 B per
    # sample on each device, blocks of 500 x 24 = 12,000 B: 10 us + 0.12 us
    input_dist = 0.01012
    # two lookup groups (a and c whole, b by columns), each an input dist of 3 collectives and an output dist each
    # way: 8 latencies forward and 2 backward, of which the exchanges above charge 2 and 1
    fwd_dists, bwd_dists = 0.06, 0.01
    assert cost.devices[0].fwd_ms == 2.0 and cost.devices[0].bwd_ms == 3.0
    assert cost.devices[1].fwd_ms == 1.0 and cost.devices[1].bwd_ms == 1.5
    assert cost.devices[0].fwd_comm_ms == pytest.approx(input_dist + transfer + fwd_dists, rel=1e-12)
    assert cost.devices[1].fwd_comm_ms == pytest.approx(input_dist + 1.0 + transfer + fwd_dists, rel=1e-12)
    assert cost.devices[0].bwd_comm_ms == pytest.approx(transfer + bwd_dists, rel=1e-12)
    assert cost.devices[1].bwd_comm_ms == pytest.approx(transfer + bwd_dists, rel=1e-12)
    assert cost.cost_ms == pytest.approx(5.0 + input_dist + 2 * transfer + fwd_dists + bwd_dists, rel=1e-12)
    assert (cost.backend, cost.measured, cost.comm) == ("analytic", False, "model")
    assert cost.device_name == backend().device_name()



def test_row_shards_move_their_partial_sums_hand_computed():
    """Table t (dim 16) split by rows over devices 0 and 1, table u (dim 8) whole on device 1; 2 devices, one host.

    Forward: each device's partial sums of t (B x 16) go, batch share B/2, to the other device;
    device 1 also sends u's outputs: send_0 = B/2 x 16 x 4 B, send_1 = B/2 x (16 + 8) x 4 B,
    and each receives what the other sends: transfer_d = latency + max(send_d, recv_d) / bandwidth.
    """
    from dreamshard.plan import Plan, Shard
    from dreamshard.tasks import Task

    topo = Topology(devices_per_host=2, intra_host_gbps=100.0, latency_us=10.0, output_bytes=4)
    task = Task.uniform("rows", [Table("t", 1000, 16, 3.0), Table("u", 50, 8, 1.0)], 2, 1.0)
    plan = Plan(2, (Shard("t", 0, 0, 16, 0, 400), Shard("t", 1, 0, 16, 400, 1000), Shard("u", 1, 0, 8)))
    b = backend("sub_additive", batch_size=1000, topology=topo)
    cost = b.plan_cost(task, plan)
    send = [500 * 16 * 4, 500 * 24 * 4]  # bytes
    by_hand = [(10e-6 + max(send[0], send[1]) / 100e9) * 1e3] * 2  # each receives the other's send
    # two lookup groups (t by rows, u whole): each group's input dist 3 collectives, its output dist 1 each way; the
    # exchanges charge 2 latencies forward and 1 backward, the rest (6 and 1) come with the groups
    assert [d.bwd_comm_ms for d in cost.devices] == pytest.approx([t + 0.01 for t in by_hand])
    fwd = [d.fwd_ms for d in cost.devices]
    # the input dist: t's ids bucketised by rows (3 per sample x 0.4 and x 0.6), u's, 8 B each, a 4 B length per
    # shard: 13.6 and 30.4 B per sample; each device receives or sends the larger block, 500 x 30.4 B
    input_dist = (10e-6 + 500 * 30.4 / 100e9) * 1e3
    assert [d.fwd_comm_ms for d in cost.devices] == pytest.approx([input_dist + max(fwd) - f + t + 0.06
                                                                   for f, t in zip(fwd, by_hand)])


def test_the_cost_networks_all_to_all_is_the_models_formula():
    """The cost network's torch twin of transfer_ms (CostNet.transfer_ms, with the seconds per byte of
    DeviceLinks.of) gives the same times, devices on one host and on two, batched as the fit batches them."""
    import torch

    from dreamshard.learning.cost_model import CostNet, CostNetConfig, DeviceLinks

    topo = Topology(devices_per_host=4, intra_host_gbps=150.0, inter_host_gbps=12.5, latency_us=10.0, output_bytes=4)
    config = CostNetConfig(comm="model", batch_size=4096, topology=topo)
    net = CostNet(config, torch.Generator().manual_seed(0))
    rng = np.random.default_rng(0)
    for n, hosts in ((2, None), (4, None), (8, None), (8, [0, 1, 0, 1, 0, 1, 0, 1])):
        dims = rng.integers(4, 1024, size=(3, n))
        cluster = DeviceLinks.of(config, [1.0] * n, hosts)
        twin = net.transfer_ms(torch.from_numpy(dims).float(), cluster).numpy()
        for row, got in zip(dims, twin):
            np.testing.assert_allclose(got, transfer_ms(row.tolist(), 4096, topo, hosts), rtol=1e-5)



def test_sequence_tables_send_a_row_per_id_and_pooled_ones_a_row_per_sample():
    """An EmbeddingCollection's table returns every id's row: through the all-to-all it sends width x ids per sample
    (a row block its share of them), where a pooled table sends width; the analytic model's output work alike."""
    from dataclasses import replace

    from dreamshard.hardware.comm import plan_traffic

    pooled = Table("p", 1000, 16, 8.0)
    seq = replace(Table("s", 1000, 16, 8.0), sequence=True)
    task = Task.uniform("t", [pooled, seq], 2, 1.0)
    plan = Plan(2, (Shard("p", 0, 0, 16), Shard("s", 1, 0, 16)))
    assert plan_traffic(plan, task)[:, 0].tolist() == [16.0, 16.0 * 8]
    rows = Plan(2, (Shard("p", 0, 0, 16), Shard("s", 0, 0, 16, 0, 250), Shard("s", 1, 0, 16, 250, 1000)))
    assert plan_traffic(rows, task)[:, 0].tolist() == [16.0 + 16 * 8 * 0.25, 16 * 8 * 0.75]
    cost = backend(batch_size=1024).plan_cost(task, plan)
    pooled_twin = backend(batch_size=1024).plan_cost(replace(task, tables=(pooled, replace(seq, sequence=False))), plan)
    # device 1 sends 8x the output: its transfer is longer; its compute writes 8x the output rows
    assert cost.devices[1].bwd_comm_ms > pooled_twin.devices[1].bwd_comm_ms
    assert cost.devices[1].fwd_ms > pooled_twin.devices[1].fwd_ms
    assert cost.devices[0].fwd_ms == pooled_twin.devices[0].fwd_ms


def test_input_dist_counts_ids_and_lengths_as_torchrec_sends_them():
    """Column slices get all their table's ids, row blocks the ids of their rows, replicas none; the ids travel the
    output exchange's way reversed, so a device's input dist is exchange_ms of its input bytes."""
    from dreamshard.hardware.comm import exchange_ms, input_bytes, input_dist_ms, plan_traffic, shard_traffic

    topo = Topology(devices_per_host=4, intra_host_gbps=100.0, inter_host_gbps=10.0, latency_us=10.0)
    t = Table("t", 1000, 32, 20.0, features=2)
    assert input_bytes(t, topology=topo) == 20 * 8 + 2 * 4
    assert input_bytes(t, 250, topology=topo) == 5 * 8 + 2 * 4  # a quarter of the rows: a quarter of the ids
    assert input_bytes(t, replica=True) == 0.0
    assert shard_traffic(t, 16, topology=topo) == (16.0, 168.0)  # a slice: half the columns, every id
    task = Task.uniform("ids", [t, Table("u", 100, 8, 1.0)], 4, 1.0)
    columns = Plan(4, (Shard("t", 0, 0, 16), Shard("t", 1, 16, 32), Shard("u", 2, 0, 8)))
    validate_plan(task, columns)
    np.testing.assert_allclose(plan_traffic(columns, task, topo), [[16, 168], [16, 168], [8, 12], [0, 0]])
    ids = plan_traffic(columns, task, topo)[:, 1]
    np.testing.assert_allclose(input_dist_ms(ids, 800, topo, [0, 0, 1, 1]), exchange_ms(ids, 800, topo, [0, 0, 1, 1]))
    # device 0 receives its 200 x 168 B from device 1 (same host) and from devices 2 and 3 (the other host); it
    # sends device 1 its 200 x 168 B and device 2 its 200 x 12 B
    recv0 = 33_600 / 100e9 + 2 * 33_600 / 10e9
    send0 = 33_600 / 100e9 + (2_400 + 0) / 10e9
    assert input_dist_ms(ids, 800, topo, [0, 0, 1, 1])[0] == pytest.approx((10e-6 + max(recv0, send0)) * 1e3)
    # more column slices, more input bytes: each slice gets the table's ids again
    assert plan_traffic(columns, task, topo)[:, 1].sum() > input_bytes(t, topology=topo) + input_bytes(task.tables[1],
                                                                                                    topology=topo)


def test_the_cost_networks_communication_is_the_models():
    """CostNet.device_costs' comm term is comm.communication_ms' forward plus backward (input dist, wait,
    outputs and their gradients) and one lookup group's dists (a network of one group per device), given the
    same traffic, on one host and on two."""
    import torch

    from dreamshard.learning.cost_model import CostNet, CostNetConfig, DeviceLinks

    topo = Topology(devices_per_host=2, intra_host_gbps=150.0, inter_host_gbps=12.5, latency_us=10.0)
    config = CostNetConfig(comm="model", batch_size=2048, topology=topo)
    net = CostNet(config, torch.Generator().manual_seed(0))
    rng = np.random.default_rng(1)
    sums = torch.from_numpy(rng.normal(size=(4, config.embed))).float()
    traffic = np.stack([rng.integers(4, 512, 4), rng.uniform(10, 2000, 4)], axis=-1)
    for hosts in (None, [0, 1, 0, 1]):
        cluster = DeviceLinks.of(config, [1.0] * 4, hosts)
        with torch.no_grad():
            costs = net.device_costs(sums, torch.from_numpy(traffic).float(), cluster).double().numpy()
        fwd_comm, bwd_comm = communication_ms(costs[:, 0], traffic, 2048, topo, hosts)
        dists = sum(dist_latency_ms(1, 4, topo))
        np.testing.assert_allclose(costs[:, 2], fwd_comm + bwd_comm + dists, rtol=1e-4)


def test_repricing_evaluated_rows_without_the_input_dist_gives_back_the_old_model():
    """tools.comm_reprice's function: a row priced with the input dist, repriced without it, costs what the model
    without it gives (compute plus wait and transfers), and with it its own cost; a row whose devices do not sum to
    its cost is refused."""
    import json

    import pandas as pd

    from dreamshard.hardware.comm import input_dist_ms, plan_traffic
    from dreamshard.project.model_error import input_dist_repriced

    topo = Topology(devices_per_host=2, intra_host_gbps=100.0, inter_host_gbps=10.0, latency_us=10.0)
    task = Task.uniform("test/r/0000", [Table("a", 1000, 16, 30.0), Table("b", 500, 32, 2.0),
                                        Table("c", 800, 8, 9.0)], 4, 1.0)
    plan = Plan(4, (Shard("a", 0, 0, 8), Shard("a", 3, 8, 16), Shard("b", 1, 0, 32), Shard("c", 2, 0, 8)))
    cost = backend(batch_size=2048, topology=topo).plan_cost(task, plan)
    row = {"task": task.name, "algorithm": "x", "cost_ms": cost.cost_ms, "shards": json.dumps(plan.to_dict()["shards"]),
           **{k: [getattr(d, k) for d in cost.devices] for k in ("fwd_ms", "bwd_ms", "fwd_comm_ms", "bwd_comm_ms")}}
    params = {"backend": {"topology": {"devices_per_host": 2, "intra_host_gbps": 100.0, "inter_host_gbps": 10.0,
                                       "latency_us": 10.0}, "batch_size": 2048}}
    out = input_dist_repriced(pd.DataFrame([row]), {task.name: task}, params, priced_by=2).iloc[0]
    delta = input_dist_ms(plan_traffic(plan, task, topo)[:, 1], 2048, topo, task.host_ids())
    expected = max(d.total_ms - x for d, x in zip(cost.devices, delta))
    assert out.cost_ms_with == pytest.approx(cost.cost_ms, rel=1e-12)
    assert out.cost_ms_without == pytest.approx(expected, rel=1e-12) and out.cost_ms_without < out.cost_ms_with
    # the same row read as priced without it: with it, the input dist added once more
    again = input_dist_repriced(pd.DataFrame([row]), {task.name: task}, params, priced_by=1).iloc[0]
    assert again.cost_ms_without == pytest.approx(cost.cost_ms) and again.cost_ms_with > cost.cost_ms
    with pytest.raises(ValueError, match="do not sum"):
        input_dist_repriced(pd.DataFrame([{**row, "cost_ms": 2 * cost.cost_ms}]), {task.name: task}, params, 2)


def test_table_row_wise_reduces_within_its_host_then_crosses_hosts_once_per_local_rank():
    """Table t in TorchRec's table_row_wise layout on host 0 of 2 hosts x 2 devices: a reduce-scatter of its partial
    sums on host 0, then host 0's devices send the B/N-sample sums to host 1's device of the same local rank. By
    hand, and with 1/L of the inter-host bytes of the same blocks exchanged flat (its rows over all 4 devices)."""
    from dataclasses import replace

    from dreamshard.hardware.comm import host_exchange_ms, host_layouts, plan_traffic
    from dreamshard.plan import host_blocks

    topo = Topology(devices_per_host=2, intra_host_gbps=100.0, inter_host_gbps=10.0, latency_us=10.0)
    base = Task.uniform("twrw", [Table("t", 1000, 16, 4.0), Table("u", 100, 8, 1.0)], 4, 1.0)
    task = replace(base, devices=tuple(replace(d, host=f"h{i // 2}") for i, d in enumerate(base.devices)),
                   sharding=("table", "host"))
    blocks = [Shard("t", d, 0, 16, r0, r1) for d, (r0, r1) in host_blocks(1000, 2, 0)]
    plan = Plan(4, (*blocks, Shard("u", 3, 0, 8)))
    validate_plan(task, plan)
    assert host_layouts(plan, task) == {"t": 0}
    assert plan_traffic(plan, task, topo)[:, 0].tolist() == [0.0, 0.0, 0.0, 8.0]  # t's outputs go two-level
    b = 400
    out = b * 16 * 4  # B x width bytes of t's partial sums on each of its devices
    intra = out * 1 / 2  # (L - 1) / L of them, over the intra-host link
    inter_send, inter_recv = (2 - 1) * out / 4, out / 4  # host 0's devices send; host 1's receive B/N x width
    lat = 10e-6
    expected = [(2 * lat + intra / 100e9 + inter_send / 10e9) * 1e3] * 2 + [(2 * lat + inter_recv / 10e9) * 1e3] * 2
    np.testing.assert_allclose(host_exchange_ms(plan, task, b, topo), expected, rtol=1e-12)
    cost = backend(batch_size=b, topology=topo).plan_cost(task, plan)
    fwd_comm, bwd_comm = communication_ms([d.fwd_ms for d in cost.devices], plan_traffic(plan, task, topo), b, topo,
                                          task.host_ids())
    # two lookup groups' dists (t counts as row-wise, u whole): 6 latencies forward and 1 backward beyond the exchanges'
    np.testing.assert_allclose([d.bwd_comm_ms for d in cost.devices], bwd_comm + expected + 0.01, rtol=1e-12)
    np.testing.assert_allclose([d.fwd_comm_ms for d in cost.devices], fwd_comm + expected + 0.06, rtol=1e-12)
    # the same blocks exchanged flat (a row-wise table over one host's devices, where hosts are not named): every
    # block sends B/N x width to each of the other host's devices: L times the inter-host bytes
    flat = transfer_ms([16, 16, 0, 0], b, topo)
    assert flat[0] - lat * 1e3 > (16 * b / 4 * 4 * 2) / 10e9 * 1e3 * 0.999  # two inter-host peers per block
    assert host_exchange_ms(Plan(4, (*blocks, Shard("u", 3, 0, 8))), replace(task, devices=base.devices), b,
                            topo).tolist() == [0.0] * 4  # devices naming no hosts: no table_row_wise layout
