"""`torchrec_model`: our search over cuts and placements, rating plans by TorchRec's own perf model.

For a user with no trained cost model, TorchRec's analytic `EmbeddingPerfEstimator` is the estimate TorchRec's
planner already trusts; this sharder optimises that same rating with a wider search than TorchRec's proposers:
every table whole, in 2, 4, ... column slices or row-wise (the cuts `dreamshard_cut` tries, `cuts.cut_options`),
and, where the task allows "host", row-wise over the devices of each one host (`pieces.host_cuts`),
with or without the shared data-parallel rule (sharders/replicas.py). TorchRec rates a plan by its slowest rank,
the sum of its shards' estimates, and a shard's estimate does not depend on what else its rank holds; so each
table's pieces are priced once per cut (one TorchRec call per cut), and the search is placement only:

1. two starts: every table whole (one too large for a device at its first cut, cut finer while the pieces do
   not pack: `pieces`' rule), and TorchRec's usual layout (every table row-wise that may be); on devices of
   several hosts a third, TorchRec's layout there (every table row-wise over one host's devices, table_row_wise);
2. a plan of given cuts: the pieces largest estimate first (else largest in bytes first) onto the least-loaded
   device with room (`place_tables`' rule, in one pass; `place_tables` itself, backing up, for the starts);
3. moves: each other cut of the `candidates` costliest tables on the slowest rank, and of the `candidates`
   tables whose pieces add the most work over their cheapest cut; step to the move with the lowest slowest
   rank plus mean rank (`_score`), at most `depth` steps; return the plan with the lowest slowest rank seen.

It is TorchRec's model, not a measurement: a plan it rates faster is faster by that model. Tasks whose tables do
not fit in device memory (UVM caching) are planned through `with_pieces`, like every other sharder.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dreamshard.errors import InfeasibleTaskError
from dreamshard.placement import Rules, by_least_load, find_feasible_assignment, place_items, place_tables
from dreamshard.plan import Plan, Shard, validate_plan
from dreamshard.sharders.pieces import (
    Cut,
    cut_task,
    first_cut,
    first_cuts,
    fits_row_wise,
    host_cuts,
    merge_pieces,
    packs,
    refine,
    table_pieces,
    with_pieces,
)
from dreamshard.sharders.replicas import data_parallel_tables, must_replicate, with_replicas
from dreamshard.tables import Table
from dreamshard.tasks import Task


@dataclass(frozen=True)
class ModelSearchConfig:
    depth: int = 64  # moves at most
    candidates: int = 4  # tables of each kind whose other cuts are tried per move (module docstring, step 3)
    max_slices: int = 32  # most column slices of one table

    def __post_init__(self) -> None:
        for name, least in (("depth", 0), ("candidates", 1), ("max_slices", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"torchrec_model: {name}: expected an integer >= {least}, got {value!r}")


def _cuts_of(task: Task, config: ModelSearchConfig) -> dict[str, list[Cut]]:
    """Table name -> the cuts tried for it, whole first (cuts.cut_options, with its row and column rules)."""
    from dreamshard.sharders.cuts import CutConfig, as_cut, cut_options

    rule = CutConfig(max_slices=config.max_slices, host_wise=False)  # its host cuts: added below, as Cut
    return {t.name: [as_cut(k) for k in cut_options(task, t, rule)]
            + ([] if t.name in task.never_cut() else host_cuts(t, task)) for t in task.tables}


def _slices(table: Table, cut: Cut, num_devices: int) -> list[Shard]:
    """The blocks of `table` at `cut` (`table_pieces`), on the devices TorchRec's layout puts them: a row-wise
    block on its device, column slices on devices 0, 1, ... (a shard's estimate ignores its device)."""
    return [Shard(table.name, j if device is None else device, c0, c1, r0, r1)
            for j, (_, (_, r0, r1, c0, c1), device) in enumerate(table_pieces(table, cut, num_devices))]


PriceMemo = dict[tuple[Table, Cut, int], list[float]]  # (table, cut, devices) -> its pieces' prices


def piece_prices(task: Task, options: dict[str, list[Cut]], batch_size: int,
                 memo: PriceMemo | None = None, topo=None) -> dict[tuple[str, Cut], list[float]]:
    """(table, cut) -> TorchRec's estimate (ms, fwd + bwd, compute + comms) of each of its pieces, in
    `table_pieces` order: one TorchRec call per distinct cut, every table at that cut where it has it. A shard's
    estimate depends on its table, its cut and the ranks alone, so `memo` keeps them across the searches of one
    plan (with and without data-parallel tables), each priced once. `topo`: TorchRec's topology of the task
    (default: `topology(task)`)."""
    from dreamshard.interop.torchrec import quiet_torchrec, shard_estimates

    memo = {} if memo is None else memo
    n = task.num_devices
    caches = {t.name: t.cache_load_factor for t in task.tables if t.cache_load_factor is not None}
    by_name = {t.name: t for t in task.tables}
    distinct = list(dict.fromkeys(c for cuts in options.values() for c in cuts))
    with quiet_torchrec():
        for cut in distinct:
            layout = {t.name: cut if cut in options[t.name] and (t, cut, n) not in memo else None
                      for t in task.tables}
            if all(c is None for c in layout.values()):
                continue
            slices = {t.name: _slices(t, layout[t.name] or Cut(), n) for t in task.tables}
            for option in shard_estimates(task, slices, batch_size, caches, topo):
                if layout[option.name] == cut:
                    memo[(by_name[option.name], cut, n)] = [float(s.perf.total) for s in option.shards]
    return {(t.name, cut): memo[(t, cut, n)] for t in task.tables for cut in options[t.name]}


def _first_fit(task: Task) -> dict[str, Cut]:
    """The start: every table whole, or at its first cut when too large for a device (`pieces.first_cut`), cut
    finer (`pieces.refine`, one table at a time) while a plain packing does not place the pieces; raises when none
    does. A direct pass decides at each cut (`_packs_directly`), the placement that backs up at the first and the
    last only."""
    cuts = first_cuts(task)
    rules = Rules.of_task(task)

    def attempt(first: bool, last: bool) -> dict[str, Cut] | None:
        # the first and the last cut: the packing every sharder's placement backs up to (slower), before cutting
        # finer or giving up
        if _packs_directly(task, rules, cuts) or ((first or last) and _packs_fully(task, cuts)):
            return {n: c for n, c in cuts.items() if not c.whole}
        if last:
            raise InfeasibleTaskError(f"task {task.name!r}: no cut of its tables packs into device memory "
                                      f"({_cut_names(cuts)})")
        return None

    return refine(task, cuts, attempt)


def _packs_fully(task: Task, cuts: dict[str, Cut]) -> bool:
    try:
        find_feasible_assignment(cut_task(task, cuts)[0])
    except InfeasibleTaskError:
        return False
    return True


def _packs_directly(task: Task, rules: Rules, cuts: dict[str, Cut]) -> bool:
    """Does one pass, largest piece first onto the least-used device with room (`_direct_pass` by size), place
    the pieces at `cuts`? Linear in the pieces, where `packs` backs up for thousands of steps before it fails."""
    if rules.group:  # left to place_tables
        return packs(cut_task(task, cuts)[0])
    layouts = {(t.name, cut): _layout(task, t, cut) for t in task.tables for cut in [cuts.get(t.name, Cut())]}
    sizes = [float(b) for piece_bytes, _ in layouts.values() for b in piece_bytes]  # in the tables' order
    return _direct_pass(task, rules, cuts, sizes, layouts, by_size=(True,)) is not None


def _row_wise_start(task: Task) -> dict[str, Cut]:
    """The other start: TorchRec's usual layout, every table that may be cut row-wise (the rest whole or at its
    first cut), from which the search takes tables back whole or into column slices."""
    uncut = task.never_cut()
    cuts = {t.name: Cut(row_wise=True) if t.name not in uncut and fits_row_wise(t, task) else first_cut(t, task)
            for t in task.tables}
    return {n: c for n, c in cuts.items() if not c.whole}


def _host_start(task: Task) -> dict[str, Cut] | None:
    """The start across hosts (None on one host): TorchRec's usual layout there, every table that may be row-wise
    over one host's devices (table_row_wise), largest first onto the host with the fewest bytes so far whose
    devices hold its blocks; the rest whole or at their first cut."""
    if task.per_host() is None:
        return None
    uncut = task.never_cut()
    held: dict[int, int] = {}
    cuts: dict[str, Cut] = {}
    for t in sorted(task.tables, key=lambda t: (-task.shard_bytes(t), t.name)):
        fitting = [] if t.name in uncut else host_cuts(t, task)
        if fitting:
            cut = min(fitting, key=lambda c: (held.get(c.host or 0, 0), c.host))
            held[cut.host or 0] = held.get(cut.host or 0, 0) + task.shard_bytes(t)
            cuts[t.name] = cut
        else:
            cuts[t.name] = first_cut(t, task)
    return {n: c for n, c in cuts.items() if not c.whole}


TARGET_STEPS = 24  # targets tried by _target_start, from the bound up in steps of TARGET_STEP
TARGET_STEP = 0.04


def rating_bound(num_devices: int, layouts: list[list[list[float]]]) -> float:
    """No placement of tables, each in one of its layouts (`layouts`: per table, per layout, its pieces' prices),
    is rated below this (ms): the slowest rank holds at least the mean of every rank's sum, so at least the cheapest
    total of each table over the ranks, and at least the dearest table's cheapest largest piece. Memory is left
    out, so it may be below every plan that fits."""
    totals = sum(min(sum(p) for p in table) for table in layouts)
    largest = max((min(max(p) for p in table) for table in layouts), default=0.0)
    return max(totals / num_devices, largest)


def _placeable(task: Task, options: dict[str, list[Cut]], layouts: dict[tuple[str, Cut], _Layout]
               ) -> dict[str, list[Cut]]:
    """Each table's cuts whose every piece fits the largest device: the only ones a placement may use."""
    capacity = max(task.capacities())
    return {n: [c for c in cuts if max(layouts[(n, c)][0]) <= capacity] for n, cuts in options.items()}


def _target_start(task: Task, rules: Rules, options: dict[str, list[Cut]],
                  prices: dict[tuple[str, Cut], list[float]], layouts: dict[tuple[str, Cut], _Layout]
                  ) -> dict[str, Cut] | None:
    """A start aimed at a slowest rank of T: each table at its cheapest cut in total among those whose largest
    piece costs at most T, placed as every move is (`_place`), for T from `rating_bound` up in steps; the cuts of
    the best placed. Where every start above cuts tables one way, this one weighs each table's total against
    its largest piece."""
    usable = _placeable(task, options, layouts)
    if any(not cuts for cuts in usable.values()):
        return None
    bound = rating_bound(task.num_devices, [[prices[(n, c)] for c in cuts] for n, cuts in usable.items()])
    best: _Placed | None = None
    seen: set[tuple[tuple[str, Cut], ...]] = set()
    for step in range(TARGET_STEPS):
        target = bound * (1 + TARGET_STEP * step)
        cuts = {}
        for n, cands in usable.items():
            within = [c for c in cands if max(prices[(n, c)]) <= target] or cands
            cuts[n] = min(within, key=lambda c: (sum(prices[(n, c)]), max(prices[(n, c)])))
        key = tuple(sorted((n, c) for n, c in cuts.items() if not c.whole))
        if key in seen:
            continue
        seen.add(key)
        placed = _place(task, rules, dict(key), prices, layouts)
        if placed is not None and (best is None or placed.cost < best.cost):
            best = placed
    return None if best is None else best.cuts


def _cut_name(c: Cut) -> str:
    if c.row_wise:
        return "row-wise" if c.host is None else f"row-wise on host {c.host}"
    return f"{c.columns} column slices"


def _cut_names(cuts: dict[str, Cut]) -> str:
    shown = [f"{n}: {_cut_name(c)}" for n, c in cuts.items() if not c.whole]
    return ", ".join(shown) or "every table whole"


@dataclass
class _Placed:
    cost: float  # TorchRec's rating: the slowest rank's sum of estimates
    cuts: dict[str, Cut]
    load: np.ndarray  # per device, its sum of estimates
    assignment: list[int]  # device of each piece, in cut_task's order

    def plan(self, task: Task) -> Plan:
        cut, pieces = cut_task(task, self.cuts)
        plan = Plan.from_assignment(cut, self.assignment)
        return merge_pieces(cut, plan, pieces) if pieces else plan


def _score(p: _Placed) -> float:
    """What the descent lowers: the slowest rank plus the mean rank. The slowest alone cannot take a table from
    row-wise to whole (its one rank grows by more than each rank's block saved) until every rank has done so."""
    return p.cost + float(p.load.mean())


class TorchRecModelSharder:
    """The search of the module docstring."""

    name = "torchrec_model"

    def __init__(self, batch_size: int | None = None, config: ModelSearchConfig | None = None,
                 time_limit: float | None = None, links: Any = None, hbm_gbps: float | None = None,
                 torchrec_topology: Any = None) -> None:
        self.batch_size = batch_size  # the global batch (TorchRec is given it per rank); None: the task's memory's
        self.config = config or ModelSearchConfig()
        self.time_limit = time_limit  # seconds: the moves stop there, keeping the best plan found (None: no limit)
        # the cluster TorchRec's perf model rates plans on: the hosts and bandwidths of TorchRec's own Topology
        # (DreamShardPlanner's), else our links (hardware.topology.Topology) and hbm_gbps, else TorchRec's defaults
        self.links, self.hbm_gbps, self.torchrec_topology = links, hbm_gbps, torchrec_topology

    def _topo(self, task: Task):
        from dreamshard.interop.torchrec import topology, topology_from

        if self.torchrec_topology is not None:
            return topology_from(task, self.torchrec_topology)
        return topology(task, self.links, self.hbm_gbps) if self.links or self.hbm_gbps else None

    def _batch(self, task: Task) -> int:
        from dreamshard.interop.torchrec import torchrec_batch

        return torchrec_batch(task, self.batch_size)

    def shard(self, task: Task) -> Plan:
        from dreamshard.interop.torchrec import torchrec_perf_estimate

        memo: PriceMemo = {}
        deadline = float("inf") if self.time_limit is None else time.perf_counter() + self.time_limit

        def search(t: Task) -> Plan:
            return self._search(t, memo, deadline)

        if task.must_cache:  # tables whose kernels allow UVM caching alone: cached as every sharder's are
            return with_pieces(task, search)
        plans = []
        replicated, forced = data_parallel_tables(task), must_replicate(task)
        # the shared data-parallel rule, none (those whose constraints ask for data-parallel alone), and those
        # TorchRec's model rates cheaper as copies than in any cut of theirs
        choices = [replicated] if replicated else []
        if forced != replicated or not choices:
            choices.append(forced)
        priced = self._priced_replicas(task, memo)
        if priced and all(set(map(id, priced)) != set(map(id, c)) for c in choices):
            choices.append(priced)
        for chosen in choices:
            try:
                plans.append(with_replicas(task, chosen, search) if chosen else search(task))
            except InfeasibleTaskError:
                continue
        if not plans:  # tables beyond device memory: cut and cached as every sharder's are
            return with_pieces(task, search)
        batch, topo = self._batch(task), self._topo(task)
        return min(plans, key=lambda p: torchrec_perf_estimate(task, p, batch, topo).cost_ms)

    def bound_ms(self, task: Task) -> float:
        """No plan of the layouts this search tries (`_cuts_of`, data-parallel copies) is rated below this by
        TorchRec's model (ms): `rating_bound` over each table's cuts whose every piece fits the largest device, and
        its copies where one fits every device. Memory beyond that is left out."""
        options = _cuts_of(task, self.config)
        prices = piece_prices(task, options, self._batch(task), {}, self._topo(task))
        usable = _placeable(task, options, {(t.name, c): _layout(task, t, c) for t in task.tables
                                            for c in options[t.name]})
        layouts = {name: [prices[(name, c)] for c in cuts] for name, cuts in usable.items()}
        copies: set[str] = set()
        if "data" in task.sharding and task.num_devices > 1:
            copies = {t.name for t in task.tables if task.allows(t.name, "data") and not t.sequence
                      and task.shard_bytes(t, replica=True) <= min(task.capacities())}
        for name, copy_prices in self._copy_prices(task, copies).items():
            layouts[name].append(copy_prices)
        return rating_bound(task.num_devices, list(layouts.values()))

    def _copy_prices(self, task: Task, names: set[str]) -> dict[str, list[float]]:
        """Table name -> TorchRec's estimate of each of its data-parallel copies (ms, one per rank), for `names`, in
        one TorchRec call."""
        from dreamshard.interop.torchrec import quiet_torchrec, shard_estimates
        from dreamshard.sharders.replicas import replica_shards

        if not names:
            return {}
        slices = {t.name: replica_shards(t, task.num_devices) if t.name in names else _slices(t, Cut(), task.num_devices)
                  for t in task.tables}
        with quiet_torchrec():
            estimated = shard_estimates(task, slices, self._batch(task), None, self._topo(task))
        return {o.name: [float(s.perf.total) for s in o.shards] for o in estimated if o.name in names}

    def _priced_replicas(self, task: Task, memo: PriceMemo) -> list[Table]:
        """`data_parallel_tables` with TorchRec's model as the rule: the tables it rates cheaper data-parallel (summed
        over the ranks) than at the cheapest of their cuts (UVM-cached tables never)."""
        if "data" not in task.sharding or task.num_devices < 2:
            return must_replicate(task)
        options = _cuts_of(task, self.config)
        prices = piece_prices(task, options, self._batch(task), memo, self._topo(task))
        copies = self._copy_prices(task, {t.name for t in task.tables if task.allows(t.name, "data")
                                          and not t.sequence and t.cache_load_factor is None})

        def cheaper(_: Task, t: Table) -> bool:
            return t.name in copies and sum(copies[t.name]) < min(sum(prices[(t.name, c)]) for c in options[t.name])

        return data_parallel_tables(task, cheaper)

    def rating_ms(self, task: Task, plan: Plan) -> float:
        """`plan` as TorchRec's perf model rates it on this sharder's cluster (ms; a model's estimate)."""
        from dreamshard.interop.torchrec import torchrec_perf_estimate

        return torchrec_perf_estimate(task, plan, self._batch(task), self._topo(task)).cost_ms

    def _search(self, task: Task, memo: PriceMemo | None = None, deadline: float = float("inf")) -> Plan:
        options = _cuts_of(task, self.config)
        across = _host_start(task)
        starts = [_first_fit(task), _row_wise_start(task)] + ([] if across is None else [across])
        for start in starts:
            for name, cut in start.items():
                if cut not in options[name]:
                    options[name].append(cut)
        prices = piece_prices(task, options, self._batch(task), memo, self._topo(task))
        layouts = {(t.name, cut): _layout(task, t, cut) for t in task.tables for cut in options[t.name]}
        rules = Rules.of_task(task)
        target = _target_start(task, rules, options, prices, layouts)
        if target is not None:
            starts.append(target)
        ends = [self._descend(task, rules, start, options, prices, layouts, deadline) for start in starts]
        found = [e for e in ends if e is not None]
        if not found:
            raise InfeasibleTaskError(f"task {task.name!r}: torchrec_model found no placement of its tables at "
                                      f"the cuts that pack ({_cut_names(starts[0])})")
        plan = min(found, key=lambda p: p.cost).plan(task)
        validate_plan(task, plan)
        return plan

    def _descend(self, task: Task, rules: Rules, start: dict[str, Cut], options: dict[str, list[Cut]],
                 prices: dict[tuple[str, Cut], list[float]], layouts: dict[tuple[str, Cut], _Layout],
                 deadline: float = float("inf")) -> _Placed | None:
        """Step 3 of the module docstring from `start`, no move after `deadline`: the plan TorchRec rates best
        among those placed."""
        current = _place(task, rules, start, prices, layouts, backing_up=True)
        if current is None:
            return None
        best = current
        for _ in range(self.config.depth):
            if time.perf_counter() > deadline:
                break
            tried = [p for p in (_place(task, rules, cuts, prices, layouts)
                                 for cuts in self._moves(current, options, prices)) if p is not None]
            best = min([best, *tried], key=lambda p: p.cost)
            step = min(tried, key=_score, default=None)
            if step is None or _score(step) >= _score(current) * (1 - 1e-9):
                break
            current = step
        return best

    def _moves(self, at: _Placed, options: dict[str, list[Cut]],
               prices: dict[tuple[str, Cut], list[float]]) -> list[dict[str, Cut]]:
        """The cuts one change away: each other cut of the costliest tables on the slowest rank, and of the tables
        whose pieces add the most work over their cheapest cut."""
        def cut_of(name: str) -> Cut:
            return at.cuts.get(name, Cut())

        slowest = int(at.load.argmax())
        on_it: dict[str, float] = {}
        i = 0
        for name in options:  # pieces in cut_task's order: each table's pieces in turn
            piece_prices = prices[(name, cut_of(name))]
            if slowest in at.assignment[i:i + len(piece_prices)]:
                on_it[name] = max(piece_prices)
            i += len(piece_prices)
        excess = {n: sum(prices[(n, cut_of(n))]) - min(sum(prices[(n, c)]) for c in cuts)
                  for n, cuts in options.items()}
        k = self.config.candidates
        names = sorted(on_it, key=lambda n: -on_it[n])[:k] + [n for n in sorted(excess, key=lambda n: -excess[n])[:k]
                                                                 if excess[n] > 0]
        out = []
        for name in dict.fromkeys(names):
            for cut in options[name]:
                if cut != cut_of(name):
                    cuts = {**at.cuts, name: cut}
                    out.append({n: c for n, c in cuts.items() if not c.whole})
        return out


_Layout = tuple[list[int], list["int | None"]]  # a table's pieces at one cut: bytes of each, the device of a row-wise block


def _layout(task: Task, table: Table, cut: Cut) -> _Layout:
    """`table`'s pieces at `cut` (`table_pieces`): the bytes of each as `cut_task` counts them, and the device a
    row-wise block is pinned to (None for the others)."""
    pieces = table_pieces(table, cut, task.num_devices)
    return [task.shard_bytes(p) for p, _, _ in pieces], [d for _, _, d in pieces]


def _direct_pass(task: Task, rules: Rules, cuts: dict[str, Cut], weights: list[float],
                 layouts: dict[tuple[str, Cut], _Layout], by_size: tuple[bool, ...] = (False, True)) -> list[int] | None:
    """`place_tables`' first pass without backing up (`place_items`: pieces with one device first, then largest
    estimate first, or largest in bytes first where `by_size`, each onto the least-loaded device with room it may
    use; ties: less memory, lower index), in each order of `by_size` in turn over one set of the pieces' rules: the
    first that places every piece; None where none does, or where the task groups tables (`rules`: the task's;
    left to `place_tables`)."""
    if rules.group:
        return None
    sizes: list[int] = []
    fixed: list[int | None] = []
    owner: list[int] = []
    for i, t in enumerate(task.tables):
        piece_bytes, devices = layouts[(t.name, cuts.get(t.name, Cut()))]
        sizes += piece_bytes
        fixed += devices
        owner += [i] * len(piece_bytes)
    pieces = rules.of_pieces(owner, sizes, fixed)
    single = pieces.one_device()
    speeds = task.speeds()
    for size_first in by_size:
        key_of = sizes if size_first else weights
        order = sorted(range(len(sizes)), key=lambda i: (not single[i], -key_of[i], i))
        assignment = place_items(pieces, order, by_least_load, weights, speeds)
        if assignment is not None:
            return assignment
    return None


def _place(task: Task, rules: Rules, cuts: dict[str, Cut], prices: dict[tuple[str, Cut], list[float]],
           layouts: dict[tuple[str, Cut], _Layout], backing_up: bool = False) -> _Placed | None:
    """Pieces at `cuts` placed largest estimate first onto the least-loaded device with room, else largest in
    bytes first (`place_tables`' rule, in a direct pass); None if neither places them. With `backing_up`
    (the starts), `place_tables` itself searches where the direct passes fail: too slow for every move."""
    weights: list[float] = []
    for t in task.tables:
        c = cuts.get(t.name, Cut())
        if (t.name, c) not in prices:
            return None  # an oversized table's first cut that the search does not try
        weights += prices[(t.name, c)]
    assignment = _direct_pass(task, rules, cuts, weights, layouts)
    if assignment is None and backing_up:
        cut, _ = cut_task(task, cuts)
        order = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
        try:
            assignment = place_tables(cut, order, by_least_load, weights=weights)
        except InfeasibleTaskError:
            return None
    if assignment is None:
        return None
    load = np.zeros(task.num_devices)
    np.add.at(load, assignment, weights)
    return _Placed(float(load.max()), cuts, load, assignment)
