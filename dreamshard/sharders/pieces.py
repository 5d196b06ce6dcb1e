"""Tables larger than any device: cut into pieces that the sharders place as tables.

A table that fits no device it may use is cut into column slices first (outputs concatenated, slices go
anywhere), else into TorchRec's row-wise blocks (block i pinned to device i), and cut finer while the pieces
cannot be placed. `with_pieces` is the one place this happens: every sharder of ours plans through it, and
the plan maps pieces back to slices and row ranges of the user's tables. The rule: docs/sharders.md.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import TypeVar

from dreamshard.caching import CACHE_FILLS, choose_caching
from dreamshard.errors import DreamShardError, InfeasibleTaskError
from dreamshard.limits import MAX_PIECES
from dreamshard.memory import GB
from dreamshard.placement import check_satisfiable, giving_up_early, table_sizes
from dreamshard.plan import Plan, Shard, host_blocks, row_blocks, validate_plan
from dreamshard.sharders.replicas import data_parallel_tables, must_replicate, with_replicas
from dreamshard.tables import Table
from dreamshard.tasks import Task


@dataclass(frozen=True)
class Cut:
    """How one table is cut: `columns` slices (1: all columns), or row-wise over every device, or, with `host`,
    row-wise over the `per_host` devices of that host (TorchRec's table_row_wise, Task.per_host)."""

    columns: int = 1
    row_wise: bool = False
    host: int | None = None
    per_host: int = 0

    def __post_init__(self) -> None:
        if self.host is not None and not (self.row_wise and self.host >= 0 and self.per_host >= 1):
            raise ValueError(f"Cut: a host's row-wise blocks need row_wise, host >= 0 and per_host >= 1; got {self}")

    @property
    def whole(self) -> bool:
        return self.columns == 1 and not self.row_wise


WHOLE = Cut()


def column_widths(dim: int, k: int) -> list[int]:
    """k widths, multiples of 4 summing to dim, as even as possible (the first ones wider)."""
    units = dim // 4
    base, extra = divmod(units, k)
    return [4 * (base + (1 if i < extra else 0)) for i in range(k)]


def widest_column(dim: int, k: int) -> int:
    """max(column_widths(dim, k)) without building the list: 4 x ceil(units / k)."""
    return 4 * -(-(dim // 4) // k)


def fewest_slices(dim: int, fits: Callable[[int], bool], most: int | None = None) -> int | None:
    """The fewest k (2 <= k <= `most`, by default dim/4) column slices whose widest slice `fits`, None when even
    the narrowest do not.

    The widest slice shrinks as k grows, so a binary search over k finds it: logarithmic in dim, where trying
    every k in turn was quadratic (each try built the k widths)."""
    lo, hi = 2, dim // 4 if most is None else most
    if hi < lo or not fits(widest_column(dim, hi)):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(widest_column(dim, mid)):
            hi = mid
        else:
            lo = mid + 1
    return lo


def fits_row_wise(table: Table, task: Task) -> bool:
    if not task.allows(table.name, "row") or task.num_devices < 2 or table.name in task.avoided():
        return False  # TorchRec's row-wise blocks go to every device
    if table.rows < 2:
        return False  # one block, the whole table: nothing cut (and its buffers would be counted as a block's)
    return _blocks_fit(task, table, enumerate(row_blocks(table.rows, task.num_devices)))


def _blocks_fit(task: Task, table: Table, blocks: Iterable[tuple[int, tuple[int, int]]]) -> bool:
    """Does each row block (device, (start, end)) of `table` fit its device?"""
    return all(task.shard_bytes(table, end - start) <= task.capacity(d) for d, (start, end) in blocks)


def host_cuts(table: Table, task: Task) -> list[Cut]:
    """`table` row-wise over one host's devices (TorchRec's table_row_wise), one cut per host whose blocks fit its
    devices; none unless the task allows "host" for it and its devices name several hosts (Task.per_host)."""
    per_host = task.per_host()
    if per_host is None or not task.allows(table.name, "host") or table.rows < 2:
        return []
    banned = set(task.avoided().get(table.name, ()))
    out = []
    for h in range(task.num_devices // per_host):
        blocks = host_blocks(table.rows, per_host, h)
        if not any(d in banned for d, _ in blocks) and _blocks_fit(task, table, blocks):
            out.append(Cut(row_wise=True, host=h, per_host=per_host))
    return out


def _capacity(task: Task, table: str) -> int:
    """The largest capacity among the devices `table` may use."""
    return max(task.capacity(d) for d in task.allowed_devices(table))


def first_cut(table: Table, task: Task, capacity: int | None = None) -> Cut:
    """The rule of the module docstring: no cut when the table fits the largest device it may use (`capacity`:
    that device's capacity, when the caller knows it)."""
    capacity = _capacity(task, table.name) if capacity is None else capacity
    must_cut = not task.allows(table.name, "table") and task.num_devices > 1
    if must_cut and "row" in task.kinds_of(table.name):
        if fits_row_wise(table, task):  # its constraint allows row-wise alone (or beside data-parallel)
            return Cut(row_wise=True)
    elif must_cut and task.allows(table.name, "host"):  # its constraint allows table_row_wise alone
        fitting = host_cuts(table, task)
        if fitting:
            return fitting[0]
    elif task.shard_bytes(table) <= capacity:
        return WHOLE
    if table.name in task.never_cut():
        raise InfeasibleTaskError(f"task {task.name!r}: table {table.name!r} must stay whole (pinned, grouped or "
                                  f"whole) but fits on no device it may use (largest {capacity / GB:.3f} GB)")
    columns = task.max_slices(table)
    if columns > 1 and not must_cut:
        k = fewest_slices(table.dim, lambda width: task.shard_bytes(table, width=width) <= capacity, columns)
        if k is not None:
            return Cut(columns=k)
    if fits_row_wise(table, task):
        return Cut(row_wise=True)
    narrowest = min(column_widths(table.dim, columns)) if columns > 1 else table.dim
    row = task.shard_bytes(table, 1, narrowest)
    where = f"task {task.name!r}: table {table.name!r} ({table.rows} rows x {table.dim} dims, " \
            f"{task.shard_bytes(table) / GB:.3f} GB)"
    if row > capacity:
        raise InfeasibleTaskError(f"{where}: a single row of {narrowest} columns takes {row} bytes, more than any "
                                  f"device holds ({capacity} bytes, {capacity / GB:.3f} GB): no plan exists")
    tried = []
    if task.allows(table.name, "column"):
        tried.append(f"its narrowest column slices ({narrowest} columns) need "
                     f"{task.shard_bytes(table, width=narrowest) / GB:.3f} GB")
    if task.allows(table.name, "row") and task.num_devices > 1:
        block = row_blocks(table.rows, task.num_devices)[0]
        tried.append(f"its row-wise blocks ({block[1]} rows on each device) need "
                     f"{task.shard_bytes(table, block[1]) / GB:.3f} GB")
    reason = "; ".join(tried) if tried else f"the sharding kinds ({', '.join(task.kinds_of(table.name))}) allow " \
                                            "no cut"
    raise InfeasibleTaskError(f"{where} fits on no device (largest {capacity / GB:.3f} GB): {reason}; "
                              "no plan exists")


def finer(table: Table, task: Task, cut: Cut) -> Cut | None:
    """The next finer cut of `table` after `cut` (module docstring), None when there is none."""
    if cut.row_wise:
        return None
    units = task.max_slices(table)
    if cut.columns < units:
        k = min(units, 2 * cut.columns)
        return Cut(columns=k)
    if fits_row_wise(table, task):
        return Cut(row_wise=True)
    return None


# a piece's place in its table: (table name, row_start, row_end or None for all rows, col_start, col_end)
PieceOf = tuple[str, int, "int | None", int, int]


def table_pieces(table: Table, cut: Cut, num_devices: int) -> list[tuple[Table, PieceOf, int | None]]:
    """The pieces `cut` makes of `table` in order, each as a table of its own, with its place in `table` and the
    device a row-wise block is pinned to (None for a column slice); `table` itself when whole."""
    if cut.whole:
        return [(table, (table.name, 0, None, 0, table.dim), None)]
    if cut.row_wise:
        blocks = enumerate(row_blocks(table.rows, num_devices)) if cut.host is None else \
            host_blocks(table.rows, cut.per_host, cut.host)
        return [(table.block(start, end),  # named "<table>[rows start:end]"
                 (table.name, start, end, 0, table.dim), device)
                for device, (start, end) in blocks]
    out: list[tuple[Table, PieceOf, int | None]] = []
    start = 0
    for width in column_widths(table.dim, cut.columns):
        out.append((replace(table, name=f"{table.name}[cols {start}:{start + width}]", dim=width),
                    (table.name, 0, None, start, start + width), None))
        start += width
    return out


def cut_task(task: Task, cuts: dict[str, Cut]) -> tuple[Task, dict[str, PieceOf]]:
    """The task with each table cut as `cuts` says (absent: whole), and piece name -> its place in its table."""
    tables: list[Table] = []
    pieces: dict[str, PieceOf] = {}
    pins: list[tuple[str, int]] = []
    for t in task.tables:
        cut = cuts.get(t.name, WHOLE)
        if cut.whole:
            tables.append(t)
            continue
        for piece, place, device in table_pieces(t, cut, task.num_devices):
            pieces[piece.name] = place
            tables.append(piece)
            if device is not None:
                pins.append((piece.name, device))
    if not pieces:
        return task, {}
    return task.derived(tables, {name: p[0] for name, p in pieces.items()}, pins), pieces


def first_cuts(task: Task, sizes: Sequence[int] | None = None) -> dict[str, Cut]:
    """`first_cut` of every table of `task` (`sizes`: each table's bytes, when the caller has them), in one pass
    over the devices: per table only for tables pinned or with an avoid list."""
    largest = max(task.capacities())
    limited = set(task.pinned_device()) | set(task.avoided())
    cuts = {}
    count = 0  # pieces so far: a task past MAX_PIECES is refused as soon as it is, not after every table
    for i, t in enumerate(task.tables):
        capacity = _capacity(task, t.name) if t.name in limited else largest
        # first_cut's first case, told from the size: a table that may stay whole and fits is not cut
        whole = task.num_devices == 1 or task.allows(t.name, "table")
        fits = whole and sizes is not None and sizes[i] <= capacity
        cuts[t.name] = cut = WHOLE if fits else first_cut(t, task, capacity)
        count += num_pieces(cut, task.num_devices)
        if count > MAX_PIECES:
            check_pieces(task, count, partial=i + 1 < len(task.tables))
    return cuts


def cut_oversized(task: Task) -> tuple[Task, dict[str, PieceOf]]:
    """The task with every table too large for any device cut by the first rule; the task itself when none is."""
    return cut_task(task, first_cuts(task))


def merge_pieces(task: Task, plan: Plan, pieces: Mapping[str, PieceOf]) -> Plan:
    """The plan of a cut task (`task`) as a plan of the user's tables: each piece back to its block."""
    piece_rows = {t.name: t.rows for t in task.tables}
    shards = []
    for s in plan.shards:
        if s.table not in pieces:
            shards.append(s)
            continue
        table, r0, r1, c0, _ = pieces[s.table]
        if r1 is None and not s.is_row_range:  # a column slice, all rows
            shards.append(Shard(table, s.device, c0 + s.col_start, c0 + s.col_end))
        else:
            p0, p1 = s.rows(piece_rows[s.table])
            shards.append(Shard(table, s.device, c0 + s.col_start, c0 + s.col_end, r0 + p0, r0 + p1))
    return Plan(plan.num_devices, tuple(shards))


def with_pieces(task: Task, shard_whole: Callable[[Task], Plan]) -> Plan:
    """`shard_whole`'s plan for `task`, its oversized tables cut into pieces first, cut finer while
    the pieces cannot be placed (see the module); when the task allows "data", its small tables data-parallel
    first (sharders/replicas.py), unless what their copies leave of the devices cannot hold the others; when the
    task's kernels allow UVM caching and its tables need more than the devices hold, the largest cached
    (dreamshard.caching)."""
    replicated = data_parallel_tables(task)
    forced = must_replicate(task)
    if replicated:
        try:
            return with_replicas(task, replicated, lambda rest: _with_caching(rest, shard_whole))
        except InfeasibleTaskError:
            if not forced or len(forced) == len(replicated):
                if forced:
                    raise
                # the copies leave too little: every table model-parallel, as below
            else:  # those whose constraints ask for it alone
                return with_replicas(task, forced, lambda rest: _with_caching(rest, shard_whole))
    return _with_caching(task, shard_whole)


def _with_caching(task: Task, shard_whole: Callable[[Task], Plan]) -> Plan:
    """The plan with the tables `choose_caching` picks kept in host memory, UVM-cached (each shard says its load
    factor), when the task's kernels allow it and no plan keeps every table in device memory."""
    error: InfeasibleTaskError | None = None
    if not task.must_cache:  # all in device memory when it fits
        try:
            return _with_pieces(task, shard_whole)
        except InfeasibleTaskError as exc:
            error = exc
    tried: list[dict[str, float]] = []
    for fill in CACHE_FILLS:  # more in host memory while what stays in device memory does not pack
        factors = choose_caching(task, fill)  # none when the kernels do not allow caching
        if not factors or factors in tried:
            continue
        tried.append(factors)
        cached = replace(task, tables=tuple(replace(t, cache_load_factor=factors[t.name]) if t.name in factors
                                            else t for t in task.tables))
        try:
            plan = _with_pieces(cached, shard_whole)
        except InfeasibleTaskError as exc:
            error = exc
            continue
        plan = Plan(plan.num_devices, tuple(replace(s, cache=factors[s.table]) if s.table in factors else s
                                            for s in plan.shards))
        validate_plan(task, plan)
        return plan
    raise error or InfeasibleTaskError(f"task {task.name!r}: no table may be UVM-cached")


# `_with_pieces` cuts one piece finer per pass for SINGLE_CUT_PASSES passes, or for as many passes as keep passes x
# pieces within SINGLE_CUT_WORK where that is more (small tasks); after them each pass cuts as many pieces as the
# passes before it together, so that a task needing many cuts takes logarithmically many passes (each a packing
# check of every piece), not one per cut: quadratic in the tables
SINGLE_CUT_PASSES = 16
SINGLE_CUT_WORK = 20_000


def _with_pieces(task: Task, shard_whole: Callable[[Task], Plan]) -> Plan:
    check_satisfiable(task)
    sizes = table_sizes(task).tolist()
    cuts = first_cuts(task, sizes)
    need, have = sum(sizes), sum(task.capacities())
    if need > have:  # no cut makes tables smaller
        hint = "" if "fused_uvm_caching" in task.kernels else \
            " (allow the fused_uvm_caching kernel to keep the largest tables in host memory, cached)"
        raise InfeasibleTaskError(f"task {task.name!r}: tables need {need / GB:.3f} GB in total, "
                                  f"the {task.num_devices} devices hold {have / GB:.3f} GB{hint}")

    # the cut tables of each coarser cut whose search in the sharder's order stopped early: only those kept (a
    # whole task per level would hold every level's pieces at once), the cut task rebuilt if it is searched again
    stopped: list[dict[str, Cut]] = []

    def place(cut: Task, pieces: dict[str, PieceOf]) -> Plan:
        plan = shard_whole(cut)
        if pieces:
            validate_plan(cut, plan)  # the pieces as placed: row-wise blocks on their pinned devices
            plan = merge_pieces(cut, plan, pieces)
            validate_plan(task, plan)
        return plan

    def attempt(first: bool, last: bool) -> Plan | None:
        cut, pieces = cut_task(task, cuts)
        if pieces and not last and not packs(cut):
            return None  # too coarse to pack quickly: cut finer before the sharder tries
        try:
            # a search in the sharder's order that runs long: cut finer instead; at the last cut, placements may
            # start again largest first
            with giving_up_early() if not last else nullcontext():
                return place(cut, pieces)
        except InfeasibleTaskError:
            if not last:
                stopped.append({name: c for name, c in cuts.items() if not c.whole})
                return None
            # finer is not always easier (row-wise blocks are pinned, one on every device): before saying no plan
            # exists, search the coarser cuts given up early in full, the finest first
            for coarser in reversed(stopped):
                try:
                    return place(*cut_task(task, {name: coarser.get(name, WHOLE) for name in cuts}))
                except InfeasibleTaskError:
                    continue
            raise

    return refine(task, cuts, attempt, singly=max(SINGLE_CUT_PASSES, SINGLE_CUT_WORK // len(task.tables)))


R = TypeVar("R")


def refine(task: Task, cuts: dict[str, Cut], attempt: Callable[[bool, bool], R | None],
           singly: int | None = None) -> R:
    """The one cut-finer-while-it-does-not-pack loop: `attempt(first, last)` at `cuts` as they stand (`first`: none
    cut finer yet; `last`: none can be), its result returned where not None; else the table with the largest piece
    is cut finer (`Refinable`, in `cuts`) and `attempt` asked again. At the last cut `attempt` returns or raises.
    `singly`: passes that cut one table each, after which each pass cuts as many as the passes before it together
    (SINGLE_CUT_PASSES); None: one table a pass throughout. A cut task of more than MAX_PIECES pieces is refused."""
    refinable = Refinable(task, cuts)
    refined = 0  # pieces cut finer so far
    count = sum(num_pieces(c, task.num_devices) for c in cuts.values())
    check_pieces(task, count)
    first = True
    while True:
        last = refinable.last  # no finer cut is left
        found = attempt(first, last)
        if found is not None:
            return found
        if last:
            raise InfeasibleTaskError(f"task {task.name!r}: no cut of its tables packs into device memory")
        for _ in range(1 if singly is None else max(1, refined + 1 - singly)):
            name = refinable.top()
            if name is None:
                break
            before = num_pieces(cuts[name], task.num_devices)
            refinable.pop()
            count += num_pieces(cuts[name], task.num_devices) - before
            check_pieces(task, count)
            refined += 1
        first = False


def num_pieces(cut: Cut, num_devices: int) -> int:
    """How many pieces `cut` makes of a table."""
    return (num_devices if cut.host is None else cut.per_host) if cut.row_wise else cut.columns


def check_pieces(task: Task, count: int, partial: bool = False) -> None:
    """Refuse a cut task of more than MAX_PIECES tables and pieces: a one-line error, before placing them
    (`partial`: `count` is of the tables cut so far)."""
    if count > MAX_PIECES:
        raise DreamShardError(f"task {task.name!r}: {len(task.tables)} tables cut into {'at least ' * partial}"
                              f"{count} pieces, more than "
                              f"{MAX_PIECES}, the most this tool places (dreamshard.limits); plan fewer tables or "
                              "devices, or give the devices more memory")


FEASIBILITY_STEPS = 20_000  # placements the quick packing check tries before a cut counts as too coarse
FEASIBILITY_STEPS_PER_TABLE = 2  # and at least this many per piece, for large tasks


def packs(task: Task) -> bool:
    """Whether a plain packing (largest pieces first, least-used device) places the cut task within
    FEASIBILITY_STEPS placements (FEASIBILITY_STEPS_PER_TABLE per piece where that is more): the sharders' own
    searches, slower per step, are tried only then."""
    from dreamshard.placement import find_feasible_assignment

    try:
        find_feasible_assignment(task, max_steps=max(FEASIBILITY_STEPS, FEASIBILITY_STEPS_PER_TABLE * len(task.tables)))
    except InfeasibleTaskError:
        return False
    return True


class Refinable:
    """The tables that can be cut finer, by the size of their largest piece: `pop` cuts the one whose largest piece
    is largest (the first of equals; in `cuts`, in place), in logarithmic time."""

    def __init__(self, task: Task, cuts: dict[str, Cut]) -> None:
        self.task, self.cuts = task, cuts
        self.tables: dict[str, tuple[int, Table]] = {}
        self.heap: list[tuple[int, int, str]] = []
        if {"column", "row"} & set(task.sharding):  # else no table can be cut
            self.tables = {t.name: (i, t) for i, t in enumerate(task.tables)}
            uncut = task.never_cut()
            entries = (self._entry(t.name) for t in task.tables if t.name not in uncut)
            self.heap = [e for e in entries if e is not None]
            heapq.heapify(self.heap)

    def _entry(self, name: str) -> tuple[int, int, str] | None:
        """(minus the size of its largest piece, its index, its name): the heap's order."""
        i, t = self.tables[name]
        cut = self.cuts[name]
        if finer(t, self.task, cut) is None:
            return None
        return -self.task.shard_bytes(t, width=widest_column(t.dim, cut.columns)), i, name

    @property
    def last(self) -> bool:
        """No table can be cut finer."""
        return not self.heap

    def top(self) -> str | None:
        """The table `pop` cuts next, None when none can be."""
        return self.heap[0][2] if self.heap else None

    def pop(self) -> tuple[str, Cut] | None:
        """Cut the table with the largest piece among those that can be cut finer: (its name, its new cut)."""
        if not self.heap:
            return None
        _, _, name = heapq.heappop(self.heap)
        nxt = finer(self.tables[name][1], self.task, self.cuts[name])
        assert nxt is not None
        self.cuts[name] = nxt
        entry = self._entry(name)
        if entry is not None:
            heapq.heappush(self.heap, entry)
        return name, nxt
