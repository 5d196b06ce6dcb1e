"""The heuristic sharders on hand-made tasks whose answers are known, and infeasible tasks."""
from __future__ import annotations

from dataclasses import replace

import pytest

from dreamshard.errors import InfeasibleTaskError
from dreamshard.memory import GB
from dreamshard.placement import (
    by_least_load,
    find_feasible_assignment,
    place_tables,
)
from dreamshard.plan import Plan, device_memory_bytes, validate_plan
from dreamshard.sharders import HEURISTICS, SHARDERS, make_sharder
from dreamshard.sharders.heuristics import GreedySharder, RandomSharder
from dreamshard.tables import Table
from dreamshard.tasks import Device, Task
from helpers import seeded


def assignment(plan: Plan, task: Task) -> list[int]:
    """Device of each table of the task, checking the plan places whole tables."""
    by_table = {}
    for s in plan.shards:
        assert s.table not in by_table, f"{s.table} split or placed twice"
        by_table[s.table] = s.device
        assert (s.col_start, s.col_end) == (0, next(t.dim for t in task.tables if t.name == s.table))
    return [by_table[t.name] for t in task.tables]


# Four tables on two 1 GB devices (fp32, exact_sgd: bytes = rows x dim x 4); memory is no constraint.
#          rows       dim  pooling | size (B)    dim   dim x pool   dim x pool x log10(rows)
#   t0  1,000,000      8     1.0   | 32,000,000    8        8         8 x 6 =  48
#   t1     10,000     64     2.0   |  2,560,000   64      128       128 x 4 = 512
#   t2        100     32    10.0   |     12,800   32      320       320 x 2 = 640
#   t3    100,000     16     5.0   |  6,400,000   16       80        80 x 5 = 400
#
# Greedy: tables by descending key; each onto the device with the smallest accumulated key.
#   size:        t0->d0 (32M) | t3->d1 (6.4M) | t1->d1 (8.96M < 32M) | t2->d1          = [0, 1, 1, 1]
#   dim:         t1->d0 (64)  | t2->d1 (32)   | t3->d1 (48 < 64)     | t0->d1 (56<64)  = [1, 0, 1, 1]
#   lookup:      t2->d0 (320) | t1->d1 (128)  | t3->d1 (208 < 320)   | t0->d1 (216)    = [1, 1, 0, 1]
#   size_lookup: t2->d0 (640) | t1->d1 (512)  | t3->d1 (512 < 640)   | t0->d0 (640 < 912) = [0, 1, 0, 1]
KNOWN = {
    "size_greedy": [0, 1, 1, 1],
    "dim_greedy": [1, 0, 1, 1],
    "lookup_greedy": [1, 1, 0, 1],
    "size_lookup_greedy": [0, 1, 0, 1],
}


@pytest.fixture
def four_tables() -> Task:
    tables = [
        Table("t0", 1_000_000, 8, 1.0),
        Table("t1", 10_000, 64, 2.0),
        Table("t2", 100, 32, 10.0),
        Table("t3", 100_000, 16, 5.0),
    ]
    return Task.uniform("hand", tables, 2, 1.0)


def test_registry_builds_every_heuristic_under_its_name(four_tables):
    import inspect

    from dreamshard.sharders import heuristics

    assert set(HEURISTICS) <= set(SHARDERS)
    keys_registered = set()
    for name in HEURISTICS:
        sharder = make_sharder(name)
        assert sharder.name == name, f"make_sharder({name!r}) built {sharder.name!r}"
        validate_plan(four_tables, sharder.shard(four_tables))
        if isinstance(sharder, GreedySharder):
            keys_registered.add(sharder.key)
    # every key the heuristics module defines is reachable by name
    defined = {f for n, f in inspect.getmembers(heuristics, inspect.isfunction) if n.endswith("_key")}
    assert defined and defined == keys_registered, defined ^ keys_registered
    with pytest.raises(ValueError, match="unknown sharder 'nope'; available: random, size_greedy"):
        make_sharder("nope")


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_greedy_heuristics_give_the_hand_computed_assignment(four_tables, name):
    plan = make_sharder(name).shard(four_tables)
    validate_plan(four_tables, plan)
    assert plan.num_devices == 2
    assert assignment(plan, four_tables) == KNOWN[name]


def test_the_four_keys_give_four_different_plans(four_tables):
    plans = {name: tuple(assignment(make_sharder(name).shard(four_tables), four_tables)) for name in KNOWN}
    assert len(set(plans.values())) == 4, plans


def test_greedy_ties_on_key_go_to_less_memory_then_lower_index():
    # dim_greedy with equal dims: order is the task's order, and every load ties at each step
    def placed(rows):
        tables = [Table(f"t{i}", r, 16, 1.0) for i, r in enumerate(rows)]
        task = Task.uniform("ties", tables, 2, 1.0)
        return assignment(make_sharder("dim_greedy").shard(task), task)

    # t0->d0, t1->d1, then loads tie (16, 16): t2 goes where less memory is used
    assert placed([1000, 100, 5]) == [0, 1, 1]
    assert placed([100, 1000, 5]) == [0, 1, 0]
    # memory ties too: the lower index
    assert placed([100, 100, 100]) == [0, 1, 0]
    assert placed([100, 100, 100, 100]) == [0, 1, 0, 1]


def test_greedy_skips_a_device_without_room():
    # two devices of 1,000,000 bytes; dim_greedy order t0 (64), t2 (8), t1 (4)
    tables = [
        Table("t0", 100, 64, 1.0),  # 25,600 B
        Table("t1", 50_000, 4, 1.0),  # 800,000 B
        Table("t2", 9_375, 8, 1.0),  # 300,000 B
    ]
    task = Task("room", tuple(tables), (Device(1_000_000), Device(1_000_000)))
    plan = make_sharder("dim_greedy").shard(task)
    # t1's least-loaded device d1 (load 8 < 64) has only 700,000 B left: it goes to d0
    assert assignment(plan, task) == [0, 0, 1]
    validate_plan(task, plan)


def test_greedy_sharders_are_deterministic(four_tables):
    for name in KNOWN:
        assert make_sharder(name).shard(four_tables) == make_sharder(name).shard(four_tables)


# ---------------------------------------------------------------- random


def tight_task(name: str = "tight") -> Task:
    # 8 tables of (i + 1) x 400,000 B = 14.4 MB in all, on 3 devices of 5 MB: little slack
    tables = [Table(f"t{i}", 1000 * (i + 1), 100, 1.0) for i in range(8)]  # (i+1) x 400,000 B
    return Task(name, tuple(tables), tuple(Device(5_000_000) for _ in range(3)))


def test_random_is_seeded_deterministic_and_respects_memory():
    task = tight_task()
    plans = {}
    for seed in range(10):
        p = make_sharder("random", seed=seed).shard(task)
        assert p == RandomSharder(seed).shard(task), "same seed, same task: same plan"
        validate_plan(task, p)
        assert max(device_memory_bytes(task, p)) <= 5_000_000
        plans[seed] = tuple(assignment(p, task))
    assert len(set(plans.values())) > 1, "ten seeds gave one plan: not random"


@pytest.mark.parametrize("name", sorted(HEURISTICS))
def test_every_sharder_respects_memory_on_a_tight_task(name):
    task = tight_task()
    plan = make_sharder(name, **seeded(name, 3)).shard(task)
    validate_plan(task, plan)
    assert all(used <= 5_000_000 for used in device_memory_bytes(task, plan))


def test_random_spreads_tables_over_devices():
    tables = [Table(f"t{i}", 100, 4, 1.0) for i in range(60)]
    task = Task.uniform("many", tables, 4, 1.0)
    counts = [0] * 4
    for d in assignment(make_sharder("random", seed=1).shard(task), task):
        counts[d] += 1
    assert all(5 <= c <= 25 for c in counts), counts


# ---------------------------------------------------------------- infeasible tasks


@pytest.mark.parametrize("name", sorted(HEURISTICS))
def test_a_table_bigger_than_any_device_is_planned_in_column_slices(name):
    # "huge": 1M rows x 128 dims x 4 B = 0.477 GB > 0.25 GB per device: two column slices of 64 (0.238 GB)
    tables = [Table("small", 100, 8, 1.0), Table("huge", 1_000_000, 128, 1.0)]
    task = Task.uniform("big", tables, 2, 0.25)
    plan = make_sharder(name, **seeded(name, 0)).shard(task)
    validate_plan(task, plan)
    huge = sorted((s.col_start, s.col_end, s.device) for s in plan.shards if s.table == "huge")
    assert [(a, b) for a, b, _ in huge] == [(0, 64), (64, 128)] and {d for *_, d in huge} == {0, 1}
    assert [s.kind(1_000_000, 128) for s in plan.shards if s.table == "huge"] == ["column", "column"]


@pytest.mark.parametrize("name", sorted(HEURISTICS))
def test_a_table_too_big_even_in_column_slices_goes_row_wise_as_torchrec_runs_it(name):
    # "thin": 6M rows x 4 dims x 4 B = 0.089 GB on 3 devices of 0.04 GB: no column cut of 4 columns exists, so
    # TorchRec's row-wise layout: blocks of ceil(6M / 3) = 2M rows, block i on device i
    tables = [Table("small", 100, 8, 1.0), Table("thin", 6_000_000, 4, 2.0), Table("other", 1000, 16, 5.0)]
    task = Task.uniform("thin", tables, 3, 0.04)
    plan = make_sharder(name, **seeded(name, 0)).shard(task)
    validate_plan(task, plan)
    thin = sorted((s.rows(6_000_000), s.device) for s in plan.shards if s.table == "thin")
    assert thin == [((0, 2_000_000), 0), ((2_000_000, 4_000_000), 1), ((4_000_000, 6_000_000), 2)]
    # the same task allowed whole tables and columns only has no plan, and says why
    only = replace(task, sharding=("table", "column"))
    with pytest.raises(InfeasibleTaskError, match=r"table 'thin' .* fits on no device .* narrowest column slices"):
        make_sharder(name, **seeded(name, 0)).shard(only)


@pytest.mark.parametrize("name", sorted(HEURISTICS))
def test_tables_that_fit_one_by_one_but_not_together_are_cut_finer(name):
    # three tables of 0.3 GB on two devices of 0.46 GB: 0.9 GB fit in 0.92 GB, but no two whole tables share a
    # device; cutting one of them into column slices makes room
    rows = int(0.3 * GB) // (64 * 4)
    tables = [Table(f"t{i}", rows, 64, 1.0 + i) for i in range(3)]
    task = Task.uniform("finer", tables, 2, 0.46)
    plan = make_sharder(name, **seeded(name, 0)).shard(task)
    validate_plan(task, plan)
    assert any(s.kind(rows, 64) != "table" for s in plan.shards)


@pytest.mark.parametrize("name", sorted(HEURISTICS))
def test_a_row_wider_than_any_device_has_no_plan(name):
    # one row of 100,000 dims x 4 B = 400,000 B > 300,000 B per device, and columns may not be cut
    task = Task("wide", (Table("wide", 1, 100_000, 1.0),), (Device(300_000), Device(300_000)),
                sharding=("table", "row"))
    with pytest.raises(InfeasibleTaskError, match=r"table 'wide' .*: a single row .* 400000 bytes, more than any device"):
        make_sharder(name, **seeded(name, 0)).shard(task)


def test_the_piece_rule_fewest_column_slices_then_row_wise():
    from dreamshard.memory import MemoryModel
    from dreamshard.plan import row_blocks
    from dreamshard.sharders.pieces import Cut, column_widths, cut_oversized, first_cut

    t = Table("t", 1001, 16, 10.0)  # 64,064 B at fp32; 8 columns 32,032 B, 4 columns 16,016 B
    task = Task("p", (t,), (Device(34_000), Device(34_000), Device(34_000)))
    assert first_cut(t, task) == Cut(columns=2)  # two slices of 8 columns fit 34,000 B
    assert column_widths(16, 3) == [8, 4, 4]
    assert first_cut(t, Task("p", (t,), (Device(64_064),))) == Cut()  # fits: no cut
    # 3 slices are no better than 2 (the widest still has 8 columns): 30,000 B needs 4 of 4 columns
    assert first_cut(t, replace(task, devices=(Device(30_000),) * 3)) == Cut(columns=4)
    # with row-wise adagrad each slice also keeps 4 B per row: 8 columns take 36,036 B, so 4 slices of 4
    ada = Task("p", (t,), task.devices, MemoryModel("fp32", "exact_row_wise_adagrad"))
    assert first_cut(t, ada) == Cut(columns=4)
    cut, pieces = cut_oversized(task)
    assert [x.dim for x in cut.tables] == [8, 8] and all(x.rows == 1001 for x in cut.tables)
    assert all(x.pooling_factor == 10.0 for x in cut.tables)  # every slice does all lookups
    assert sorted(pieces.values()) == [("t", 0, None, 0, 8), ("t", 0, None, 8, 16)]
    # rows only: TorchRec's row-wise layout, ceil(1001 / 3) = 334 rows per block, block i pinned to device i
    rows_only = replace(task, sharding=("table", "row"))
    assert first_cut(t, rows_only) == Cut(row_wise=True)
    assert row_blocks(1001, 3) == [(0, 334), (334, 668), (668, 1001)]
    assert row_blocks(5, 4) == [(0, 2), (2, 4), (4, 5)]  # TorchRec's [2, 2, 1, 0]: the empty block left out
    cut, pieces = cut_oversized(rows_only)
    assert [x.rows for x in cut.tables] == [334, 334, 333]
    assert sum(x.pooling_factor for x in cut.tables) == pytest.approx(10.0)  # lookups shared by rows
    assert cut.pins == (("t[rows 0:334]", 0), ("t[rows 334:668]", 1), ("t[rows 668:1001]", 2))


@pytest.mark.parametrize("name", sorted(HEURISTICS))
def test_total_size_above_total_capacity(name):
    # three tables of 0.4 GB each (fit one by one) on two 0.5 GB devices: 1.2 > 1.0 GB
    rows = int(0.4 * GB) // (128 * 4)
    tables = [Table(f"t{i}", rows, 128, 1.0) for i in range(3)]
    task = Task.uniform("total", tables, 2, 0.5)
    with pytest.raises(InfeasibleTaskError, match=r"tables need 1\.200 GB in total, the 2 devices hold 1\.000 GB"):
        make_sharder(name).shard(task)


@pytest.mark.parametrize("name", sorted(HEURISTICS))
def test_bin_packing_infeasible(name):
    # three tables of 0.6 of a device on two devices: 1.8 <= 2 in total, but no two share a device
    tables = [Table(f"t{i}", 600, 4, 1.0) for i in range(3)]  # 9,600 B each
    task = Task("pack", tuple(tables), (Device(16_000), Device(16_000)), sharding=("table",))
    with pytest.raises(InfeasibleTaskError, match=r"'pack': 3 tables of at least 9600 bytes each, but the devices "
                                                  r"hold at most 2 of them"):  # told before any search
        make_sharder(name).shard(task)
    with pytest.raises(InfeasibleTaskError):
        find_feasible_assignment(task)
    # allowed to cut rows, one table goes row-wise (300 rows on each device) and the rest fit
    rows = replace(task, sharding=("table", "row"))
    plan = make_sharder(name).shard(rows)
    validate_plan(rows, plan)
    assert sorted(s.kind(600, 4) for s in plan.shards) == ["row", "row", "table", "table"]


def test_placement_backs_up_where_the_first_choice_gets_stuck():
    # Two devices of 10,000 B; tables of 6,000 (a, b) and 4,000 B (c, d): the only packings are
    # {a, c | b, d} and {a, d | b, c}. lookup_greedy's keys (dim 4 x pooling) are a 100 > c 50 > d 40 > b 1:
    #   a->d0 (100), c->d1 (50), d->d1 (50 < 100, 8,000 B), then b fits nowhere: plain greedy is stuck.
    # The search backs up: d->d0 (10,000 B, load 140), b->d1 (10,000 B)  =>  [0, 1, 1, 0]
    sizes = {"a": 6000, "b": 6000, "c": 4000, "d": 4000}
    pooling = {"a": 25.0, "b": 0.25, "c": 12.5, "d": 10.0}
    tables = [Table(n, s // 16, 4, pooling[n]) for n, s in sizes.items()]
    task = Task("pack2", tuple(tables), (Device(10_000), Device(10_000)))
    assert [task.table_bytes(i) for i in range(4)] == [6000, 6000, 4000, 4000]
    assert assignment(make_sharder("lookup_greedy").shard(task), task) == [0, 1, 1, 0]
    for name in HEURISTICS:
        p = make_sharder(name).shard(task)
        validate_plan(task, p)
        a = assignment(p, task)
        assert a[0] != a[1] and a[2] != a[3]


def test_place_tables_step_limit():
    # on two devices of 10,000 B: the 4992 B table shares with at most one other, the rest exceed the other
    # device; 19,824 B in total and no size class over its room, so only the search finds it out
    sizes = [2800, 3008, 3008, 3008, 3008, 4992]
    tables = [Table(f"t{i}", s // 16, 4, 1.0) for i, s in enumerate(sizes)]
    task = Task("steps", tuple(tables), (Device(10_000), Device(10_000)))
    with pytest.raises(InfeasibleTaskError, match=r"no placement within memory found in 3 steps"):
        place_tables(task, [0, 1, 2, 3, 4, 5], by_least_load, max_steps=3)
    with pytest.raises(InfeasibleTaskError, match=r"no placement of all 6 tables"):
        place_tables(task, [0, 1, 2, 3, 4, 5], by_least_load)
    with pytest.raises(ValueError, match="order must list every table"):
        place_tables(task, [0, 1, 2, 3], by_least_load)


def test_place_tables_starts_again_largest_first_when_its_order_strands_the_large_tables():
    # two devices of 16,000 B; thirty 160 B tables, then tables of 15,200 and 12,000 B: 32,000 B in all, so the
    # larger table shares its device with at most 5 small ones. Least-load puts 15 small tables on each device
    # first, and backing out of that takes about a million placements in that order
    sizes = [160] * 30 + [15_200, 12_000]
    tables = [Table(f"t{i}", s // 16, 4, 1.0) for i, s in enumerate(sizes)]
    task = Task("stranded", tuple(tables), (Device(16_000), Device(16_000)))
    order = list(range(32))  # the small tables first
    with pytest.raises(InfeasibleTaskError, match=r"no placement within memory found in 50000 steps"):
        place_tables(task, order, by_least_load, weights=sizes, max_steps=50_000, patience=50_000)
    calls = []

    def counted(t, state):
        calls.append(t)
        return by_least_load(t, state)

    a = place_tables(task, order, counted, weights=sizes, max_steps=50_000, patience=1_000)
    validate_plan(task, Plan.from_assignment(task, a))
    assert a[30] != a[31] and sum(d == a[30] for d in a[:30]) == 5
    assert len(calls) <= 1_001 + 32  # the restart placed each table once: no backing up


def test_packing_bound_refuses_before_searching():
    # three tables of 6000 B on two devices of 10,000 B: at most one each, told at once
    tables = [Table(f"t{i}", 375, 4, 1.0) for i in range(3)] + [Table("small", 10, 4, 1.0)]
    task = Task("bound", tuple(tables), (Device(10_000), Device(10_000)))
    with pytest.raises(InfeasibleTaskError, match=r"3 tables of at least 6000 bytes each, but the devices hold at "
                                                  r"most 2 of them"):
        place_tables(task, [0, 1, 2, 3], by_least_load, max_steps=1)


def test_options_are_typed_and_checked():
    with pytest.raises(ValueError, match=r"sharder 'dim_greedy': unknown option\(s\) seed; it takes no options"):
        make_sharder("dim_greedy", seed=1)
    with pytest.raises(ValueError, match=r"sharder 'random': unknown option\(s\) sample; it takes seed"):
        make_sharder("random", sample=4)  # a typo is an error, not ignored
    with pytest.raises(ValueError, match="sharder 'dreamshard' needs a trained model"):
        make_sharder("dreamshard")
    with pytest.raises(TypeError, match=r"model must be a LearnedModel \(load_model\('dreamshard', path\)\), got str"):
        make_sharder("dreamshard", model="models/dreamshard.pt")
    assert {n for n, s in SHARDERS.items() if s.splits_tables} == {"dreamshard_cut", "neuroshard", "torchrec_full",
                                                                   "torchrec_full_min", "torchrec_model",
                                                                   "torchrec_calibrated"}
    assert {n for n, s in SHARDERS.items() if s.needs_model} == {"dreamshard", "dreamshard_cut", "autoshard", "rnn", "neuroshard",
                                                                  "neuroshard_tw"}


def test_a_sharder_loads_only_its_own_kind_of_checkpoint(tmp_path):
    from dreamshard.sharders import SHARDERS, load_model

    # torchrec_model searches too, but loads nothing: it shares no kind with NeuroShard's checkpoints
    assert SHARDERS["torchrec_model"].kind != SHARDERS["neuroshard"].kind
    with pytest.raises(ValueError, match="uses no trained model"):
        load_model("torchrec_model", tmp_path / "neuroshard.pt")
