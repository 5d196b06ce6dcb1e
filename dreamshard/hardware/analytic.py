"""A deterministic cost model of the fused embedding operator: for tests and quick experiments.

Its numbers are a model, never measurements (`measured = False`, backend "analytic"). Its `regime` (no
default) chooses whether fusing tables costs more (`super_additive`) or less (`sub_additive`) than running
them apart, since real kernels differ between processors. The model's formula: docs/cost-backends.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dreamshard.caching import hit_rate
from dreamshard.hardware.base import ComputeCost, PlanCost
from dreamshard.hardware.comm import Topology, assemble_plan_cost, communication_ms
from dreamshard.memory import BYTES_PER_WEIGHT, DEFAULT_BATCH_SIZE
from dreamshard.plan import Plan, Shard
from dreamshard.tables import NUM_BINS, Table
from dreamshard.tasks import Task

REGIMES = ("super_additive", "sub_additive")
# representative access count of each bin: 1, then the upper edge 2^k, and 2^16 for "more"
_BIN_COUNTS = np.array([2.0**k for k in range(NUM_BINS)])


def cold_fraction(table: Table) -> float:
    """Share of lookups that touch a row for the first time in the batch."""
    if table.bins is None or sum(table.bins) == 0:
        return 0.5
    bins = np.asarray(table.bins)
    mean_count = float((bins * _BIN_COUNTS).sum() / bins.sum())
    return 1.0 / max(mean_count, 1.0)


@dataclass(frozen=True)
class AnalyticConfig:
    regime: str  # one of REGIMES: how fusing tables changes their cost (see the module docstring)
    batch_size: int = DEFAULT_BATCH_SIZE
    launch_us: float = 50.0
    lookup_ns: float = 1.0  # per looked-up element of a row
    output_ns: float = 0.5  # per pooled-output element
    miss_penalty: float = 0.6
    cache_bytes: float = 8 * 2**20
    bwd_factor: float = 1.5
    update_ns: float = 2.0  # per updated element of a touched row
    uvm_miss_factor: float = 20.0  # a UVM-cached table's row read from host memory costs this many reads from HBM
    topology: Topology = field(default_factory=Topology)

    def __post_init__(self) -> None:
        if self.regime not in REGIMES:
            hint = " (regimes are named by what fusion does, not by hardware)" if self.regime in ("cpu", "gpu") else ""
            raise ValueError(f"regime: expected one of {', '.join(REGIMES)}, got {self.regime!r}{hint}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size: expected >= 1, got {self.batch_size}")


class AnalyticBackend:
    name = "analytic"
    measured = False

    def __init__(self, config: AnalyticConfig) -> None:
        self.config = config

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def topology(self) -> Topology:
        return self.config.topology

    def device_name(self) -> str:
        return f"analytic model ({self.config.regime} regime)"

    def versions(self) -> dict[str, str]:
        return {"analytic": "1"}

    def compute_cost(self, task: Task, shards: Sequence[Shard]) -> ComputeCost:
        if not shards:
            return ComputeCost(0.0, 0.0)
        c = self.config
        tables = {t.name: t for t in task.tables}
        bytes_per = {s.table: BYTES_PER_WEIGHT[tables[s.table].precision or task.memory.weights_precision]
                     for s in shards}
        # a row shard gets its rows' share of the table's lookups: hot rows are scattered over the table
        share = [s.num_rows(tables[s.table].rows) / tables[s.table].rows for s in shards]
        # a data-parallel replica looks up its device's share of the batch, and updates every row (dense gradient)
        batch = [c.batch_size / task.num_devices if s.replica else c.batch_size for s in shards]
        lookups = [b * tables[s.table].pooling_factor * f for s, f, b in zip(shards, share, batch)]
        touched = [min(s.num_rows(tables[s.table].rows), n * cold_fraction(tables[s.table]))
                   for s, n in zip(shards, lookups)]
        updated = [tables[s.table].rows if s.replica else r for s, r in zip(shards, touched)]
        widths = [s.width for s in shards]
        working_set = [r * w * bytes_per[s.table] for r, w, s in zip(touched, widths, shards)]
        # a UVM-cached shard reads its cache misses from host memory (the hit rate from its bins: dreamshard.caching)
        factors = [s.load_factor(tables[s.table]) for s in shards]
        host = [1.0 if f is None else 1.0 + (c.uvm_miss_factor - 1.0) * (1.0 - hit_rate(tables[s.table], f, c.batch_size))
                for s, f in zip(shards, factors)]
        work_us = update_us = 0.0
        # outputs: a pooled row per sample, or for a sequence table (no pooling) a row per id looked up
        outputs = [n if tables[s.table].sequence else b for s, n, b in zip(shards, lookups, batch)]
        together = sum(working_set)  # the device's working set (once: in the loop it was quadratic in its shards)
        for n, rows, width, own, out, far in zip(lookups, updated, widths, working_set, outputs, host):
            pressure = min(1.0, (own if c.regime == "sub_additive" else together) / c.cache_bytes)
            miss = (1.0 + c.miss_penalty * pressure) * far
            work_us += (n * width * c.lookup_ns * miss + out * width * c.output_ns) / 1000
            update_us += rows * width * c.update_ns / 1000
        fwd_us = c.launch_us + work_us
        bwd_us = c.launch_us + c.bwd_factor * work_us + update_us
        return ComputeCost(fwd_us / 1000, bwd_us / 1000)

    def communication_cost(self, fwd_ms, traffic):
        """The communication model (dreamshard.hardware.comm): not measured by this backend."""
        return communication_ms(fwd_ms, traffic, self.batch_size, self.topology)

    def plan_cost(self, task: Task, plan: Plan) -> PlanCost:
        """Each device's compute is the reference device's (compute_cost) / its speed; hosts as the task names them."""
        return self.plan_cost_from(task, plan, [self.compute_cost(task, plan.device_shards(d))
                                                for d in range(plan.num_devices)])

    def plan_cost_from(self, task: Task, plan: Plan, compute: Sequence[ComputeCost]) -> PlanCost:
        scaled_compute = [scaled(c, task.devices[d].speed) for d, c in enumerate(compute)]
        return assemble_plan_cost(self, plan, scaled_compute, self.batch_size, self.topology,
                                  hosts=task.host_ids(), task=task)


def scaled(cost: ComputeCost, speed: float) -> ComputeCost:
    """A reference device's compute cost on a device of relative `speed`."""
    return cost if speed == 1.0 else ComputeCost(cost.fwd_ms / speed, cost.bwd_ms / speed)
