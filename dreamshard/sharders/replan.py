"""Re-planning that moves little: a new plan for a changed task that keeps the previous plan's shards in place
unless moving them is worth it, moving at most a given number of bytes of existing shards.

`moved_bytes` counts exactly the bytes of existing shards that leave their device; `replan` pins the previous
shards as pieces, then releases those the full re-plan moves, in nested sets and single moves, while they fit
the limit and lower the cost by `min_gain`. Sharders must honour pins (TorchRec's planner cannot). The
algorithm and its benchmark: docs/replan.md.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from dreamshard.errors import DataFormatError, DreamShardError, InfeasibleTaskError, InvalidPlanError
from dreamshard.hardware.base import CostEstimator
from dreamshard.memory import GB
from dreamshard.plan import Plan, Shard, check_shard_block, validate_plan
from dreamshard.sharders import SHARDERS, Sharder
from dreamshard.sharders.pieces import PieceOf, merge_pieces
from dreamshard.tables import Table
from dreamshard.tasks import Task

Shapes = Mapping[str, Sequence[int]]  # table name -> (rows, dim) of the previous task's tables


@dataclass(frozen=True)
class ReplanResult:
    plan: Plan  # the plan to use: moves at most the limit
    full_plan: Plan  # the sharder's plan of the task with no limit
    moved_bytes: int
    full_moved_bytes: int
    cost_ms: float
    full_cost_ms: float
    kept_cost_ms: float  # the plan that keeps every existing shard in place (or moves only what it must)
    kept_moved_bytes: int  # what that plan had to move (constraints, memory): 0 unless forced
    max_moved_bytes: int
    candidates: int  # pinned units the full plan moves
    tried: int  # moves tried on top of those accepted
    accepted: int
    evaluations: int  # sharder runs on pieces tasks (each plan's cost evaluated once)
    source: str  # "full" | "kept" | "search": where the returned plan came from


def check_device_count(task: Task, previous: Plan) -> None:
    if previous.num_devices > task.num_devices:
        raise DreamShardError(f"the previous plan is for {previous.num_devices} devices, but the task has "
                              f"{task.num_devices}: re-planning may add devices, not remove them")


def surviving_shards(task: Task, previous: Plan, previous_shapes: Shapes | None = None) -> dict[str, list[Shard]]:
    """Table name -> its shards in `previous`, for the tables that survive: still in the task with the same rows
    and dim. With `previous_shapes` (the previous task's (rows, dim) per table) that is exact; without, a table
    survives when its previous shards tile its current rows x dim (a shard of all rows cannot tell rows apart)."""
    check_device_count(task, previous)
    tables = {t.name: t for t in task.tables}
    by_table: dict[str, list[Shard]] = defaultdict(list)
    for s in previous.shards:
        if s.table in tables:
            by_table[s.table].append(s)
    out = {}
    for name, shards in by_table.items():
        t = tables[name]
        if previous_shapes is not None:
            shape = previous_shapes.get(name)
            if shape is None or (int(shape[0]), int(shape[1])) != (t.rows, t.dim):
                continue  # changed (or unknown to the previous task): a new table
        if _tiles(t, shards, previous.num_devices):
            out[name] = shards
        elif previous_shapes is not None:
            raise DataFormatError(f"previous plan: its shards of table {name!r} do not place its {t.rows} x {t.dim} "
                                  "cells exactly once")
    return out


def _tiles(t: Table, shards: Sequence[Shard], num_devices: int) -> bool:
    """Do the shards place every cell of `t` exactly once, on devices 0..num_devices-1?"""
    try:
        for s in shards:
            check_shard_block(s, t)
    except InvalidPlanError:
        return False
    if any(not 0 <= s.device < num_devices for s in shards):
        return False
    blocks = [(*s.rows(t.rows), s.col_start, s.col_end) for s in shards]
    for i, a in enumerate(blocks):
        for b in blocks[i + 1:]:
            if a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]:
                return False
    return sum((b[1] - b[0]) * (b[3] - b[2]) for b in blocks) == t.rows * t.dim


def _cut_allowed(t: Table, shards: Sequence[Shard], task: Task) -> bool:
    """Are the shards' cuts (row ranges, column slices at least the table's min_width wide) of kinds the task
    allows the table?"""
    rows_cut = any(s.rows(t.rows) != (0, t.rows) for s in shards)
    cols_cut = any((s.col_start, s.col_end) != (0, t.dim) for s in shards)
    return (not rows_cut or task.allows(t.name, "row")) and (not cols_cut or (
        task.allows(t.name, "column") and all(s.width >= task.min_width(t.name) for s in shards)))


def _shard_bytes(task: Task, t: Table, s: Shard) -> int:
    return task.memory.shard_bytes(s.num_rows(t.rows), s.width)


def _moved_of(task: Task, t: Table, s: Shard, new_on_device: Sequence[Shard]) -> int:
    """Bytes of old shard `s` of table `t` that the new shards of `t` on its device do not hold."""
    r0, r1 = s.rows(t.rows)
    kept = 0
    for n in new_on_device:
        n0, n1 = n.rows(t.rows)
        rows = min(r1, n1) - max(r0, n0)
        cols = min(s.col_end, n.col_end) - max(s.col_start, n.col_start)
        if rows > 0 and cols > 0:
            kept += task.memory.shard_bytes(rows, cols)
    # with per-row optimizer state an old shard split over two new shards counts its rows' state twice: clamp
    return max(0, _shard_bytes(task, t, s) - kept)


def _by_table_device(plan: Plan) -> dict[tuple[str, int], list[Shard]]:
    out: dict[tuple[str, int], list[Shard]] = defaultdict(list)
    for s in plan.shards:
        out[(s.table, s.device)].append(s)
    return out


def _moved(task: Task, old: Mapping[str, list[Shard]], plan: Plan) -> int:
    tables = {t.name: t for t in task.tables}
    new = _by_table_device(plan)
    return sum(_moved_of(task, tables[name], s, new.get((name, s.device), []))
               for name, shards in old.items() for s in shards)


def moved_bytes(task: Task, previous: Plan, plan: Plan, previous_shapes: Shapes | None = None) -> int:
    """Bytes of the previous plan's shards (of surviving tables) whose cells `plan` does not keep on their device."""
    return _moved(task, surviving_shards(task, previous, previous_shapes), plan)


def coalesce(task: Task, plan: Plan) -> Plan:
    """The plan with adjacent shards of one table on one device joined (same rows and touching columns, or same
    columns and touching rows): the same cells, fewer shards."""
    rows = {t.name: t.rows for t in task.tables}
    blocks: dict[tuple[str, int], list[list[int]]] = {}
    for s in plan.shards:
        blocks.setdefault((s.table, s.device), []).append([*s.rows(rows[s.table]), s.col_start, s.col_end])
    shards = []
    for (table, device), bs in blocks.items():
        joined = True
        while joined:
            joined = False
            for i in range(len(bs)):
                for j in range(i + 1, len(bs)):
                    a, b = bs[i], bs[j]
                    if a[:2] == b[:2] and (a[3] == b[2] or b[3] == a[2]):
                        bs[i] = [a[0], a[1], min(a[2], b[2]), max(a[3], b[3])]
                    elif a[2:] == b[2:] and (a[1] == b[0] or b[1] == a[0]):
                        bs[i] = [min(a[0], b[0]), max(a[1], b[1]), a[2], a[3]]
                    else:
                        continue
                    del bs[j]
                    joined = True
                    break
                if joined:
                    break
        for r0, r1, c0, c1 in sorted(bs, key=lambda b: (b[2], b[0])):
            row_range = (0, None) if (r0, r1) == (0, rows[table]) else (r0, r1)
            shards.append(Shard(table, device, c0, c1, *row_range))
    return Plan(plan.num_devices, tuple(shards))


# ---------------------------------------------------------------- the pieces task


class PiecesTask:
    """The task with the previous plan's shards of surviving tables as pinned tables (module docstring, step 2).

    `pins`: name in the pieces task -> the device it stays on; `keeps`: name -> the old shards it keeps there;
    `units`: groups of pinned names that are unpinned together (a group's kept members move together)."""

    def __init__(self, task: Task, old: Mapping[str, list[Shard]]) -> None:
        self.task = task
        user_pins, group_of, uncut = task.pinned_device(), task.group_of(), task.never_cut()
        used = {t.name for t in task.tables}
        self.tables: list[Table] = []
        self.pieces: dict[str, PieceOf] = {}
        self.pins: dict[str, int] = {}
        self.keeps: dict[str, list[Shard]] = {}
        self.table_of: dict[str, str] = {}
        grouped: dict[int, list[str]] = defaultdict(list)
        for t in task.tables:
            shards = old.get(t.name)
            if shards is None:  # new or changed: free
                self.tables.append(t)
                continue
            if len(shards) == 1 or t.name in uncut or not _cut_allowed(t, shards, task):
                # whole before, or must be whole now (constraints, or its cuts are of a kind the task disallows)
                self.tables.append(t)
                if t.name in user_pins:
                    continue  # the user's pin says where it goes
                allowed = set(task.allowed_devices(t.name))
                on: dict[int, int] = defaultdict(int)
                for s in shards:
                    if s.device in allowed:
                        on[s.device] += _shard_bytes(task, t, s)
                if not on:
                    continue  # its devices are all avoided now: it moves
                d = max(on, key=lambda k: (on[k], -k))
                self.pins[t.name] = d
                self.keeps[t.name] = [s for s in shards if s.device == d]
                self.table_of[t.name] = t.name
                if t.name in group_of:
                    grouped[group_of[t.name]].append(t.name)
                continue
            avoided = set(task.avoided().get(t.name, ()))
            for s in shards:
                r0, r1 = s.rows(t.rows)
                name = f"{t.name}[kept rows {r0}:{r1} cols {s.col_start}:{s.col_end}]"
                while name in used:
                    name += "'"
                used.add(name)
                self.pieces[name] = (t.name, r0, None if (r0, r1) == (0, t.rows) else r1, s.col_start, s.col_end)
                self.tables.append(replace(t, name=name, rows=r1 - r0, dim=s.width,
                                           pooling_factor=t.pooling_factor * (r1 - r0) / t.rows))
                self.table_of[name] = t.name
                if s.device not in avoided:
                    self.pins[name] = s.device
                    self.keeps[name] = [s]
        members = {n for ns in grouped.values() for n in ns}
        self.units: list[tuple[str, ...]] = [(n,) for n in self.pins if n not in members]
        for g, names in grouped.items():
            group = task.groups[g]
            allowed = set(range(task.num_devices))
            for m in group:
                allowed &= set(task.allowed_devices(m))
            on = defaultdict(int)
            for n in names:
                if self.pins[n] in allowed:
                    on[self.pins[n]] += self.unit_bytes((n,))
            # a member pinned by the user decides the group's device: pinned members were skipped above
            anchor = max(on, key=lambda k: (on[k], -k)) if on and not any(m in user_pins for m in group) else None
            kept = tuple(n for n in names if self.pins[n] == anchor)
            for n in names:
                if n not in kept:
                    del self.pins[n], self.keeps[n]
            if kept:
                self.units.append(kept)

    def unit_bytes(self, unit: Sequence[str]) -> int:
        tables = {t.name: t for t in self.task.tables}
        return sum(_shard_bytes(self.task, tables[self.table_of[n]], s) for n in unit for s in self.keeps[n])

    def task_with(self, pins: Mapping[str, int]) -> Task:
        """The pieces task with these pins (besides the user's)."""
        origin = {n: p[0] for n, p in self.pieces.items()}
        return self.task.derived(self.tables, origin, sorted(pins.items()))

    def merged(self, pieces_task: Task, plan: Plan) -> Plan:
        """A plan of the pieces task as a plan of the task's tables."""
        return coalesce(self.task, merge_pieces(pieces_task, plan, self.pieces) if self.pieces else plan)


# ---------------------------------------------------------------- the search


@dataclass(frozen=True)
class _Eval:
    plan: Plan
    cost_ms: float
    moved: int
    pins: Mapping[str, int]


def check_honours_pins(sharder: Sharder) -> None:
    """Refuse a sharder that cannot keep a table on a given device (TorchRec's planner)."""
    spec = SHARDERS.get(getattr(sharder, "name", ""))
    if spec is not None and spec.kind == "torchrec":
        able = ", ".join(n for n, s in SHARDERS.items() if s.kind != "torchrec")
        raise DreamShardError(f"sharder {spec.name!r} plans through TorchRec's planner, which cannot keep a shard on "
                              f"a given device (pins), so it cannot re-plan keeping shards in place; use one of {able}")


class _ReplanSearch:
    def __init__(self, task: Task, old: Mapping[str, list[Shard]], sharder: Sharder, cost: CostEstimator) -> None:
        self.task, self.old, self.sharder, self.cost = task, old, sharder, cost
        self.pieces = PiecesTask(task, old)
        self.cache: dict[frozenset[tuple[str, int]], _Eval | None] = {}
        self.evaluations = 0

    def evaluate(self, pins: Mapping[str, int]) -> _Eval | None:
        """The sharder's plan of the pieces task with `pins`, merged, costed; None when it finds no plan."""
        key = frozenset(pins.items())
        if key not in self.cache:
            self.evaluations += 1
            pieces_task = self.pieces.task_with(pins)
            try:
                raw = self.sharder.shard(pieces_task)
            except InfeasibleTaskError:
                self.cache[key] = None
                return None
            try:
                validate_plan(pieces_task, raw)
            except InvalidPlanError as exc:
                raise DreamShardError(f"sharder {getattr(self.sharder, 'name', self.sharder)!r} does not honour the "
                                      f"pins that keep shards in place, so it cannot re-plan: {exc}") from None
            plan = self.pieces.merged(pieces_task, raw)
            validate_plan(self.task, plan)
            self.cache[key] = _Eval(plan, self.cost.plan_cost(self.task, plan).cost_ms,
                                    _moved(self.task, self.old, plan), dict(pins))
        return self.cache[key]

    def unit_moved(self, unit: Sequence[str], plan: Plan) -> int:
        """Bytes of the unit's kept shards that `plan` moves."""
        tables = {t.name: t for t in self.task.tables}
        new = _by_table_device(plan)
        return sum(_moved_of(self.task, tables[self.pieces.table_of[n]], s,
                             new.get((self.pieces.table_of[n], s.device), []))
                   for n in unit for s in self.pieces.keeps[n])

    def target(self, unit: Sequence[str], full: Plan) -> int | None:
        """The device that holds most of a one-piece unit's cells in `full`, when it may go there and it is not
        where the piece is now."""
        if len(unit) != 1 or self.pieces.table_of[unit[0]] in self.task.group_of():
            return None
        name = unit[0]
        table = self.pieces.table_of[name]
        t = next(t for t in self.task.tables if t.name == table)
        on: dict[int, int] = defaultdict(int)
        for s in self.pieces.keeps[name]:
            r0, r1 = s.rows(t.rows)
            for n in full.shards:
                if n.table != table:
                    continue
                n0, n1 = n.rows(t.rows)
                rows = min(r1, n1) - max(r0, n0)
                cols = min(s.col_end, n.col_end) - max(s.col_start, n.col_start)
                if rows > 0 and cols > 0:
                    on[n.device] += rows * cols
        if not on:
            return None
        d = max(on, key=lambda k: (on[k], -k))
        if d == self.pieces.pins[name] or d not in self.task.allowed_devices(table):
            return None
        return d

    def forms(self, pins: Mapping[str, int], unit: Sequence[str], full: Plan) -> list[tuple[str, dict[str, int]]]:
        """The unit moved: unpinned, and re-pinned to its device in the full plan (when there is one)."""
        unpinned = {n: d for n, d in pins.items() if n not in unit}
        out = [("unpin", unpinned)]
        d = self.target(unit, full)
        if d is not None:
            out.append(("repin", {**unpinned, unit[0]: d}))
        return out


def replan(task: Task, previous: Plan, sharder: Sharder, max_moved_bytes: int | float, cost: CostEstimator,
           min_gain: float = 0.01, previous_shapes: Shapes | None = None) -> ReplanResult:
    """A plan of `task` that moves at most `max_moved_bytes` bytes of `previous`'s shards (module docstring).

    `cost` rates plans (a CostEstimator: a backend, the cost network, TorchRec's perf model); `min_gain` is the
    relative improvement a move must bring; `previous_shapes` the (rows, dim) of the previous task's tables, when
    known (plans written by `dreamshard plan` record them): without, changed tables are told by their shards."""
    if not max_moved_bytes >= 0:
        raise ValueError(f"max_moved_bytes: expected a number >= 0, got {max_moved_bytes}")
    if not 0 <= min_gain < 1:
        raise ValueError(f"min_gain: expected a number in [0, 1), got {min_gain}")
    check_device_count(task, previous)
    check_honours_pins(sharder)
    limit = max_moved_bytes
    old = surviving_shards(task, previous, previous_shapes)
    full = sharder.shard(task)
    validate_plan(task, full)
    full_moved = _moved(task, old, full)
    full_cost = cost.plan_cost(task, full).cost_ms

    search = _ReplanSearch(task, old, sharder, cost)
    pieces = search.pieces
    pins = dict(pieces.pins)
    kept = search.evaluate(pins)
    if kept is None:  # the pinned pieces leave no room: unpin units, those the full plan moves first, small first
        order = sorted(pieces.units, key=lambda u: (search.unit_moved(u, full) == 0, pieces.unit_bytes(u), u))
        for unit in order:
            pins = {n: d for n, d in pins.items() if n not in unit}
            kept = search.evaluate(pins)
            if kept is not None:
                break
    if kept is None:
        raise InfeasibleTaskError(f"task {task.name!r}: the sharder places the tables, but not with the previous "
                                  "plan's shards as pieces, even unpinned")

    def result(chosen: _Eval | None, source: str, tried: int = 0, accepted: int = 0, candidates: int = 0
               ) -> ReplanResult:
        assert kept is not None
        plan, moved, cost_ms = (full, full_moved, full_cost) if chosen is None else \
            (chosen.plan, chosen.moved, chosen.cost_ms)
        validate_plan(task, plan)
        if moved > limit:
            raise AssertionError(f"re-planning moved {moved} bytes, over the limit of {limit}")
        return ReplanResult(plan, full, moved, full_moved, cost_ms, full_cost, kept.cost_ms, kept.moved,
                            int(min(limit, 2**62)), candidates, tried, accepted, search.evaluations, source)

    if kept.moved > limit:
        if full_moved <= limit:
            return result(None, "full")
        raise InfeasibleTaskError(
            f"task {task.name!r}: keeping the previous plan's shards in place needs moving {kept.moved / GB:.3f} GB "
            f"(constraints or memory force it), over the limit of {limit / GB:.3f} GB; the full re-plan moves "
            f"{full_moved / GB:.3f} GB")
    if full_moved == 0 and full_cost <= kept.cost_ms:
        return result(None, "full")  # nothing to move (e.g. nothing changed)

    # candidates: pinned units whose cells the full plan puts elsewhere
    candidates = [u for u in pieces.units if all(n in kept.pins for n in u) and search.unit_moved(u, full) > 0]
    current, tried, accepted = kept, 0, 0

    def better(ev: _Eval | None, than: _Eval) -> bool:
        return ev is not None and ev.moved <= limit and ev.cost_ms <= than.cost_ms * (1 - min_gain)

    # 1. release: the cheapest candidates unpinned together (nested sets, fewest bytes first), so that the
    # sharder rebalances every device at once: one move cannot lower a maximum that several devices share
    ranked = sorted(candidates, key=lambda u: (pieces.unit_bytes(u), u))
    released: dict[str, int] = dict(kept.pins)
    sets: list[_Eval] = []
    release_bytes = kept.moved
    for unit in ranked:
        release_bytes += pieces.unit_bytes(unit)
        if release_bytes > limit:
            break
        for n in unit:
            released.pop(n, None)
        tried += 1
        ev = search.evaluate(released)
        if ev is not None and ev.moved <= limit:
            sets.append(ev)
    # the cheapest set, or one within min_gain of it that moves fewer bytes (leaving more for single moves)
    lowest = min((ev.cost_ms for ev in sets), default=math.inf)
    best_release = min((ev for ev in sets if ev.cost_ms <= lowest * (1 + min_gain)), key=lambda ev: ev.moved,
                       default=None)
    if best_release is not None and better(best_release, current):
        current = best_release
        accepted += 1

    # 2. single moves on top, from the release's plan and from kept (a large release can leave too little of the
    # limit for the moves that matter): each candidate still pinned scored once from there (cost gain per byte
    # moved, by the better of its forms), then tried once, best first, on top of the moves accepted so far
    def single_moves(current: _Eval) -> tuple[_Eval, int, int]:
        base, tried, accepted = current, 0, 0
        scored: list[tuple[float, float, str, tuple[str, ...]]] = []
        for unit in candidates:
            if not all(n in base.pins for n in unit) or base.moved + pieces.unit_bytes(unit) > limit:
                continue  # released already, or moving it would break the limit
            best_form: tuple[float, float, str] | None = None
            for form, unit_pins in search.forms(base.pins, unit, full):
                ev = search.evaluate(unit_pins)
                if ev is None or ev.moved > limit:
                    continue
                gain = base.cost_ms - ev.cost_ms
                per_byte = gain / max(ev.moved - base.moved, 1)
                if best_form is None or (gain > 0, per_byte, gain) > (best_form[0] > 0, best_form[1], best_form[0]):
                    best_form = (gain, per_byte, form)
            if best_form is not None:
                scored.append((best_form[0], best_form[1], best_form[2], unit))
        scored.sort(key=lambda x: (-(x[0] > 0), -x[1], -x[0], x[3]))
        for _, _, form, unit in scored:
            if current.moved + pieces.unit_bytes(unit) > limit:
                continue
            forms = dict(search.forms(current.pins, unit, full))
            tried += 1
            ev = search.evaluate(forms.get(form, forms["unpin"]))
            if better(ev, current):
                assert ev is not None
                current = ev
                accepted += 1
        return current, tried, accepted

    for start in [current] + ([kept] if current is not kept else []):
        _, t, a = single_moves(start)
        tried, accepted = tried + t, accepted + a
    # the plan that moves least among the cheapest: within min_gain of the lowest cost (a move must be worth it),
    # and no dearer than the full re-plan when that moves within the limit
    pool: list[tuple[_Eval | None, str]] = [(kept, "kept")]
    pool += [(ev, "search") for ev in search.cache.values() if ev is not None and ev is not kept and ev.moved <= limit]
    if full_moved <= limit:
        pool.append((None, "full"))

    def cost_of(ev: _Eval | None) -> float:
        return full_cost if ev is None else ev.cost_ms

    def moved_of(ev: _Eval | None) -> int:
        return full_moved if ev is None else ev.moved

    threshold = min(cost_of(ev) for ev, _ in pool) * (1 + min_gain)
    if full_moved <= limit:
        threshold = min(threshold, full_cost)
    chosen, source = min(((ev, src) for ev, src in pool if cost_of(ev) <= threshold),
                         key=lambda x: (moved_of(x[0]), cost_of(x[0])))
    return result(chosen, source, tried, accepted, len(candidates))
