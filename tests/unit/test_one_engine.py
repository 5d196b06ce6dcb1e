"""One placement engine (issue 54): the rules of placement (each device's capacity, pins, avoid lists, groups) are
written once, in dreamshard/placement.py (`Rules`, `Room`, `Rooms`, `place_tables`, `place_items`), and every
placement, every search that moves tables or pieces and every rollout places through it.

The rule is checked on the source: no module of dreamshard/ but tasks.py (which defines them) and placement.py
reads a task's capacities or constraints (the names in RULE_NAMES) outside the functions listed in EXCEPTIONS, each
with why it is not a placement (a validity check, a report, a parser); reads of the engine's own `Rules` (a value
named `rules`) are its use, not a copy. An exception no longer needed fails too, so the list stays exact. A new
copy of the rules fails here: ask `Rules` (`with_room`, `may_use`, `movable`, `fits`, `holds`, `mask`) instead."""
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

LIBRARY = PROJECT_ROOT / "dreamshard"
OWNERS = ("tasks", "placement")  # the modules that define the rules: not scanned
# a task's capacities and placement constraints, as Task names them
RULE_NAMES = frozenset({"capacities", "capacity", "pinned_device", "avoided", "group_of", "allowed_devices", "pins",
                        "avoid", "groups"})

# (module, function) -> (the names it reads, why that is not a placement of its own)
EXCEPTIONS: dict[tuple[str, str], tuple[frozenset[str], str]] = {
    ("sharders.cuts", "cut_options"): (frozenset({"allowed_devices", "avoided"}),
                                       "which cuts a table may take: no more slices than devices it may use, "
                                       "row-wise only where it avoids none (every device holds a block)"),
    ("sharders.pieces", "_capacity"): (frozenset({"allowed_devices", "capacity"}),
                                       "the first cut: the largest device a table may use, which its pieces must fit"),
    ("sharders.pieces", "first_cuts"): (frozenset({"capacities", "pinned_device", "avoided"}),
                                        "the first cut of every table (the same rule, in one pass over the devices)"),
    ("sharders.pieces", "fits_row_wise"): (frozenset({"avoided"}),
                                           "may a table be cut row-wise: it avoids no device (each holds a block)"),
    ("sharders.pieces", "host_cuts"): (frozenset({"avoided"}),
                                       "may a table be cut row-wise over one host: no block on a device it avoids "
                                       "(fits_row_wise's rule, per host)"),
    ("sharders.pieces", "_blocks_fit"): (frozenset({"capacity"}),
                                         "does each row block fit its device (fits_row_wise, host_cuts)"),
    ("sharders.torchrec_model", "_placeable"): (frozenset({"capacities"}),
                                                "which cuts a start or the floor may use: no piece beyond the largest "
                                                "device (`_place` places)"),
    ("sharders.torchrec_model", "TorchRecModelSharder.bound_ms"): (frozenset({"capacities"}),
                                                                   "a floor under any plan's rating, placing nothing"),
    ("sharders.pieces", "_with_pieces"): (frozenset({"capacities"}),
                                          "refuses a task whose tables need more bytes than all devices hold (no cut "
                                          "helps)"),
    ("sharders.replicas", "data_parallel_tables"): (frozenset({"avoided", "capacities"}),
                                                    "which tables are copied to every device, before any placement"),
    ("sharders.replicas", "with_replicas"): (frozenset({"capacities"}),
                                             "the copies on every device against the smallest, before any placement"),
    ("sharders.rnn", "RnnSharder._shard"): (frozenset({"capacity"}),
                                            "the RNN policy's input feature (bytes used over capacity); place_tables "
                                            "places"),
    ("sharders.torchrec_planner", "TorchRecSharder.torchrec_plan"): (frozenset({"pins", "avoid", "groups"}),
                                                                     "refuses constraints TorchRec's planner cannot "
                                                                     "honour"),
    ("sharders.replan", "PiecesTask.__init__"): (frozenset({"allowed_devices", "avoided", "group_of", "groups",
                                                            "pinned_device", "pins"}),
                                                 "which shards of the previous plan stay, as pins of the task the "
                                                 "sharder then places (`self.pins`: its own record of them)"),
    ("sharders.replan", "_ReplanSearch.target"): (frozenset({"allowed_devices", "group_of", "pins"}),
                                                  "the device a kept shard is re-pinned to, handed to the sharder"),
    ("sharders.replan", "replan"): (frozenset({"pins"}), "PiecesTask's pins (kept shards), not the task's"),
    ("sharders.replan", "replan.single_moves"): (frozenset({"pins"}), "PiecesTask's pins (kept shards), not the task's"),
    ("learning.mdp", "rollout"): (frozenset({"capacity"}),
                                  "training episodes in a batch: Rules.with_room as tensors (mdp.rules_tensors); "
                                  "decoding a plan places through place_tables"),
    ("learning.rnn", "rollout"): (frozenset({"capacity"}), "the same, for the RNN baseline's episodes"),
    # outside the sharders: validity, reports, parsers and TorchRec's view, none of them a placement
    ("plan", "validate_plan"): (frozenset({"avoid", "capacity", "groups", "pins"}), "the one definition of validity"),
    ("plan", "_check_replicas"): (frozenset({"avoided", "group_of", "pinned_device"}), "validity of replicas"),
    ("plan", "device_memory_breakdown"): (frozenset({"capacity"}), "a report: each device's bytes and capacity"),
    ("memory", "MemoryBreakdown.headroom"): (frozenset({"capacity"}), "a report's field"),
    ("caching", "choose_caching"): (frozenset({"avoided", "capacities"}),
                                    "which tables are UVM-cached, before any placement (their bytes against all "
                                    "devices')"),
    ("cli.plan", "cmd_plan"): (frozenset({"capacity"}), "the plan command's per-device report"),
    ("data.cluster", "Constraints.__bool__"): (frozenset({"avoid", "groups"}), "the constraints file's record"),
    ("data.cluster", "Constraints.merged"): (frozenset({"avoid", "groups"}), "the constraints file's record"),
    ("data.cluster", "Constraints.apply"): (frozenset({"avoid", "groups"}), "the constraints file onto a task"),
    ("data.cluster", "Constraints.to_json"): (frozenset({"avoid", "groups"}), "the constraints file's record"),
    ("data.cluster", "constraints_of"): (frozenset({"avoid", "groups", "pins"}), "a task's constraints as a file"),
    ("evaluation.journal", "task_fingerprint"): (frozenset({"avoid", "groups", "pins"}), "a task's identity"),
    ("evaluation.plan_report", "build_report"): (frozenset({"capacity"}), "a plan's report"),
    ("interop.torchrec", "_topology"): (frozenset({"capacities"}), "TorchRec's topology: each rank's HBM"),
    ("planner", "DreamShardPlanner._error_type"): (frozenset({"capacities"}),
                                                   "TorchRec's error type of a failure (storage or constraints)"),
    ("planner", "DreamShardPlanner._check_torchrec_storage"): (frozenset({"capacity"}),
                                                               "TorchRec's own storage count of the plan, checked"),
    ("planner", "DreamShardPlanner._print_summary"): (frozenset({"capacity"}), "the planner's summary"),
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
        value = node.value
        of_rules = (isinstance(value, ast.Name) and value.id == "rules") or \
            (isinstance(value, ast.Attribute) and value.attr == "rules")
        if node.attr in RULE_NAMES and not of_rules:
            self.found.setdefault(".".join(self.stack), set()).add(node.attr)
        self.generic_visit(node)


def reads_of(source: str) -> dict[str, set[str]]:
    reads = _Reads()
    reads.visit(ast.parse(source))
    return reads.found


def rule_reads() -> dict[tuple[str, str], set[str]]:
    """(module, enclosing function) -> the names of RULE_NAMES it reads as attributes, over dreamshard/ but OWNERS
    (module: its dotted path below dreamshard)."""
    out = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        module = ".".join(path.relative_to(LIBRARY).with_suffix("").parts)
        if module not in OWNERS:
            out.update(((module, where), names) for where, names in reads_of(path.read_text()).items())
    return out


def test_no_module_keeps_placement_rules_of_its_own():
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
    # the engine's own rules, asked, are no copy
    assert reads_of("def f(rules, self):\n    return rules.capacity, self.rules.pins\n") == {}


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


def test_perturbations_and_rollout_masks_keep_the_rules():
    """Outside the sharders too: collect's perturbed plans and the learned policies' training masks ask the engine,
    so a pinned, avoiding or grouped table stays valid (validate_plan) and is masked as the rules say."""
    from dreamshard.evaluation.collect import perturb
    from dreamshard.learning.mdp import rules_tensors
    from dreamshard.plan import validate_plan
    from dreamshard.sharders import make_sharder

    checked = 0
    for seed in range(40):
        task = constrained_task(seed)
        try:
            plan = make_sharder("size_greedy").shard(task)
        except InfeasibleTaskError:
            continue
        if len(plan.shards) != len(task.tables):  # perturb moves whole tables, as collect's heuristic plans hold
            continue
        rng = np.random.default_rng(seed)
        for _ in range(10):
            validate_plan(task, perturb(task, plan, rng, 3))
        rules = Rules.of_task(task)
        sizes, _, allowed = rules_tensors(rules)
        assert sizes.tolist() == [float(task.table_bytes(i)) for i in range(len(task.tables))]
        for i, t in enumerate(task.tables):
            assert allowed[i].nonzero().flatten().tolist() == task.allowed_devices(t.name)
        checked += 1
    assert checked >= 10
