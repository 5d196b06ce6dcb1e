"""Measuring plans in interleaved rounds (measure_rounds), each device shard set once per round."""
from __future__ import annotations

import pytest

from dreamshard.hardware.base import MeasureCount, least_compute, measure_rounds, median_cost
from dreamshard.plan import Plan
from dreamshard.tasks import Device, Task
from helpers import BIG, SMALL, analytic


class Counting:
    """The analytic backend, counting the fused operators it costs."""

    def __init__(self) -> None:
        self.inner = analytic()
        self.name, self.measured, self.operators = self.inner.name, self.inner.measured, 0
        self.batch_size, self.topology = self.inner.batch_size, self.inner.topology

    def device_name(self):
        return self.inner.device_name()

    def compute_cost(self, task, shards):
        self.operators += 1
        return self.inner.compute_cost(task, shards)

    def plan_cost_from(self, task, plan, compute):
        return self.inner.plan_cost_from(task, plan, compute)


def test_a_device_shard_set_shared_by_plans_is_measured_once_per_round():
    task = Task("t", tuple(BIG + SMALL), (Device(2**34), Device(2**34), Device(2**34)))
    # a and b hold the same tables on device 0 only; c is a's twin (deduplicated as a plan)
    a = Plan.from_assignment(task, [0, 0, 1, 1, 2, 2, 2])
    b = Plan.from_assignment(task, [0, 0, 1, 2, 1, 2, 2])
    c = Plan.from_assignment(task, [0, 0, 1, 1, 2, 2, 2])
    backend, count = Counting(), MeasureCount()
    costs = measure_rounds(backend, task, [a, b, c], 3, median_cost, count=count)
    assert count.measured == backend.operators == 3 * (3 + 2)  # a: 3 devices; b: devices 1 and 2 new
    assert count.reused == 3 * 1
    exact = analytic()
    for plan, cost in zip([a, b, c], costs):  # the same numbers as costing each plan on its own
        assert cost.cost_ms == pytest.approx(exact.plan_cost(task, plan).cost_ms)
        assert [d.fwd_ms for d in cost.devices] == pytest.approx([d.fwd_ms for d in exact.plan_cost(task, plan).devices])


def test_shard_sets_that_differ_only_in_cache_or_replicas_are_measured_apart():
    from dataclasses import replace

    task = Task("t", tuple(BIG + SMALL), (Device(2**34), Device(2**34), Device(2**34)))
    a = Plan.from_assignment(task, [0, 0, 1, 1, 2, 2, 2])
    cached = Plan(3, (replace(a.shards[0], cache=0.5), *a.shards[1:]))  # device 0's first table UVM-cached
    backend, count = Counting(), MeasureCount()
    measure_rounds(backend, task, [a, cached], 1, median_cost, count=count)
    assert (count.measured, count.reused) == (4, 2)  # device 0 twice: a cached table is another operator


def test_bound_probes_are_measured_once_per_table_and_width_across_tasks():
    from dreamshard.evaluation.evaluate import ProbeCache, evaluate_task
    from dreamshard.sharders import make_sharder

    backend = Counting()
    probes = ProbeCache(backend)
    tables = tuple(BIG + SMALL)
    first = Task("first", tables, (Device(2**34), Device(2**34)))
    second = Task("second", tables[2:] + (BIG[0].with_dim(8),), (Device(2**34), Device(2**34)))  # other dim, same rows
    sharders = [make_sharder("size_greedy"), make_sharder("lookup_greedy")]
    for task in (first, second):
        cached = evaluate_task(backend, task, sharders, "either", column_splits=True, probes=probes)
        fresh = evaluate_task(analytic(), task, sharders, "either", column_splits=True)
        assert [r.bound for r in cached] == [r.bound for r in fresh]  # the same bound, from reused probes
        assert [r.cost.cost_ms for r in cached] == pytest.approx([r.cost.cost_ms for r in fresh])
    # the second task's tables were probed with the first (whole at their dim, and as 4-column slices): only
    # big0 at dim 8 is new; s0 has dim 4, so its 4-column slice is the table itself (one probe)
    assert probes.hits >= 2 * len(tables[2:]) and len(probes.costs) == 2 * len(tables)


class Spiky(Counting):
    """The analytic backend read high on all but every third reading, as a machine in a noisy spell."""

    def compute_cost(self, task, shards):
        from dataclasses import replace

        exact = super().compute_cost(task, shards)
        if self.operators % 3 == 0:
            return exact
        return replace(exact, fwd_ms=exact.fwd_ms * 1.3, bwd_ms=exact.bwd_ms * 1.3)


def test_bound_probes_keep_their_least_reading_so_a_noisy_spell_cannot_lift_the_bound():
    from dreamshard.evaluation.bounds import lower_bound
    from dreamshard.evaluation.evaluate import ProbeCache, exhaustive_optimum

    task = Task("t", tuple(BIG[:2] + SMALL[:3]), (Device(2**34), Device(2**34)))
    exact = lower_bound(analytic(), task, "either")
    spiky = Spiky()
    assert lower_bound(spiky, task, "either").total_ms > 1.1 * exact.total_ms  # one reading each
    probes = ProbeCache(Spiky(), rounds=3)
    assert lower_bound(probes, task, "either").total_ms == pytest.approx(exact.total_ms)
    assert probes.backend.operators == 3 * len(probes.costs) + 3  # the fused-all probe: 3 readings, not cached
    ex = exhaustive_optimum(Spiky(), task, "either", bound_rounds=3)
    assert ex.bound.total_ms == pytest.approx(exact.total_ms)
    with pytest.raises(ValueError, match="rounds: expected an integer >= 1"):
        ProbeCache(analytic(), rounds=0)


def test_measure_rounds_takes_a_task_per_plan_and_rounds_per_plan_in_turns():
    """Plans of several tasks (collect's chunks), and a count of readings per plan (the measured search):
    a plan with fewer readings sits out the later rounds; readings come in turns, and are reduced as asked."""
    t1 = Task("t1", tuple(BIG + SMALL), (Device(2**34), Device(2**34)))
    t2 = Task("t2", tuple(BIG[:2] + SMALL[:2]), (Device(2**34), Device(2**34)))
    p1 = Plan.from_assignment(t1, [0, 1, 0, 1, 0, 1, 0])
    p2 = Plan.from_assignment(t2, [0, 0, 1, 1])
    order = []

    class Ordered(Counting):
        def compute_cost(self, task, shards):
            order.append(task.name)
            return super().compute_cost(task, shards)

    readings = measure_rounds(Ordered(), [t1, t2], [p1, p2], [3, 1], list)
    assert [len(r) for r in readings] == [3, 1]
    assert order == ["t1", "t1", "t2", "t2", "t1", "t1", "t1", "t1"]  # round 0: p1, p2; then p1 alone
    assert readings[0][0].cost == analytic().plan_cost(t1, p1)
    assert median_cost(readings[0]) == readings[0][0].cost  # the analytic backend reads alike every time
    assert least_compute(readings[0]) == readings[0][0].compute[0]
    with pytest.raises(ValueError, match="2 tasks for 1 plans"):
        measure_rounds(analytic(), [t1, t2], [p1], 1, list)
    with pytest.raises(ValueError, match="rounds: expected an integer >= 1"):
        measure_rounds(analytic(), t1, [p1], 0, list)


def test_a_slow_spell_on_one_device_per_reading_leaves_the_median_cost_true():
    """Devices are timed one after another, so a slow spell of the machine lands on one device of a reading. Two of
    three readings have a spell, each on another device: the median whole-plan reading is slow, yet each device's
    median is true, and median_cost prices the plan from those (the forward wait and the all-to-all recomputed)."""
    task = Task("t", tuple(BIG + SMALL), (Device(2**34), Device(2**34), Device(2**34)))
    plan = Plan.from_assignment(task, [0, 0, 1, 1, 2, 2, 2])
    calls = []

    class Spells(Counting):
        def compute_cost(self, task, shards):
            calls.append(None)
            cost = super().compute_cost(task, shards)
            slow = len(calls) in (1, 5)  # the first reading's device 0, the second's device 1
            return type(cost)(cost.fwd_ms * 50, cost.bwd_ms * 50) if slow else cost

    readings = measure_rounds(Spells(), task, [plan], 3, list)[0]
    truth = analytic().plan_cost(task, plan)
    assert sorted(r.cost.cost_ms for r in readings)[1] > 1.5 * truth.cost_ms  # the median reading was hit
    assert median_cost(readings) == truth
