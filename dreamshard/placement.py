"""Placing whole tables in a given order, each onto the device a ranking prefers.

Every sharder that assigns whole tables goes through `place_tables`: the first device of its ranking with
room, backing up depth-first from memory dead ends, so a plan is found whenever one exists within
`max_steps` and the plain greedy plan comes out where no dead end is met. Pinned tables go first; avoid
lists and groups hold whatever the ranking says. Details: docs/sharders.md, docs/clusters.md.
"""
from __future__ import annotations

import contextvars
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from dreamshard.errors import InfeasibleTaskError
from dreamshard.memory import GB
from dreamshard.tasks import Task

DEFAULT_MAX_STEPS = 200_000
# placements in the given order before starting again largest first: a preference order (predicted cost) can
# strand the largest tables behind small ones when memory is tight, and backing out of that takes long
DEFAULT_PATIENCE = 10_000
# both grow with the task: at least this many placements per table, so that a search is never given fewer steps
# than it has tables to place (a task of a million tables in 1% of memory is not called infeasible)
MAX_STEPS_PER_TABLE = 20
PATIENCE_PER_TABLE = 2


def step_budget(num_tables: int) -> int:
    """`place_tables`' default max_steps for `num_tables` tables: DEFAULT_MAX_STEPS, more for large tasks."""
    return max(DEFAULT_MAX_STEPS, MAX_STEPS_PER_TABLE * num_tables)


def patience_of(num_tables: int) -> int:
    """`place_tables`' default patience for `num_tables` tables: DEFAULT_PATIENCE, more for large tasks."""
    return max(DEFAULT_PATIENCE, PATIENCE_PER_TABLE * num_tables)
_RESTART = contextvars.ContextVar("place_tables_restart", default=True)


@contextmanager
def giving_up_early() -> Iterator[None]:
    """Within it, `place_tables` raises InfeasibleTaskError after `patience` placements in the given order instead
    of starting again largest first: for a caller with a better way out. `sharders.pieces.with_pieces` cuts the
    tables finer, which places them in the sharder's own order and keeps its plans, where a restart in another
    order can lose them (results/mlperf_dcnv2/README.md)."""
    token = _RESTART.set(False)
    try:
        yield
    finally:
        _RESTART.reset(token)


@dataclass
class PlacementState:
    """Per-device load of the tables placed so far."""

    used_bytes: np.ndarray  # memory taken per device
    load: np.ndarray  # sum of the placed tables' weights per device: [D] or [D, k] for vector weights
    free_bytes: np.ndarray
    speed: np.ndarray  # relative throughput per device (Device.speed)

    def __post_init__(self) -> None:
        self.alike = bool((self.speed == 1.0).all())  # load / speed is the load itself


# (table index, state) -> devices in order of preference
DeviceRanking = Callable[[int, PlacementState], Sequence[int]]


def place_tables(
    task: Task,
    order: Sequence[int],
    rank_devices: DeviceRanking,
    weights: Sequence[float] | np.ndarray | None = None,  # per table: a number, or a vector
    max_steps: int | None = None,
    patience: int | None = None,
) -> list[int]:
    """Device of each table (indexed like task.tables), placing tables in `order`; after `patience`
    placements without a plan, the search starts again with the largest tables first (ties in `order`),
    which packs tight memory in far fewer steps, within `max_steps` placements in all (unless
    `giving_up_early`: then it stops there). Both default to budgets that grow with the tables (`step_budget`,
    `patience_of`)."""
    n = len(task.tables)
    max_steps = step_budget(n) if max_steps is None else max_steps
    patience = patience_of(n) if patience is None else patience
    if len(order) != n or not np.array_equal(np.sort(np.asarray(order, dtype=np.int64)), np.arange(n)):
        raise ValueError("order must list every table of the task exactly once")
    pinned = task.pinned_device()
    pins = {i: pinned[t.name] for i, t in enumerate(task.tables) if t.name in pinned}
    if pins:
        order = [t for t in order if t in pins] + [t for t in order if t not in pins]
    sizes = table_sizes(task)
    capacity = np.array(task.capacities(), dtype=np.int64)
    _check_each_table_fits(task, sizes, capacity)
    if sizes.sum() > capacity.sum():
        raise InfeasibleTaskError(
            f"task {task.name!r}: tables need {sizes.sum() / GB:.3f} GB in total, "
            f"the {task.num_devices} devices hold {capacity.sum() / GB:.3f} GB"
        )
    _check_packing_bound(task, sizes, capacity)
    w = np.zeros(n) if weights is None else np.asarray(weights, dtype=np.float64)
    order = list(order)
    first_budget = max_steps if patience >= max_steps or _largest_first(order, sizes, pins) == order else patience
    restart = first_budget < max_steps and _RESTART.get()
    searches = [(order, first_budget)]
    if restart:
        searches.append((_largest_first(order, sizes, pins), max_steps - first_budget))
    for tried_order, budget in searches:
        assignment, deepest, exhausted = _depth_first(task, tried_order, rank_devices, sizes, capacity, w, pins,
                                                      budget)
        if assignment is not None:
            return assignment
        if exhausted:  # every ranking tried to its end: no order finds what this one did not
            raise InfeasibleTaskError(
                f"task {task.name!r}: no placement of all {n} tables fits in memory"
                f"{' under its constraints' if task.constrained else ''}; "
                f"table {task.tables[tried_order[deepest]].name!r} fits on no device after the tables before it "
                f"({_capacities(task)}){_constraints_of(task, task.tables[tried_order[deepest]].name)}"
            )
    raise InfeasibleTaskError(
        f"task {task.name!r}: no placement within memory found in {sum(b for _, b in searches)} steps; "
        f"table {task.tables[searches[-1][0][deepest]].name!r} was the hardest to fit "
        f"({_capacities(task)})"
    )


_last_sizes: tuple[weakref.ref[Task], np.ndarray] | None = None  # table_sizes of the task asked last


def table_sizes(task: Task) -> np.ndarray:
    """Bytes of each table of `task` (Task.table_bytes), as a read-only int64 array; the last task's are kept (a
    sharder and the placement it calls ask for the same task's)."""
    global _last_sizes
    last = _last_sizes
    if last is not None and last[0]() is task:
        return last[1]
    sizes = np.fromiter((task.table_bytes(i) for i in range(len(task.tables))), dtype=np.int64,
                        count=len(task.tables))
    sizes.flags.writeable = False
    _last_sizes = (weakref.ref(task), sizes)
    return sizes


def _largest_first(order: list[int], sizes: np.ndarray, pins: dict[int, int]) -> list[int]:
    """`order` with the pinned tables first, then the largest first; ties keep their place in `order`."""
    at = np.asarray(order, dtype=np.int64)
    unpinned = np.fromiter((t not in pins for t in order), dtype=bool, count=len(order)) if pins else \
        np.ones(len(order), dtype=bool)
    by = np.lexsort((-sizes[at], unpinned))  # stable: the given order breaks ties
    return at[by].tolist()


SCAN_AT_ONCE = 16  # from this many devices left in a ranking on, those without room are skipped in one pass


def _depth_first(task: Task, order: Sequence[int], rank_devices: DeviceRanking, sizes: np.ndarray,
                 capacity: np.ndarray, w: np.ndarray, pins: dict[int, int],
                 max_steps: int) -> tuple[list[int] | None, int, bool]:
    """(device of each table, or None when there is none; position in `order` of the deepest table reached;
    whether the search ran to its end, rather than out of `max_steps` placements)."""
    n = len(order)
    avoided = task.avoided()
    banned = {i: set(avoided[t.name]) for i, t in enumerate(task.tables) if t.name in avoided}
    group_names = task.group_of()
    group = {i: group_names[t.name] for i, t in enumerate(task.tables) if t.name in group_names}
    group_device: dict[int, int] = {}  # group -> the device of its placed tables
    group_placed: dict[int, int] = {}  # group -> how many of its tables are placed
    state = PlacementState(np.zeros(task.num_devices, np.int64),
                           np.zeros((task.num_devices, *w.shape[1:])), capacity.copy(),
                           np.array(task.speeds(), dtype=np.float64))
    assignment = [-1] * n
    steps = 0
    deepest = 0

    # depth-first search with an explicit stack (no recursion): rankings[k] is the ranking of the
    # k-th table in `order`, made when the search first reached it; tried[k] how much of it is used
    rankings: list[Sequence[int]] = []
    tried: list[int] = []
    k = 0
    while 0 <= k < n:
        t = order[k]
        if len(rankings) == k:  # reaching this table from the one before: rank its devices now
            deepest = max(deepest, k)
            ranking = [pins[t]] if t in pins else rank_devices(t, state)
            if t in banned:
                ranking = [d for d in ranking if d not in banned[t]]
            if t in group and group.get(t) in group_device:
                ranking = [d for d in ranking if d == group_device[group[t]]]
            rankings.append(ranking)
            tried.append(0)
        elif assignment[t] != -1:  # back from a dead end below: take this table off its device
            if not isinstance(rankings[k], list):  # a lazy ranking (by_least_load): its devices listed once
                rankings[k] = list(rankings[k])
            d = assignment[t]
            assignment[t] = -1
            state.used_bytes[d] -= sizes[t]
            state.free_bytes[d] += sizes[t]
            state.load[d] -= w[t]
            if t in group:
                group_placed[group[t]] -= 1
                if not group_placed[group[t]]:
                    del group_device[group[t]]
        placed = False
        while tried[k] < len(rankings[k]) and not placed:
            d = rankings[k][tried[k]]
            tried[k] += 1
            if state.free_bytes[d] < sizes[t]:
                if len(rankings[k]) - tried[k] >= SCAN_AT_ONCE:  # the next device with room, found in one pass
                    rest = np.asarray(rankings[k][tried[k]:], dtype=np.int64)
                    room = np.flatnonzero(state.free_bytes[rest] >= sizes[t])
                    tried[k] += int(room[0]) if room.size else len(rest)
                continue
            steps += 1
            if steps > max_steps:
                return None, deepest, False
            assignment[t] = d
            state.used_bytes[d] += sizes[t]
            state.free_bytes[d] -= sizes[t]
            state.load[d] += w[t]
            if t in group:
                group_device[group[t]] = d
                group_placed[group[t]] = group_placed.get(group[t], 0) + 1
            placed = True
        if placed:
            k += 1
        else:  # every device of the ranking tried: back up to the table before
            rankings.pop()
            tried.pop()
            k -= 1
    return (assignment if k == n else None), deepest, True


def _constraints_of(task: Task, name: str) -> str:
    """The constraints on table `name`, for an error message."""
    said = []
    if name in task.pinned_device():
        said.append(f"pinned to device {task.pinned_device()[name]}")
    if name in task.avoided():
        said.append(f"avoids devices {list(task.avoided()[name])}")
    if name in task.group_of():
        said.append(f"in group {list(task.groups[task.group_of()[name]])}")
    return f"; {name!r} is {' and '.join(said)}" if said else ""


def _capacities(task: Task) -> str:
    caps = sorted(set(task.capacities()))
    return "device capacities " + ", ".join(f"{c / GB:.3f} GB" for c in caps)


def _check_each_table_fits(task: Task, sizes: np.ndarray, capacity: np.ndarray) -> None:
    allowed = np.full(len(sizes), capacity.max())
    limited = set(task.pinned_device()) | set(task.avoided())  # the others may use every device
    for i, t in enumerate(task.tables):
        if t.name in limited:
            allowed[i] = capacity[task.allowed_devices(t.name)].max()
    too_big = np.flatnonzero(sizes > allowed)
    if too_big.size:
        t = task.tables[int(too_big[0])]
        raise InfeasibleTaskError(
            f"task {task.name!r}: table {t.name!r} ({t.rows} rows x {t.dim} dims, "
            f"{sizes[too_big[0]] / GB:.3f} GB) fits on no device ({_capacities(task)})"
            f"{' it may use' + _constraints_of(task, t.name) if _constraints_of(task, t.name) else ''}"
        )


def _check_packing_bound(task: Task, sizes: np.ndarray, capacity: np.ndarray) -> None:
    """Raise InfeasibleTaskError when the tables provably cannot be packed: for a size s, device d holds at most
    floor(capacity_d / s) tables of at least s bytes, so more such tables than the devices hold together fit
    nowhere. A necessary condition only (constraints left out), checked for every table size: it turns a
    depth-first search that would end in failure after `max_steps` into an immediate error.

    Only the sizes where the count can pass the room are checked one by one: count x size is at most the bytes of
    the tables so far, and room > total capacity / size - devices, so the count can pass it only where those bytes
    exceed total capacity - devices x size (linear in tables and devices, where checking each size was their
    product)."""
    order = np.sort(sizes[sizes > 0])[::-1]
    if not order.size:
        return
    so_far = np.cumsum(order.astype(np.float64))
    slack = 1e-9 * float(capacity.sum()) + len(capacity) + 1.0  # float rounding, taken generously
    maybe = np.flatnonzero(so_far > float(capacity.sum()) - len(capacity) * order.astype(np.float64) - slack)
    for start in range(0, maybe.size, 1024):
        at = maybe[start:start + 1024]
        rooms = np.floor(capacity[None, :] / order[at, None]).sum(axis=1)
        over = np.flatnonzero(at + 1 > rooms)
        if over.size:
            count, room = int(at[over[0]]) + 1, int(rooms[over[0]])
            raise InfeasibleTaskError(
                f"task {task.name!r}: {count} tables of at least {_size(int(order[count - 1]))} each, but the "
                f"devices hold at most {room} of them ({_capacities(task)})")


def _size(nbytes: int) -> str:
    return f"{nbytes / GB:.3f} GB" if nbytes >= GB // 1000 else f"{nbytes} bytes"


class LazyRanking(Sequence[int]):
    """A ranking of `_n` devices whose first (`_first`) is known when made and whose whole order (`_full`) is
    computed only when asked for: when the search backs up to its table."""

    _first: int
    _n: int

    def _full(self) -> list[int]:
        raise NotImplementedError

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        return self._first if i == 0 else self._full()[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self._full())


class LeastLoadRanking(LazyRanking):
    """The devices by (load / speed, used bytes, index): the first found in one pass over the devices when made,
    the rest sorted only when asked for, which happens when the search backs up to this table and so finds the
    state as it was (kept by nothing here: a million tables on a thousand devices would keep gigabytes)."""

    def __init__(self, state: PlacementState) -> None:
        key = state.load if state.alike else state.load / state.speed
        ties = np.flatnonzero(key == key.min())
        # argmin: the lowest index among equals
        self._first = int(ties[0]) if ties.size == 1 else int(ties[np.argmin(state.used_bytes[ties])])
        self._state: PlacementState | None = state
        self._n = len(state.used_bytes)
        self._order: list[int] | None = None

    def _full(self) -> list[int]:
        if self._order is None:
            state = self._state
            assert state is not None
            order = np.lexsort((np.arange(len(state.used_bytes)), state.used_bytes, state.load / state.speed))
            # the first stays first, whatever rounding the loads took since (each device is tried once)
            self._order = [self._first] + [d for d in order.tolist() if d != self._first]
            self._state = None
        return self._order


LAZY_RANKING_DEVICES = 16  # from this many devices on, by_least_load ranks lazily (LeastLoadRanking)


def by_least_load(t: int, state: PlacementState) -> Sequence[int]:
    """Greedy ranking: smallest accumulated weight per unit of speed first (the weight itself when devices are
    alike), then least memory, then lowest index. Scalar weights only."""
    if len(state.load) < LAZY_RANKING_DEVICES:
        return sorted(range(len(state.load)), key=lambda d: (state.load[d] / state.speed[d], state.used_bytes[d], d))
    return LeastLoadRanking(state)


def find_feasible_assignment(task: Task, max_steps: int | None = None) -> list[int]:
    """Any placement within memory (largest tables first, balancing bytes): a feasibility certificate."""
    sizes = table_sizes(task)
    order = np.lexsort((np.arange(len(sizes)), -sizes)).tolist()
    return place_tables(task, order, by_least_load, weights=sizes, max_steps=max_steps)


# ---------------------------------------------------------------- satisfiability


def check_satisfiable(task: Task) -> None:
    """Raise InfeasibleTaskError naming the constraints that no plan can satisfy together (each device's
    memory included); a task that passes may still be infeasible by memory, which placement reports."""
    caps = task.capacities()
    pins, avoided = task.pinned_device(), task.avoided()

    def describe(t: str) -> str:
        parts = []
        if t in pins:
            parts.append(f"pin {pins[t]}")
        if t in avoided:
            parts.append(f"avoid {list(avoided[t])}")
        return f"{t!r} ({', '.join(parts)})" if parts else repr(t)

    for t, d in pins.items():
        if d in avoided.get(t, ()):
            raise InfeasibleTaskError(f"task {task.name!r}: table {t!r}: pin to device {d} conflicts with its avoid "
                                      f"{list(avoided[t])}")
    for t, ds in avoided.items():
        if len(set(ds)) >= task.num_devices:
            raise InfeasibleTaskError(f"task {task.name!r}: table {t!r} avoids every device ({list(ds)})")
    # units that must stay on one device: each group, and each other never-cut table
    units: list[tuple[str, tuple[str, ...]]] = [(f"group {list(g)}", g) for g in task.groups]
    grouped = {t for g in task.groups for t in g}
    units += [(f"table {t!r} ({'pinned' if t in pins else 'whole'})", (t,))
              for t in sorted(task.never_cut() - grouped)]
    by_name = {t.name: t for t in task.tables} if units else {}
    where: dict[int, list[tuple[str, int]]] = {}
    for label, members in units:
        member_pins = {t: pins[t] for t in members if t in pins}
        if len(set(member_pins.values())) > 1:
            raise InfeasibleTaskError(f"task {task.name!r}: {label}: members are pinned to different devices: "
                                      + ", ".join(f"{t!r} to {d}" for t, d in member_pins.items()))
        allowed = set(range(task.num_devices))
        for t in members:
            allowed &= set(task.allowed_devices(t))
        if not allowed:
            raise InfeasibleTaskError(f"task {task.name!r}: {label}: no device is allowed for all of its tables: "
                                      + ", ".join(describe(t) for t in members))
        need = sum(task.shard_bytes(by_name[t]) for t in members)
        best = max(allowed, key=lambda d: caps[d])
        if need > caps[best]:
            raise InfeasibleTaskError(
                f"task {task.name!r}: {label} needs {need / GB:.3f} GB on one device, but the largest device it may "
                f"use (device {best}) holds {caps[best] / GB:.3f} GB"
                + (f"; constraints: {', '.join(describe(t) for t in members)}" if len(allowed) < len(caps) else ""))
        if member_pins:
            where.setdefault(next(iter(member_pins.values())), []).append((label, need))
    for d, units_on in sorted(where.items()):
        need = sum(n for _, n in units_on)
        if need > caps[d]:
            raise InfeasibleTaskError(f"task {task.name!r}: device {d}: {', '.join(label for label, _ in units_on)} "
                                      f"are pinned to it and need {need / GB:.3f} GB together; it holds "
                                      f"{caps[d] / GB:.3f} GB")
