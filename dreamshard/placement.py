"""The one placement engine: tables and pieces onto devices, each onto the device a ranking prefers.

`Rules` holds what every placement keeps (each device's capacity, pins, avoid lists, groups), `Room` one placement
in progress and `Rooms` several side by side; no sharder checks these itself, its search is an order and moves
over them (tests/unit/test_one_engine.py). `place_tables` places the tables of a task: the first device of
each ranking with room, backing up depth-first from memory dead ends, so a plan is found whenever one exists
within `max_steps` and the plain greedy plan comes out where no dead end is met (`place_items`: that first pass
alone). Pinned tables go first; avoid lists and groups hold whatever the ranking says. Details:
docs/sharders.md, docs/clusters.md.
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


class Rules:
    """Where each item (a table of a task, or a piece of one) may go: the rules every placement keeps, written once.

    Each device's capacity and each item's bytes; an item's pin (the one device it takes, its ranking not asked:
    a user's pin, a row-wise block's own device), the devices it must avoid, and its group (a group's items share
    the device its first placed item took). `place_items` keeps them, and so does every search that moves items
    itself, through `Room` (one placement), `Rooms` (several side by side) and `with_room`; no sharder checks
    capacity, pins, avoid lists or groups on its own (tests/unit/test_one_engine.py)."""

    def __init__(self, capacity: np.ndarray, sizes: np.ndarray, pins: dict[int, int], banned: dict[int, set[int]],
                 group: dict[int, int]) -> None:
        self.capacity = capacity  # bytes each device holds, int64
        self.sizes = sizes  # bytes of each item, int64
        self.pins = pins  # item -> the device it must take
        self.banned = banned  # item -> the devices it must not take
        self.group = group  # item -> its group
        self._masks: dict[int, np.ndarray] = {}

    @classmethod
    def of_task(cls, task: Task, sizes: np.ndarray | None = None) -> Rules:
        """The rules of `task`'s tables (`sizes`: their bytes, `table_sizes` by default)."""
        pinned, avoided, group_names = task.pinned_device(), task.avoided(), task.group_of()
        pins: dict[int, int] = {}
        banned: dict[int, set[int]] = {}
        group: dict[int, int] = {}
        if pinned or avoided or group_names:
            for i, t in enumerate(task.tables):
                if t.name in pinned:
                    pins[i] = pinned[t.name]
                if t.name in avoided:
                    banned[i] = set(avoided[t.name])
                if t.name in group_names:
                    group[i] = group_names[t.name]
        return cls(np.array(task.capacities(), dtype=np.int64), table_sizes(task) if sizes is None else sizes,
                   pins, banned, group)

    def of_pieces(self, owner: Sequence[int], sizes: Sequence[int] | np.ndarray,
                  fixed: Sequence[int | None] | None = None) -> Rules:
        """The rules of pieces of these rules' tables, as `Task.derived` carries them over: piece p of table
        `owner[p]` (`sizes[p]` bytes) keeps its table's pin, avoid list and group; `fixed[p]`, where not None, pins
        it (a row-wise block to its device)."""
        pins: dict[int, int] = {}
        banned: dict[int, set[int]] = {}
        group: dict[int, int] = {}
        if self.pins or self.banned or self.group:
            for p, t in enumerate(owner):
                if t in self.pins:
                    pins[p] = self.pins[t]
                if t in self.banned:
                    banned[p] = self.banned[t]
                if t in self.group:
                    group[p] = self.group[t]
        if fixed is not None:
            pins.update((p, d) for p, d in enumerate(fixed) if d is not None)
        return Rules(self.capacity, np.asarray(sizes, dtype=np.int64), pins, banned, group)

    @property
    def num_devices(self) -> int:
        return len(self.capacity)

    def may_use(self, i: int) -> list[int]:
        """The devices item `i` may take, lowest first (groups aside)."""
        devices = [self.pins[i]] if i in self.pins else range(self.num_devices)
        banned = self.banned.get(i, ())
        return [d for d in devices if d not in banned]

    def one_device(self) -> list[bool]:
        """Of each item: may it take one device at most (pinned, or avoiding all others; groups aside)?"""
        if self.num_devices <= 1:
            return [True] * len(self.sizes)
        single = [False] * len(self.sizes)
        for i in self.pins:
            single[i] = True
        for i in self.banned:
            single[i] = single[i] or len(self.may_use(i)) <= 1
        return single

    def movable(self, i: int) -> bool:
        """May a search move item `i` alone (neither pinned nor grouped)?"""
        return i not in self.pins and i not in self.group

    def with_room(self, i: int, used: Sequence[int] | np.ndarray) -> list[int]:
        """The devices item `i` may take that have room for it beside the `used` bytes, lowest first (groups
        aside: for a search moving items that are in no group, `movable`)."""
        size = self.sizes[i]
        return [d for d in self.may_use(i) if used[d] + size <= self.capacity[d]]

    def fits(self, d: int, used: int) -> bool:
        """Does device `d` hold `used` bytes?"""
        return used <= self.capacity[d]

    def holds(self, used: Sequence[int] | np.ndarray) -> bool:
        """Does every device hold the `used` bytes (a whole plan's, e.g. after pieces replace a table)?"""
        return bool(np.all(np.asarray(used, dtype=np.int64) <= self.capacity))

    def mask(self, i: int) -> np.ndarray:
        """[devices] bool: the devices item `i` may take (groups aside)."""
        key = i if i in self.pins or i in self.banned else -1  # -1: every device
        m = self._masks.get(key)
        if m is None:
            m = np.zeros(self.num_devices, dtype=bool)
            m[self.may_use(i)] = True
            m.flags.writeable = False
            self._masks[key] = m
        return m

    def pinned_first(self, order: Sequence[int]) -> list[int]:
        """`order` with the pinned items first, each part in its given order: every placement places them
        first, so that every other item's ranking sees their load."""
        if not self.pins:
            return list(order)
        return [t for t in order if t in self.pins] + [t for t in order if t not in self.pins]


class Room:
    """One placement in progress under `Rules`: the state the rankings see (PlacementState) and the device each
    group took."""

    def __init__(self, rules: Rules, weights: np.ndarray, speed: Sequence[float]) -> None:
        n = rules.num_devices
        self.rules = rules
        self.weights = weights
        self.state = PlacementState(np.zeros(n, np.int64), np.zeros((n, *weights.shape[1:])), rules.capacity.copy(),
                                    np.array(speed, dtype=np.float64))
        self.group_device: dict[int, int] = {}  # group -> the device of its placed items
        self.group_placed: dict[int, int] = {}  # group -> how many of its items are placed
        # read once per item: kept at hand
        self._sizes, self._pins, self._banned, self._group = rules.sizes, rules.pins, rules.banned, rules.group
        self._used, self._free, self._load = self.state.used_bytes, self.state.free_bytes, self.state.load

    def ranking(self, i: int, rank_devices: DeviceRanking) -> Sequence[int]:
        """The devices item `i` may take now, in `rank_devices`' order (its pin alone, unranked, when pinned): its
        group's device once the group has one."""
        ranking = [self._pins[i]] if i in self._pins else rank_devices(i, self.state)
        if i in self._banned:
            ranking = [d for d in ranking if d not in self._banned[i]]
        group = self._group
        if i in group and group[i] in self.group_device:
            ranking = [d for d in ranking if d == self.group_device[group[i]]]
        return ranking

    def first_with_room(self, i: int, ranking: Sequence[int], at: int) -> int:
        """The position in `ranking`, from `at` on, of the first device with room for item `i`; len(ranking) when
        none has room."""
        free, size, end = self._free, self._sizes[i], len(ranking)
        while at < end:
            if free[ranking[at]] >= size:
                return at
            at += 1
            if end - at >= SCAN_AT_ONCE:  # the next device with room, found in one pass
                rest = np.asarray(ranking[at:], dtype=np.int64)
                room = np.flatnonzero(free[rest] >= size)
                return at + int(room[0]) if room.size else end
        return at

    def place(self, i: int, d: int) -> None:
        size = self._sizes[i]
        self._used[d] += size
        self._free[d] -= size
        self._load[d] += self.weights[i]
        group = self._group
        if i in group:
            self.group_device[group[i]] = d
            self.group_placed[group[i]] = self.group_placed.get(group[i], 0) + 1

    def remove(self, i: int, d: int) -> None:
        size = self._sizes[i]
        self._used[d] -= size
        self._free[d] += size
        self._load[d] -= self.weights[i]
        group = self._group
        if i in group:
            self.group_placed[group[i]] -= 1
            if not self.group_placed[group[i]]:
                del self.group_device[group[i]]


class Rooms:
    """`copies` placements under `Rules` side by side, each item placed in all of them at once (NeuroShard's grid
    of scales): each one's bytes per device and the device each of its groups took."""

    def __init__(self, rules: Rules, copies: int) -> None:
        self.rules = rules
        self.used = np.zeros((copies, rules.num_devices), dtype=np.int64)
        self.group_device = np.full((copies, max(rules.group.values(), default=-1) + 1), -1)

    def open(self, i: int) -> np.ndarray:
        """[copies, devices] bool: where item `i` may go in each placement, with room and its group's device."""
        rules = self.rules
        room = (self.used + rules.sizes[i] <= rules.capacity) & rules.mask(i)
        g = rules.group.get(i, -1)
        if g >= 0:  # a group's later items follow its first one
            placed = self.group_device[:, g]
            room &= (placed[:, None] < 0) | (np.arange(rules.num_devices) == placed[:, None])
        return room

    def place(self, i: int, choice: np.ndarray) -> None:
        """Item `i` onto device choice[c] in placement c."""
        self.used[np.arange(len(choice)), choice] += self.rules.sizes[i]
        g = self.rules.group.get(i, -1)
        if g >= 0:
            self.group_device[:, g] = choice


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
    rules = Rules.of_task(task)
    order = rules.pinned_first(order)
    sizes, capacity = rules.sizes, rules.capacity
    _check_each_table_fits(task, sizes, capacity)
    if sizes.sum() > capacity.sum():
        raise InfeasibleTaskError(
            f"task {task.name!r}: tables need {sizes.sum() / GB:.3f} GB in total, "
            f"the {task.num_devices} devices hold {capacity.sum() / GB:.3f} GB"
        )
    _check_packing_bound(task, sizes, capacity)
    w = np.zeros(n) if weights is None else np.asarray(weights, dtype=np.float64)
    first_budget = max_steps if patience >= max_steps or _largest_first(order, sizes, rules.pins) == order \
        else patience
    restart = first_budget < max_steps and _RESTART.get()
    searches = [(order, first_budget)]
    if restart:
        searches.append((_largest_first(order, sizes, rules.pins), max_steps - first_budget))
    for tried_order, budget in searches:
        assignment, deepest, exhausted = _depth_first(Room(rules, w, task.speeds()), tried_order, rank_devices,
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


def place_items(rules: Rules, order: Sequence[int], rank_devices: DeviceRanking,
                weights: Sequence[float] | np.ndarray, speed: Sequence[float]) -> list[int] | None:
    """`place_tables`' first pass alone: each item in `order` (as given: callers put the pinned first,
    `Rules.pinned_first`) onto the first device of its ranking with room, None at the first item that finds
    none, where `place_tables` would back up. For searches that place many candidate layouts of one task (its
    pieces at other cuts, `Rules.of_pieces`) and cannot afford a Task for each."""
    room = Room(rules, np.asarray(weights, dtype=np.float64), speed)
    assignment, _, _ = _depth_first(room, order, rank_devices, len(order), backing_up=False)
    return assignment


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


def _depth_first(room: Room, order: Sequence[int], rank_devices: DeviceRanking, max_steps: int,
                 backing_up: bool = True) -> tuple[list[int] | None, int, bool]:
    """(device of each item, or None when there is none; position in `order` of the deepest item reached;
    whether the search ran to its end, rather than out of `max_steps` placements). Without `backing_up`, the
    first dead end ends the search."""
    n = len(order)
    assignment = [-1] * n
    steps = 0
    deepest = 0

    # depth-first search with an explicit stack (no recursion): rankings[k] is the ranking of the
    # k-th item in `order`, made when the search first reached it; tried[k] how much of it is used
    rankings: list[Sequence[int]] = []
    tried: list[int] = []
    ranking_of, first_with_room, place = room.ranking, room.first_with_room, room.place
    k = 0
    while 0 <= k < n:
        t = order[k]
        if len(rankings) == k:  # reaching this item from the one before: rank its devices now
            if k > deepest:
                deepest = k
            rankings.append(ranking_of(t, rank_devices))
            tried.append(0)
        elif assignment[t] != -1:  # back from a dead end below: take this item off its device
            if not isinstance(rankings[k], list):  # a lazy ranking (by_least_load): its devices listed once
                rankings[k] = list(rankings[k])
            room.remove(t, assignment[t])
            assignment[t] = -1
        ranking = rankings[k]
        at = first_with_room(t, ranking, tried[k])
        if at < len(ranking):
            tried[k] = at + 1
            steps += 1
            if steps > max_steps:
                return None, deepest, False
            d = ranking[at]
            assignment[t] = d
            place(t, d)
            k += 1
        elif not backing_up:
            return None, deepest, True
        else:  # every device of the ranking tried: back up to the item before
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
    if len(state.load) < LAZY_RANKING_DEVICES:  # as Python numbers: the same values, read faster
        load, used = state.load.tolist(), state.used_bytes.tolist()
        if state.alike:  # load / 1.0 is the load
            return sorted(range(len(load)), key=lambda d: (load[d], used[d], d))
        speed = state.speed.tolist()
        return sorted(range(len(load)), key=lambda d: (load[d] / speed[d], used[d], d))
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
