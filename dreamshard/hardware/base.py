"""The one interface every cost backend implements, and the numbers it returns.

A plan's cost is its slowest device: max over devices of
fwd + bwd (the fused operator's compute) + fwd_comm + bwd_comm (the all-to-all), in ms.
"""
from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from dreamshard.plan import Plan, Shard
from dreamshard.tasks import Task

if TYPE_CHECKING:
    from dreamshard.hardware.topology import Topology

R = TypeVar("R")

# how measure_rounds' readings become a plan's cost (median_cost); in the evaluation journal's fingerprint
REDUCTION = "device medians"
# how a bound's probe is read (least_reading); in the journal's fingerprint too: the bounds are journaled
PROBE_READING = "least of the rounds' readings, one build where the backend offers compute_readings"


@dataclass(frozen=True)
class ComputeCost:
    """One device's fused operator on its own: forward, and backward with the optimizer update."""

    fwd_ms: float
    bwd_ms: float

    @property
    def total_ms(self) -> float:
        return self.fwd_ms + self.bwd_ms


@dataclass(frozen=True)
class DeviceCost:
    fwd_ms: float
    bwd_ms: float
    fwd_comm_ms: float
    bwd_comm_ms: float

    @property
    def total_ms(self) -> float:
        return self.fwd_ms + self.bwd_ms + self.fwd_comm_ms + self.bwd_comm_ms


@dataclass(frozen=True)
class PlanCost:
    devices: tuple[DeviceCost, ...]
    backend: str  # "fbgemm" | "analytic"
    device_name: str  # the physical device the compute ran on (or "model" for analytic)
    measured: bool  # True only when real kernels ran
    comm: str  # how communication was obtained: "model" | "nccl"

    @property
    def cost_ms(self) -> float:
        return max(d.total_ms for d in self.devices)


class CostEstimator(Protocol):
    """What a plan of a task costs, however it is known: measured (every CostBackend), predicted (the cost network's
    `NetworkEstimate`, a `NeuroShardModel`) or TorchRec's perf model (`TorchRecEstimator`). Re-planning rates plans
    through it; PlanCost.measured says which kind of number it is."""

    def plan_cost(self, task: Task, plan: Plan) -> PlanCost:
        """Per-device compute and communication of a whole plan."""


class CostBackend(Protocol):
    """What a plan costs. Besides the plan, a cost depends on the task's devices (`Task.devices`: memory, speeds,
    hosts) and on what the backend holds: the batch every operator runs at and the topology the all-to-all
    crosses. Nothing takes those two beside a backend: they are read from it."""

    name: str
    measured: bool

    @property
    def batch_size(self) -> int:
        """The global batch every operator runs at."""

    @property
    def topology(self) -> Topology:
        """The links the all-to-all crosses."""

    def device_name(self) -> str:
        """The physical device (CPU model or GPU name) costs come from."""

    def versions(self) -> dict[str, str]:
        """Software versions that produced the costs."""

    def compute_cost(self, task: Task, shards: Sequence[Shard]) -> ComputeCost:
        """Cost of one device holding `shards` of `task`'s tables, on its own."""

    def plan_cost(self, task: Task, plan: Plan) -> PlanCost:
        """Per-device compute and communication of a whole plan."""

    def plan_cost_from(self, task: Task, plan: Plan, compute: Sequence[ComputeCost]) -> PlanCost:
        """The plan's cost given each device's compute_cost (a reference device's): what plan_cost adds to them
        (device speeds, the all-to-all). Lets a caller measure a device shard set once for several plans."""

    def communication_cost(self, fwd_ms: Sequence[float] | np.ndarray,
                           traffic: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(fwd_comm_ms, bwd_comm_ms) per device, given each device's forward compute and traffic [D, 2]
        (hardware.comm.plan_traffic: output elements, input bytes per sample)."""


def turns(count: int, rounds: int) -> list[tuple[int, int]]:
    """(round, item) in the order that measures `count` items `rounds` times in turns: items 0, 1, 2, then 1, 2, 0,
    then 2, 0, 1, ...; a slow spell of the machine then hits every item alike, not one item's every round."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds: expected an integer >= 1, got {rounds!r}")
    order = []
    for r in range(rounds):
        shift = r % count if count else 0
        order += [(r, i) for i in [*range(shift, count), *range(shift)]]
    return order


@dataclass(frozen=True)
class Reading:
    """One measurement of a plan: each device's operator on the reference device, the plan cost they make
    (backend.plan_cost_from), and how that cost is made from the devices' operators (`assemble`)."""

    compute: tuple[ComputeCost, ...]
    cost: PlanCost
    assemble: Callable[[Sequence[ComputeCost]], PlanCost] = field(compare=False, repr=False)


def device_medians(readings: Sequence[Reading]) -> list[ComputeCost]:
    """Each device's median forward and median backward across `readings` (statistics.median: the mean of the
    two middle ones for an even count)."""
    if not readings:
        raise ValueError("device_medians: no readings")
    return [ComputeCost(statistics.median(r.compute[d].fwd_ms for r in readings),
                        statistics.median(r.compute[d].bwd_ms for r in readings))
            for d in range(len(readings[0].compute))]


def median_cost(readings: Sequence[Reading]) -> PlanCost:
    """The plan cost of each device's median operator across `readings` (device_medians), not the median of the
    whole-plan readings: the devices are timed one after another, so a slow spell of the machine lands on some
    devices of a reading, and a plan's max over devices takes whichever was hit (results/measure-protocol)."""
    return readings[0].assemble(device_medians(readings))


def least_compute(readings: Sequence[Reading]) -> ComputeCost:
    """The least reading of the operator on the plan's first device (a lower bound's probe: one operator, read
    several times, wants the least any reading showed)."""
    return min((r.compute[0] for r in readings), key=lambda c: c.total_ms)


def least_reading(backend: CostBackend, task: Task, shards: Sequence[Shard], readings: int) -> ComputeCost:
    """The least of `readings` readings of the operator holding `shards` (on the task's first device): from one
    build where the backend offers `compute_readings` (the fbgemm backend), else measured that many times over
    (measure_rounds); a lower bound's probe. Each path checks `readings` itself."""
    read = getattr(backend, "compute_readings", None)
    if read is not None:
        return min(read(task, list(shards), readings), key=lambda c: c.total_ms)
    probe = Plan(task.num_devices, tuple(replace(s, device=0) for s in shards))
    return measure_rounds(backend, task, [probe], readings, least_compute)[0]


@dataclass
class MeasureCount:
    """How many device operators measure_rounds measured, and how many it took from the round's other plans."""

    measured: int = 0
    reused: int = 0


def _device_key(shards: Sequence[Shard]) -> tuple:
    """One device's shard set, whichever device holds it (the backends' compute cost is a reference device's)."""
    return tuple(sorted(s.key(device=False) for s in shards))


def measure_rounds(backend: CostBackend, tasks: Task | Sequence[Task], plans: Sequence[Plan],
                   rounds: int | Sequence[int], reduce: Callable[[list[Reading]], R],
                   count: MeasureCount | None = None, on_plan: Callable[[], None] | None = None) -> list[R]:
    """Measure `plans` in turns, `rounds` times each, and reduce each plan's readings (median_cost, least_compute,
    or `list` to keep them all): the one measuring loop of evaluate, collect, single devices, the measured
    search and the bounds' probes.

    `tasks`: the plans' task, or one task per plan. `rounds`: one count for all, or one per plan (a plan with
    fewer sits out the later rounds). Turns (plan A, B, C, then B, C, A, ...) let a slow spell of the machine hit
    all plans alike. A plan given twice for one task is measured once. Within a round, a device shard set that
    several plans of one task hold is measured once and its compute used for each of them: the same fused
    operator, so the plans compare on the same reading of it; `count` tallies both. `on_plan` is called once per
    plan given, when its last reading is taken."""
    task_of = [tasks] * len(plans) if isinstance(tasks, Task) else list(tasks)
    if len(task_of) != len(plans):
        raise ValueError(f"measure_rounds: {len(task_of)} tasks for {len(plans)} plans")
    need = [rounds] * len(plans) if isinstance(rounds, int) else list(rounds)
    if len(need) != len(plans) or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in need):
        raise ValueError(f"rounds: expected an integer >= 1, or one per plan, got {rounds!r}")
    keys = [(id(t), p.key()) for t, p in zip(task_of, plans)]
    first: dict[tuple, int] = {}  # a plan given twice for one task: measured once, as often as either asks
    wanted: dict[tuple, int] = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
        wanted[k] = max(wanted.get(k, 0), need[i])
    distinct, copies = list(first), Counter(keys)
    readings: dict[tuple, list[Reading]] = {k: [] for k in distinct}
    count = count if count is not None else MeasureCount()
    operators: dict[int, dict[tuple, ComputeCost]] = {}  # per round: its device operators, measured once
    for r, j in turns(len(distinct), max(wanted.values(), default=1)):
        key = distinct[j]
        if r >= wanted[key]:
            continue
        task, plan = task_of[first[key]], plans[first[key]]
        this_round = operators.setdefault(r, {})
        compute = []
        for d in range(plan.num_devices):
            shards = plan.device_shards(d)
            device = (id(task), _device_key(shards))
            if not shards:  # no operator to run
                this_round.setdefault(device, ComputeCost(0.0, 0.0))
            elif device in this_round:
                count.reused += 1
            else:
                this_round[device] = backend.compute_cost(task, shards)
                count.measured += 1
            compute.append(this_round[device])
        assemble = partial(backend.plan_cost_from, task, plan)
        readings[key].append(Reading(tuple(compute), assemble(compute), assemble))
        if on_plan is not None and len(readings[key]) == wanted[key]:
            for _ in range(copies[key]):
                on_plan()
    return [reduce(readings[k][:n]) for k, n in zip(keys, need)]
