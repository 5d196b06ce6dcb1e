"""Placing whole tables in a given order, each onto the device a ranking prefers.

Every sharder that assigns whole tables goes through `place_tables`: the first device of its ranking with
room, backing up depth-first from memory dead ends, so a plan is found whenever one exists within
`max_steps` and the plain greedy plan comes out where no dead end is met. Pinned tables go first; avoid
lists and groups hold whatever the ranking says. Details: docs/sharders.md, docs/clusters.md.
"""
from __future__ import annotations

import contextvars
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


# (table index, state) -> devices in order of preference
DeviceRanking = Callable[[int, PlacementState], Sequence[int]]


def place_tables(
    task: Task,
    order: Sequence[int],
    rank_devices: DeviceRanking,
    weights: Sequence[float] | np.ndarray | None = None,  # per table: a number, or a vector
    max_steps: int = DEFAULT_MAX_STEPS,
    patience: int = DEFAULT_PATIENCE,
) -> list[int]:
    """Device of each table (indexed like task.tables), placing tables in `order`; after `patience`
    placements without a plan, the search starts again with the largest tables first (ties in `order`),
    which packs tight memory in far fewer steps, within `max_steps` placements in all (unless
    `giving_up_early`: then it stops there)."""
    n = len(task.tables)
    if sorted(order) != list(range(n)):
        raise ValueError("order must list every table of the task exactly once")
    pinned = task.pinned_device()
    pins = {i: pinned[t.name] for i, t in enumerate(task.tables) if t.name in pinned}
    if pins:
        order = [t for t in order if t in pins] + [t for t in order if t not in pins]
    sizes = np.array([task.table_bytes(i) for i in range(n)], dtype=np.int64)
    capacity = np.array(task.capacities(), dtype=np.int64)
    _check_each_table_fits(task, sizes, capacity)
    if sizes.sum() > capacity.sum():
        raise InfeasibleTaskError(
            f"task {task.name!r}: tables need {sizes.sum() / GB:.3f} GB in total, "
            f"the {task.num_devices} devices hold {capacity.sum() / GB:.3f} GB"
        )
    _check_packing_bound(task, sizes, capacity)
    w = np.zeros(n) if weights is None else np.asarray(weights, dtype=np.float64)
    largest_first = sorted(order, key=lambda t: (t not in pins, -sizes[t]))  # stable: the given order breaks ties
    first_budget = max_steps if patience >= max_steps or list(order) == largest_first else patience
    restart = first_budget < max_steps and _RESTART.get()
    searches = [(list(order), first_budget)] + ([(largest_first, max_steps - first_budget)] if restart else [])
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
    allowed = [capacity[task.allowed_devices(t.name)].max() for t in task.tables]
    too_big = np.flatnonzero(sizes > np.asarray(allowed))
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
    depth-first search that would end in failure after `max_steps` into an immediate error."""
    order = np.sort(sizes[sizes > 0])[::-1]
    for count, size in enumerate(order, start=1):
        room = int(np.floor(capacity / size).sum())
        if count > room:
            raise InfeasibleTaskError(
                f"task {task.name!r}: {count} tables of at least {_size(int(size))} each, but the devices hold "
                f"at most {room} of them ({_capacities(task)})")


def _size(nbytes: int) -> str:
    return f"{nbytes / GB:.3f} GB" if nbytes >= GB // 1000 else f"{nbytes} bytes"


def by_least_load(t: int, state: PlacementState) -> list[int]:
    """Greedy ranking: smallest accumulated weight per unit of speed first (the weight itself when devices are
    alike), then least memory, then lowest index."""
    return sorted(range(len(state.load)), key=lambda d: (state.load[d] / state.speed[d], state.used_bytes[d], d))


def find_feasible_assignment(task: Task, max_steps: int = DEFAULT_MAX_STEPS) -> list[int]:
    """Any placement within memory (largest tables first, balancing bytes): a feasibility certificate."""
    sizes = [task.table_bytes(i) for i in range(len(task.tables))]
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    return place_tables(task, order, by_least_load, weights=sizes, max_steps=max_steps)


# ---------------------------------------------------------------- satisfiability


def check_satisfiable(task: Task) -> None:
    """Raise InfeasibleTaskError naming the constraints that no plan can satisfy together (each device's
    memory included); a task that passes may still be infeasible by memory, which placement reports."""
    caps = task.capacities()
    size = {t.name: task.shard_bytes(t) for t in task.tables}
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
        need = sum(size[t] for t in members)
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
