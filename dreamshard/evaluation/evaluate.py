"""Evaluating sharders: plan each task with each sharder, measure the plans, compare to bounds."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from dreamshard.errors import InfeasibleTaskError
from dreamshard.evaluation.bounds import ROW_PROBE_RATIO, LowerBound, column_splits_in, lower_bound, row_splits_of
from dreamshard.hardware.base import ComputeCost, CostBackend, PlanCost, least_reading, measure_rounds, median_cost
from dreamshard.hardware.comm import Topology
from dreamshard.placement import Rules
from dreamshard.plan import Plan, Shard, device_memory_bytes, validate_plan
from dreamshard.sharders import Sharder
from dreamshard.tasks import Task


@dataclass(frozen=True)
class PlannedTask:
    algorithm: str
    plan: Plan
    planning_ms: float
    # a learned sharder beyond its training range (sharders/fallback.py): which plan it kept, "learned" or
    # "analytic"; "learned (folded)" where the model folds all that lies beyond; "inside" within the range; "" for
    # sharders that check none
    fallback: str = ""


@dataclass(frozen=True)
class EvalResult:
    task: Task
    algorithm: str
    plan: Plan
    planning_ms: float
    cost: PlanCost
    bound: LowerBound
    fallback: str = ""


def fallback_of(sharder: Sharder) -> str:
    """What a learned sharder's last plan was (PlannedTask.fallback)."""
    if not hasattr(sharder, "last_decision"):
        return ""
    decision = sharder.last_decision
    if decision is None:
        return "inside"
    if decision.folded:
        return "learned (folded)"
    if not decision.analytic:
        return "learned (no fallback)"
    return "learned (no analytic plan)" if decision.no_plan else decision.kept


def plan_with(sharders: Sequence[Sharder], task: Task) -> list[PlannedTask]:
    """Each sharder's validated plan for `task`, with its planning time."""
    planned = []
    for sharder in sharders:
        start = time.perf_counter()
        plan = sharder.shard(task)
        elapsed = (time.perf_counter() - start) * 1e3
        validate_plan(task, plan)
        planned.append(PlannedTask(sharder.name, plan, elapsed, fallback_of(sharder)))
    return planned


class ProbeCache:
    """The backend's operator costs for the lower bounds' probes: each probe's least reading of `rounds`, and a
    single-shard probe measured once per evaluation.

    A bound is only as low as its probes' readings, and a reading is never below what the operator costs but
    can be well above it: a machine in a noisy spell can read every single table of a task high, and the bound
    then lies above the exhaustive optimum (docs/cost-backends.md). So each probe
    is read `rounds` times and its least reading kept (the least total; a bound's term wants the least), from
    one build of its operator where the backend can (the fbgemm backend's compute_readings).
    A bound probes every table of a task on its own (and its 4-column slice, and row pieces): one operator
    holding one shard, whose cost depends on the table's statistics and lookups, the shard's width and
    rows and the memory model, not on the task. Tasks of one evaluation draw their tables from one pool,
    so the same probe recurs across tasks; measured once, it is reused (`hits`). Operators of several
    shards (the fused-all probe) are measured each time. Only for bounds: plans are measured afresh in
    every round (measure_rounds), never from this cache."""

    def __init__(self, backend: CostBackend, rounds: int = 1) -> None:
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"rounds: expected an integer >= 1, got {rounds!r}")
        self.backend = backend
        self.rounds = rounds
        self.costs: dict[tuple, ComputeCost] = {}
        self.hits = 0

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def batch_size(self) -> int:
        return self.backend.batch_size

    @property
    def topology(self) -> Topology:
        return self.backend.topology

    def least(self, task: Task, shards: Sequence[Shard]) -> ComputeCost:
        """The least of `rounds` readings of the operator holding `shards` (hardware.base.least_reading)."""
        return least_reading(self.backend, task, shards, self.rounds)

    def compute_cost(self, task: Task, shards: Sequence[Shard]) -> ComputeCost:
        if len(shards) != 1:
            return self.least(task, shards)
        s = shards[0]
        t = next(t for t in task.tables if t.name == s.table)
        key = (t.name, t.rows, t.pooling_factor, t.bins, task.memory, s.width, *s.rows(t.rows))
        if key in self.costs:
            self.hits += 1
        else:
            self.costs[key] = self.least(task, shards)
        return self.costs[key]


def evaluate_task(backend: CostBackend, task: Task, sharders: Sequence[Sharder], regime: str, rounds: int = 1,
                  column_splits: bool = False, probes: ProbeCache | None = None,
                  row_probe_ratio: float = ROW_PROBE_RATIO,
                  planned: Sequence[PlannedTask] | None = None) -> list[EvalResult]:
    """Each sharder's plan of `task`, measured in `rounds` interleaved rounds, and the lower bound (its
    single-table probes from `probes` when given: reused across the tasks of an evaluation; `row_probe_ratio`:
    bounds.lower_bound's, for the tables the plans cut into row ranges). `planned`: the sharders' plans made
    beforehand (plan_with, e.g. in other processes), one per sharder in order; planned here when None."""
    if planned is None:
        planned = plan_with(sharders, task)
    elif [p.algorithm for p in planned] != [s.name for s in sharders]:
        raise ValueError(f"task {task.name!r}: plans of {[p.algorithm for p in planned]}, expected one of each of "
                         f"{[s.name for s in sharders]} in that order")
    else:
        for p in planned:
            validate_plan(task, p.plan)
    plans = [p.plan for p in planned]
    costs = measure_rounds(backend, task, plans, rounds, median_cost)
    # a bound that holds for every evaluated plan: the cuts the sharders may make, and those they made
    bound = lower_bound(probes if probes is not None else backend, task, regime,  # type: ignore[arg-type]
                        column_splits=column_splits or column_splits_in(task, plans),
                        row_splits=row_splits_of(task, plans) or None, row_probe_ratio=row_probe_ratio)
    return [EvalResult(task, p.algorithm, p.plan, p.planning_ms, c, bound, p.fallback) for p, c in zip(planned, costs)]


# ---------------------------------------------------------------- estimated bins


@dataclass(frozen=True)
class BinsComparison:
    """One sharder's plan of a task made with the tables' measured bins and with them removed (estimated)."""

    task: Task
    algorithm: str
    measured_bins: PlanCost  # cost of the plan made from the measured bins
    estimated_bins: PlanCost  # cost of the plan made with every table's bins estimated
    same_plan: bool


def estimated_bins_check(backend: CostBackend, tasks: Sequence[Task], sharders: Sequence[Sharder],
                         rounds: int) -> list[BinsComparison]:
    """What planning without access-count histograms costs: each sharder plans each task twice, once with
    the measured bins and once with every table's bins removed (its model's estimator fills them in,
    dreamshard.data.bins); a task's plans, every sharder's both, are measured on the real tables in `rounds`
    interleaved rounds (measure_rounds: a plan two sharders made is measured once)."""
    out = []
    for task in tasks:
        blind = replace(task, tables=tuple(replace(t, bins=None) for t in task.tables))
        pairs = []
        for sharder in sharders:
            with_bins, without = sharder.shard(task), sharder.shard(blind)
            validate_plan(task, with_bins)
            validate_plan(task, without)
            pairs.append((sharder.name, with_bins, without))
        costs = measure_rounds(backend, task, [plan for _, a, b in pairs for plan in (a, b)], rounds, median_cost)
        out += [BinsComparison(task, name, costs[2 * i], costs[2 * i + 1], a.key() == b.key())
                for i, (name, a, b) in enumerate(pairs)]
    return out


# ---------------------------------------------------------------- exhaustive check


def canonical_assignments(num_tables: int, num_devices: int) -> Iterable[tuple[int, ...]]:
    """Every split of tables onto identical devices, once (device labels in order of first use)."""
    def extend(prefix: tuple[int, ...], used: int):
        if len(prefix) == num_tables:
            yield prefix
            return
        for d in range(min(used + 1, num_devices)):
            yield from extend(prefix + (d,), max(used, d + 1))
    yield from extend((), 0)


@dataclass(frozen=True)
class ExhaustiveResult:
    task: Task
    optimum: PlanCost
    optimum_plan: Plan
    costs: dict[tuple[int, ...], float]  # canonical assignment -> plan cost, every feasible plan
    bound: LowerBound

    def cost_of(self, plan: Plan) -> float | None:
        """The enumerated cost of a whole-table plan of this task; None for a plan with column slices or row ranges."""
        dims = {t.name: t.dim for t in self.task.tables}
        if any((s.col_start, s.col_end) != (0, dims[s.table]) or s.is_row_range for s in plan.shards):
            return None
        devices = {s.table: s.device for s in plan.shards}
        return self.costs[canonical([devices[t.name] for t in self.task.tables])]


def canonical(assignment: Sequence[int]) -> tuple[int, ...]:
    """Relabel devices in order of first use: plans equal up to device names compare equal."""
    labels: dict[int, int] = {}
    return tuple(labels.setdefault(d, len(labels)) for d in assignment)


def exhaustive_optimum(backend: CostBackend, task: Task, regime: str, progress: Callable[[], None] | None = None,
                       bound_rounds: int = 1) -> ExhaustiveResult:
    """Measure every memory-feasible plan of a small task (each device subset measured once); its lower bound
    from probes read `bound_rounds` times, the least reading kept (ProbeCache)."""
    if len({d.memory_bytes for d in task.devices}) != 1:
        raise ValueError("exhaustive search assumes identical devices")
    subset_cost: dict[tuple[int, ...], ComputeCost] = {}
    best: tuple[PlanCost, Plan] | None = None
    costs: dict[tuple[int, ...], float] = {}
    rules = Rules.of_task(task)
    for assignment in canonical_assignments(len(task.tables), task.num_devices):
        plan = Plan.from_assignment(task, assignment)
        if not rules.holds(device_memory_bytes(task, plan)):
            continue
        compute = []
        for d in range(task.num_devices):
            subset = tuple(i for i, a in enumerate(assignment) if a == d)
            if subset not in subset_cost:
                subset_cost[subset] = backend.compute_cost(task, plan.device_shards(d))
                if progress:
                    progress()
            compute.append(subset_cost[subset])
        cost = backend.plan_cost_from(task, plan, compute)
        costs[assignment] = cost.cost_ms
        if best is None or cost.cost_ms < best[0].cost_ms:
            best = (cost, plan)
    if best is None:
        raise InfeasibleTaskError(f"task {task.name!r}: no plan fits in memory")
    bound = lower_bound(ProbeCache(backend, bound_rounds), task, regime)  # type: ignore[arg-type]
    return ExhaustiveResult(task, best[0], best[1], costs, bound)
