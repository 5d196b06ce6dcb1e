"""One placement engine (issue 54): the rules of placement (each device's capacity, pins, avoid lists, groups) are
written once, in dreamshard/placement.py (`Rules`, `Room`, `Rooms`, `place_tables`, `place_items`), and every
sharder places tables and pieces through it.

The rule is checked on the source: no module of dreamshard/sharders reads a task's capacities or constraints
(the names in RULE_NAMES) outside the functions listed in EXCEPTIONS, each with why it is not a placement; an
exception no longer needed fails too, so the list stays exact. A new copy of the rules fails here: ask
`Rules` (`with_room`, `may_use`, `movable`, `Room`, `Rooms`) instead."""
from __future__ import annotations

import ast
import random

import numpy as np
import pytest

from dreamshard.errors import InfeasibleTaskError
from dreamshard.memory import MemoryModel
from dreamshard.placement import Room, Rooms, Rules, by_least_load, place_items, place_tables
from dreamshard.sharders.pieces import Cut, cut_task, table_pieces
from dreamshard.tables import Table
from dreamshard.tasks import Device, Task
from helpers import PROJECT_ROOT

SHARDERS_DIR = PROJECT_ROOT / "dreamshard" / "sharders"
# a task's capacities and placement constraints, as Task names them
RULE_NAMES = frozenset({"capacities", "capacity", "pinned_device", "avoided", "group_of", "allowed_devices", "pins",
                        "avoid", "groups"})

# (module, function) -> (the names it reads, why that is not a placement of its own)
EXCEPTIONS: dict[tuple[str, str], tuple[frozenset[str], str]] = {
    ("cuts", "cut_options"): (frozenset({"allowed_devices", "avoided"}),
                              "which cuts a table may take: no more slices than devices it may use, row-wise only "
                              "where it avoids none (every device holds a block)"),
    ("pieces", "_capacity"): (frozenset({"allowed_devices", "capacity"}),
                              "the first cut: the largest device a table may use, which its pieces must fit"),
    ("pieces", "first_cuts"): (frozenset({"capacities", "pinned_device", "avoided"}),
                               "the first cut of every table (the same rule, in one pass over the devices)"),
    ("pieces", "fits_row_wise"): (frozenset({"avoided", "capacity"}),
                                  "may a table be cut row-wise: block i must fit device i"),
    ("pieces", "_with_pieces"): (frozenset({"capacities"}),
                                 "refuses a task whose tables need more bytes than all devices hold (no cut helps)"),
    ("replicas", "data_parallel_tables"): (frozenset({"avoided", "capacities"}),
                                           "which tables are copied to every device, before any placement"),
    ("replicas", "with_replicas"): (frozenset({"capacities"}),
                                    "the copies on every device against the smallest, before any placement"),
    ("rnn", "RnnSharder._shard"): (frozenset({"capacity"}),
                                   "the RNN policy's input feature (bytes used over capacity); place_tables places"),
    ("torchrec_planner", "TorchRecSharder.torchrec_plan"): (frozenset({"pins", "avoid", "groups"}),
                                                           "refuses constraints TorchRec's planner cannot honour"),
    ("replan", "PiecesTask.__init__"): (frozenset({"allowed_devices", "avoided", "group_of", "groups",
                                                   "pinned_device", "pins"}),
                                        "which shards of the previous plan stay, as pins of the task the sharder "
                                        "then places (`self.pins`: its own record of them)"),
    ("replan", "_ReplanSearch.target"): (frozenset({"allowed_devices", "group_of", "pins"}),
                                         "the device a kept shard is re-pinned to, handed to the sharder"),
    ("replan", "replan"): (frozenset({"pins"}), "PiecesTask's pins (kept shards), not the task's"),
    ("replan", "replan.single_moves"): (frozenset({"pins"}), "PiecesTask's pins (kept shards), not the task's"),
}


class _Reads(ast.NodeVisitor):
    """The names of RULE_NAMES one module reads as attributes, by enclosing function (methods as Class.method)."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.found: dict[str, set[str]] = {}

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in RULE_NAMES:
            self.found.setdefault(".".join(self.stack), set()).add(node.attr)
        self.generic_visit(node)


def reads_of(source: str) -> dict[str, set[str]]:
    reads = _Reads()
    reads.visit(ast.parse(source))
    return reads.found


def rule_reads() -> dict[tuple[str, str], set[str]]:
    """(module, enclosing function) -> the names of RULE_NAMES it reads as attributes, over dreamshard/sharders."""
    return {(path.stem, where): names for path in sorted(SHARDERS_DIR.glob("*.py"))
            for where, names in reads_of(path.read_text()).items()}


def test_no_sharder_keeps_placement_rules_of_its_own():
    found = rule_reads()
    unexplained = {where: sorted(names - EXCEPTIONS.get(where, (frozenset(), ""))[0])
                   for where, names in found.items()}
    unexplained = {where: names for where, names in unexplained.items() if names}
    assert not unexplained, (
        "placement rules read outside dreamshard/placement.py (ask Rules/Room/Rooms instead, or list the reader in "
        f"EXCEPTIONS with why it places nothing): {unexplained}")
    stale = {where: sorted(names - found.get(where, set())) for where, (names, _) in EXCEPTIONS.items()}
    stale = {where: names for where, names in stale.items() if names}
    assert not stale, f"EXCEPTIONS lists reads that are gone; remove them: {stale}"


def test_the_scan_sees_a_copy_of_the_rules():
    # a capacity check and a group lookup written in a method, as the copies were
    source = ("class S:\n    def f(self, task, used, d, size):\n        g = task.group_of()\n"
              "        return used[d] + size <= task.capacities()[d]\n")
    assert reads_of(source) == {"S.f": {"capacities", "group_of"}}


def constrained_task(seed: int) -> Task:
    rng = random.Random(seed)
    n, devices = rng.randint(4, 12), rng.randint(2, 5)
    tables = tuple(Table(f"t{i}", rng.choice([100, 5_000, 60_000]), 4 * rng.randint(1, 16), rng.choice([1.0, 8.0]))
                   for i in range(n))
    sizes = [MemoryModel().shard_bytes(t.rows, t.dim) for t in tables]
    per = sum(sizes) / rng.choice([0.5, 0.8, 0.95]) / devices
    names = [t.name for t in tables]
    rng.shuffle(names)
    return Task(f"c{seed}", tables, tuple(Device(int(per * rng.uniform(0.8, 1.2))) for _ in range(devices)),
                pins=((names[0], rng.randrange(devices)),), avoid=((names[1], (rng.randrange(devices),)),),
                groups=((names[2], names[3]),))


@pytest.mark.parametrize("seed", range(6))
def test_rules_of_pieces_are_those_of_the_cut_task(seed):
    """`Rules.of_pieces`, for searches that cannot build a Task per layout, carries constraints over as
    `Task.derived` (cut_task) does."""
    task = constrained_task(seed)
    free = [t for t in task.tables if t.name not in task.never_cut() and t.dim >= 8]
    cuts = {t.name: Cut(columns=2) if i % 2 else Cut(row_wise=True) for i, t in enumerate(free[:2])}
    cut, _ = cut_task(task, cuts)
    owner, sizes, fixed = [], [], []
    for i, t in enumerate(task.tables):
        for piece, _, device in table_pieces(t, cuts.get(t.name, Cut()), task.num_devices):
            owner.append(i)
            sizes.append(task.shard_bytes(piece))
            fixed.append(device)
    want, got = Rules.of_task(cut), Rules.of_task(task).of_pieces(owner, sizes, fixed)
    assert got.pins == want.pins and got.banned == want.banned
    assert list(got.sizes) == list(want.sizes) and list(got.capacity) == list(want.capacity)
    assert got.group == want.group


@pytest.mark.parametrize("seed", range(12))
def test_place_items_is_place_tables_first_pass(seed):
    """Without backing up, the engine's pass is place_tables' first: the same plan where it meets no dead end,
    None where it does (place_tables then backs up)."""
    task = constrained_task(seed)
    rng = np.random.default_rng(seed)
    weights = rng.random(len(task.tables))
    order = np.argsort(-weights, kind="stable").tolist()
    rules = Rules.of_task(task)
    direct = place_items(rules, rules.pinned_first(order), by_least_load, weights, task.speeds())
    try:
        full = place_tables(task, order, by_least_load, weights=weights)
    except InfeasibleTaskError:
        assert direct is None
        return
    if direct is not None:
        assert direct == full


def test_rooms_open_where_one_room_ranks():
    """The batched room (NeuroShard's scales) opens the devices one Room ranks with room, group included."""
    task = constrained_task(3)
    rules = Rules.of_task(task)
    rooms, room = Rooms(rules, 1), Room(rules, np.zeros(len(task.tables)), task.speeds())
    for i in rules.pinned_first(range(len(task.tables))):
        ranking = room.ranking(i, lambda t, s: list(range(task.num_devices)))
        with_room = [d for d in ranking if room.state.free_bytes[d] >= rules.sizes[i]]
        assert np.flatnonzero(rooms.open(i)[0]).tolist() == with_room
        if not with_room:
            return
        room.place(i, with_room[0])
        rooms.place(i, np.array([with_room[0]]))
