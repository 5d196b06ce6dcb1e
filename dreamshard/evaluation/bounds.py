"""Lower bounds on a task's plan cost, valid for the backend's fusion behaviour.

For a plan with device table sets S_1..S_N, cost = max_d cost_d >= mean_d cost_d, and
cost_d >= compute(S_d) + 2 x transfer_d (the forward all-to-all also waits for the
slowest device, which only adds). So

  cost >= (sum_d compute(S_d)) / N + 2 x mean_d transfer_d.

How sum_d compute(S_d) is bounded depends on how fusing tables changes their cost,
which is measured (`additivity_ratio`: fused cost / sum of single costs on probe sets),
never assumed from the kind of processor:
  super_additive or mixed (large tables compete for cache while small ones still share
    the operator's fixed cost; measured for FBGEMM's CPU kernels on an Intel Xeon, 1.5-1.8x):
    assume fusion saves at most the fixed per-operator cost o per table joined, i.e.
    compute(S) >= o + sum_{t in S} (c(t) - o). o is at most the cheapest table's single
    cost m, so sum_d compute(S_d) >= sum_t c(t) - (T - 1) m.
  sub_additive (compute(A u B) <= compute(A) + compute(B): fusion saves launches and more;
    measured for FBGEMM's CPU kernels on an AMD EPYC, 0.96x): sum_d compute(S_d) >=
    compute(all tables fused). Probes of single tables cannot prove that for every split,
    so the smaller of this and the first bound is used.
The plain sum of single costs is NOT a bound on super-additive kernels: 8 small tables on
2 devices had an optimum below it (the evaluate stage's exhaustive check, Intel Xeon).
Transfers: every device sends its outputs to N-1 others,
so mean_d transfer_d >= latency + (N-1) B D bytes / (N^2 x fastest link), D the task's
total dim. Independently, the device holding table t costs at least c(t) + 2 x
(latency + (N-1)/N B dim_t bytes / fastest link), assuming a table's cost does not drop
when others join it (true in both regimes). When sharders may split tables by columns
(`column_splits`), that holds only for tables too narrow to split (dim 4), and a table's
work in the compute sum is the smaller of its whole work and dim/4 times the work of its
4-column slice: its slices do at least that much, whether wider rows make work per
column cheaper (FBGEMM's vectorised rows) or dearer (cache pressure in the analytic model).
Row ranges (row-wise shards) are not covered: no sharder makes them yet, and the bound is not
proven for plans that hold them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dreamshard.hardware.base import CostBackend
from dreamshard.hardware.comm import Topology
from dreamshard.plan import Shard
from dreamshard.tasks import Task

SUPER_ADDITIVE = "super_additive"
SUB_ADDITIVE = "sub_additive"
MIXED = "mixed"


# what metrics/eval.json says of the bound each measured regime uses
BOUND_USED = {
    SUPER_ADDITIVE: "(sum of single-table costs - (T-1) x cheapest single cost) / N + all-to-all bound",
    SUB_ADDITIVE: "cost of all tables fused / N + all-to-all bound",
    MIXED: "(sum of single-table costs - (T-1) x cheapest single cost) / N + all-to-all bound",
}


def whole_shards(task: Task, indices: Sequence[int] | None = None) -> list[Shard]:
    chosen = range(len(task.tables)) if indices is None else indices
    return [Shard(task.tables[i].name, 0, 0, task.tables[i].dim) for i in chosen]


def additivity_ratio(backend: CostBackend, task: Task, max_tables: int = 20) -> float:
    """compute(first tables fused) / sum of their single-table computes."""
    shards = whole_shards(task, range(min(max_tables, len(task.tables))))
    fused = backend.compute_cost(task, shards).total_ms
    single = sum(backend.compute_cost(task, [s]).total_ms for s in shards)
    return fused / single


def regime_of(ratios: Sequence[float]) -> str:
    if all(r >= 1.0 for r in ratios):
        return SUPER_ADDITIVE
    if all(r < 1.0 for r in ratios):
        return SUB_ADDITIVE
    return MIXED


@dataclass(frozen=True)
class LowerBound:
    total_ms: float
    compute_mean_ms: float  # the compute-sum part, already divided by N (0 when not justified)
    transfer_mean_ms: float  # lower bound on the mean per-device transfer (one direction)
    max_table_ms: float  # the single-table bound, communication included


def _fastest_seconds_per_byte(topology: Topology, n: int) -> float:
    fastest = topology.intra_host_gbps if n <= topology.devices_per_host else max(
        topology.intra_host_gbps, topology.inter_host_gbps)
    return 1.0 / (fastest * 1e9)


def lower_bound(backend: CostBackend, task: Task, regime: str, batch_size: int, topology: Topology,
                column_splits: bool = False) -> LowerBound:
    n = task.num_devices
    singles = [backend.compute_cost(task, [s]).total_ms for s in whole_shards(task)]
    fixed = min(singles)  # >= the fixed per-operator cost o
    work = np.asarray(singles) - fixed
    if column_splits:
        # a table's slices do at least dim/4 times the work of its narrowest (4-column) slice
        # or at least the whole table's work, whichever way width changes the work per column
        narrow = [backend.compute_cost(task, [Shard(t.name, 0, 0, 4)]).total_ms for t in task.tables]
        fixed = min(fixed, min(narrow))
        work = np.minimum(np.asarray(singles) - fixed,
                          np.asarray([t.dim / 4 for t in task.tables]) * (np.asarray(narrow) - fixed))
    conservative = (max(0.0, float(work.sum())) + fixed) / n
    if n == 1 and not column_splits:
        compute_mean = backend.compute_cost(task, whole_shards(task)).total_ms  # the only plan there is
    elif regime == SUB_ADDITIVE:
        # fused(all) / N holds only if fusion never costs more than any split: keep the smaller
        compute_mean = min(backend.compute_cost(task, whole_shards(task)).total_ms / n, conservative)
    else:
        compute_mean = conservative
    if n > 1:
        spb = _fastest_seconds_per_byte(topology, n)
        latency_ms = topology.latency_us * 1e-3
        total_dim = sum(t.dim for t in task.tables)
        transfer_mean = latency_ms + (n - 1) * batch_size * total_dim * topology.output_bytes * spb / n**2 * 1e3
        per_table_transfer = [latency_ms + (n - 1) / n * batch_size * t.dim * topology.output_bytes * spb * 1e3
                              for t in task.tables]
    else:
        transfer_mean, per_table_transfer = 0.0, [0.0] * len(task.tables)
    whole = [i for i, t in enumerate(task.tables) if not column_splits or t.dim < 8]
    per_table = np.asarray(singles) + 2 * np.asarray(per_table_transfer)
    max_table = float(per_table[whole].max()) if whole else 0.0
    total = max(compute_mean + 2 * transfer_mean, max_table)
    return LowerBound(total, compute_mean, transfer_mean, max_table)
