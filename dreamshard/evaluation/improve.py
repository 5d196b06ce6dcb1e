"""Distance to the best plan found: a local search that measures real plans (hardware in the loop).

Tasks too large to enumerate have no known optimum; `improve` bounds it from above with the best plan it
measured, starting from the sharders' plans, so "best found / seed cost" says how far a sharder is from it.
Moves, confirmation of noisy gains, restarts and how to choose min_gain and rounds: docs/cost-backends.md.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from dreamshard.hardware.base import CostBackend, PlanCost, Reading, measure_rounds, median_cost
from dreamshard.placement import Rules
from dreamshard.plan import Plan, PlanKey, Shard, device_memory_bytes, validate_plan
from dreamshard.tasks import Task

MOVE_KINDS = ("move", "swap", "exchange", "split", "merge")
# how a candidate is judged, for journals of past searches: beside the incumbent in the same rounds on a measured
# backend, and the found plan measured again beside the sharders' (summary.best_known_check)
SEARCH = "paired-rechecked"
# neighbourhoods in the order a descent tries them: the next only when the previous has no improvement
TIERS = (("move", "exchange"), ("swap",), ("split", "merge"))



@dataclass(frozen=True)
class ImproveConfig:
    budget: int = 200  # plan measurements in all (backend.plan_cost calls), seeds included
    rounds: int = 3  # measurements of a seed, or of a candidate to confirm it; its cost is their median
    seed: int = 0  # order among equally ranked neighbours, and the random kicks
    moves: tuple[str, ...] = MOVE_KINDS  # which neighbours: move, swap, exchange, split, merge
    max_neighbours: int = 4  # neighbours measured per chunk; the best improving one of a chunk is the step
    min_gain: float = 0.0  # relative improvement a candidate's median needs over the incumbent's (module doc)
    confirm: int = 2  # promising candidates of a chunk confirmed together, in interleaved rounds
    restarts: bool = True  # after a local optimum: descend from the other seeds, then from kicks of the best plan

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise ValueError(f"improve: budget must be >= 1, got {self.budget}")
        if self.rounds < 1:
            raise ValueError(f"improve: rounds must be >= 1, got {self.rounds}")
        if self.max_neighbours < 1 or self.confirm < 1:
            raise ValueError("improve: max_neighbours and confirm must be >= 1")
        if not 0.0 <= self.min_gain < 1.0:
            raise ValueError(f"improve: min_gain must be in [0, 1), got {self.min_gain}")
        unknown = [m for m in self.moves if m not in MOVE_KINDS]
        if unknown or not self.moves:
            raise ValueError(f"improve: moves must be among {', '.join(MOVE_KINDS)}, got {list(self.moves)}")


@dataclass(frozen=True)
class ImproveResult:
    best_plan: Plan
    best_cost: PlanCost  # the median of its `rounds` confirming measurements
    seed_costs: tuple[PlanCost, ...]  # per seed plan (as given, duplicates included): median of `rounds`
    measurements: int  # plan readings taken
    history: tuple[tuple[int, float], ...]  # (measurements so far, best cost ms) after the seeds and each improvement
    start_seed: int  # index in seeds of the seed the search started from (the cheapest)
    best_seed: int  # index in seeds of the seed best_plan descends from (through descents and kicks)
    descents: int  # local searches run (1 + restarts)

    @property
    def seed_best_ms(self) -> float:
        return min(c.cost_ms for c in self.seed_costs)

    @property
    def gain(self) -> float:
        """Best found over the best seed (<= 1)."""
        return self.best_cost.cost_ms / self.seed_best_ms


class _BudgetSpent(Exception):
    pass


# a neighbour: how to build it from the incumbent's shards: ("move", unit, dest) | ("swap", unit_a, unit_b) |
#   ("exchange", device_a, device_b) | ("split", shard index, keep_left, dest) | ("merge", shard i, shard j, dest)
Neighbour = tuple


class _Neighbourhood:
    """The valid neighbours of one plan, built lazily from small descriptors."""

    def __init__(self, task: Task, plan: Plan, moves: Sequence[str]) -> None:
        self.task, self.plan, self.moves = task, plan, moves
        self.shards = plan.shards
        self.table = {t.name: t for t in task.tables}
        self.rules = Rules.of_task(task)  # capacities, pins, avoid lists and groups (placement.Rules)
        self.used = device_memory_bytes(task, plan)
        self.nbytes = [self._bytes(s) for s in self.shards]
        index = {t.name: i for i, t in enumerate(task.tables)}
        self.allowed = {t.name: frozenset(self.rules.may_use(index[t.name])) for t in task.tables}
        self.uncut = task.never_cut()
        self.can_split = "column" in task.sharding
        # units: shards that move together (a group's tables, each whole, share one device)
        group_of = [self.rules.group.get(index[s.table]) for s in self.shards]
        units: list[tuple[int, ...]] = []
        seen_groups: set[int] = set()
        for i, g in enumerate(group_of):
            if g is None:
                units.append((i,))
            elif g not in seen_groups:
                seen_groups.add(g)
                units.append(tuple(j for j, h in enumerate(group_of) if h == g))
        self.units = units
        self.unit_device = [self.shards[u[0]].device for u in units]
        self.unit_bytes = [sum(self.nbytes[i] for i in u) for u in units]
        self.unit_allowed = []
        for u in units:
            ok = set(range(task.num_devices))
            for i in u:
                ok &= self.allowed[self.shards[i].table]
            self.unit_allowed.append(ok)

    def _bytes(self, s: Shard) -> int:
        t = self.table[s.table]
        return self.task.shard_bytes(t, s.num_rows(t.rows), s.width)

    def _fits(self, device: int, delta: int) -> bool:
        return self.rules.fits(device, self.used[device] + delta)

    def _split_at(self, s: Shard) -> int | None:
        """Column where a halving of shard s cuts (a multiple of 4 nearest the middle), None if it may not be cut."""
        if not self.can_split or s.table in self.uncut or s.width < 8:
            return None
        return s.col_start + 4 * (s.width // 8)

    def from_devices(self, sources: Sequence[int]) -> list[tuple[int, Neighbour]]:
        """(receiving device, neighbour) for every valid neighbour that takes something off a device in `sources`."""
        src = set(sources)
        n = self.task.num_devices
        out: list[tuple[int, Neighbour]] = []
        if "move" in self.moves:
            for u, dev in enumerate(self.unit_device):
                if dev in src:
                    for d in range(n):
                        if d != dev and d in self.unit_allowed[u] and self._fits(d, self.unit_bytes[u]):
                            out.append((d, ("move", u, d)))
        if "swap" in self.moves:
            for u, dev in enumerate(self.unit_device):
                if dev not in src:
                    continue
                for v, other in enumerate(self.unit_device):
                    if other == dev or (other in src and v < u):  # a pair of two critical devices once
                        continue
                    if dev in self.unit_allowed[v] and other in self.unit_allowed[u] \
                            and self._fits(other, self.unit_bytes[u] - self.unit_bytes[v]) \
                            and self._fits(dev, self.unit_bytes[v] - self.unit_bytes[u]):
                        out.append((other, ("swap", u, v)))
        if "exchange" in self.moves:
            for a in range(n):
                for b in range(a + 1, n):
                    if self._may_exchange(a, b):
                        out.append((b if a in src else a if b in src else n, ("exchange", a, b)))
        if "split" in self.moves:
            for i, s in enumerate(self.shards):
                cut = self._split_at(s) if s.device in src else None
                if cut is None:
                    continue
                left, right = Shard(s.table, s.device, s.col_start, cut, s.row_start, s.row_end), \
                    Shard(s.table, s.device, cut, s.col_end, s.row_start, s.row_end)
                for keep_left, (stay, go) in ((True, (left, right)), (False, (right, left))):
                    for d in range(n):
                        if d != s.device and d in self.allowed[s.table] and self._fits(d, self._bytes(go)) \
                                and self._fits(s.device, self._bytes(stay) - self.nbytes[i]):
                            out.append((d, ("split", i, keep_left, d)))
        if "merge" in self.moves:
            by_end = {(s.table, s.col_end, s.row_start, s.row_end): i for i, s in enumerate(self.shards)}
            for j, second in enumerate(self.shards):
                found = by_end.get((second.table, second.col_start, second.row_start, second.row_end))
                if found is None:
                    continue
                i = found
                first = self.shards[i]
                if first.device not in src and second.device not in src:
                    continue
                merged = self._bytes(Shard(first.table, first.device, first.col_start, second.col_end,
                                           first.row_start, first.row_end))
                for d in sorted({first.device, second.device}):
                    delta = merged - sum(self.nbytes[k] for k in (i, j) if self.shards[k].device == d)
                    if self._fits(d, delta):
                        out.append((d, ("merge", i, j, d)))
        return out

    def build(self, nb: Neighbour) -> Plan:
        shards = list(self.shards)
        kind = nb[0]
        if kind == "move":
            _, u, d = nb
            for i in self.units[u]:
                shards[i] = _on(shards[i], d)
        elif kind == "swap":
            _, u, v = nb
            du, dv = self.unit_device[u], self.unit_device[v]
            for i in self.units[u]:
                shards[i] = _on(shards[i], dv)
            for i in self.units[v]:
                shards[i] = _on(shards[i], du)
        elif kind == "exchange":
            _, a, b = nb
            for i, s in enumerate(shards):
                if s.device in (a, b):
                    shards[i] = _on(s, b if s.device == a else a)
        elif kind == "split":
            _, i, keep_left, d = nb
            s = shards[i]
            cut = self._split_at(s)
            assert cut is not None
            left = Shard(s.table, s.device if keep_left else d, s.col_start, cut, s.row_start, s.row_end)
            right = Shard(s.table, d if keep_left else s.device, cut, s.col_end, s.row_start, s.row_end)
            shards[i:i + 1] = [left, right]
        elif kind == "merge":
            _, i, j, d = nb
            a, b = shards[i], shards[j]
            shards[i] = Shard(a.table, d, a.col_start, b.col_end, a.row_start, a.row_end)
            del shards[j]
        else:
            raise ValueError(f"unknown neighbour {nb!r}")
        return Plan(self.plan.num_devices, tuple(joined(shards)))

    def _may_exchange(self, a: int, b: int) -> bool:
        """May devices a and b trade all their shards? Not when they hold nothing, or trading changes nothing (devices
        alike in memory, kind, speed and host name: the same plan up to names; devices that name no host are taken
        as one host's), or memory or a constraint forbids it."""
        da, db = self.task.devices[a], self.task.devices[b]
        if da == db or (self.used[a] == 0 and self.used[b] == 0):
            return False
        if not (self.rules.fits(b, self.used[a]) and self.rules.fits(a, self.used[b])):
            return False
        return all({a, b} <= self.unit_allowed[u] for u, d in enumerate(self.unit_device) if d in (a, b))

    def random_step(self, rng: random.Random) -> Plan | None:
        """A random valid neighbour anywhere in the plan (for kicks): a kind of move drawn uniformly, then one of that
        kind; None when the plan has no neighbour."""
        by_kind: dict[str, list[Neighbour]] = {}
        for _, nb in self.from_devices(range(self.task.num_devices)):
            by_kind.setdefault(nb[0], []).append(nb)
        if not by_kind:
            return None
        kind = rng.choice(sorted(by_kind))
        return self.build(rng.choice(by_kind[kind]))


def joined(shards: Sequence[Shard]) -> list[Shard]:
    """The shards with adjacent column slices of one table, of the same rows and on the same device, joined into one
    (e.g. after a move brings a slice back beside its neighbour): the same cells on the same devices, fewer shards."""
    out = list(shards)
    while True:
        by_end = {(s.table, s.device, s.col_end, s.row_start, s.row_end): i for i, s in enumerate(out)}
        pair = next(((by_end[k], j) for j, b in enumerate(out)
                     if (k := (b.table, b.device, b.col_start, b.row_start, b.row_end)) in by_end), None)
        if pair is None:
            return out
        i, j = pair
        a, b = out[i], out[j]
        out[i] = Shard(a.table, a.device, a.col_start, b.col_end, a.row_start, a.row_end)
        del out[j]


def _on(s: Shard, device: int) -> Shard:
    return Shard(s.table, device, s.col_start, s.col_end, s.row_start, s.row_end)


def critical_devices(cost: PlanCost, rel_tol: float = 1e-9) -> list[int]:
    """Devices whose load sets the plan's cost: the largest total (and those tied with it) and the slowest forward
    (every device waits for it before the all-to-all), most loaded first."""
    totals = [d.total_ms for d in cost.devices]
    fwds = [d.fwd_ms for d in cost.devices]
    top_total, top_fwd = max(totals), max(fwds)
    crit = {d for d, t in enumerate(totals) if t >= top_total * (1 - rel_tol)}
    crit |= {d for d, f in enumerate(fwds) if f >= top_fwd * (1 - rel_tol)}
    return sorted(crit, key=lambda d: (-totals[d], d))


class _MeasuredSearch:
    def __init__(self, backend: CostBackend, task: Task, config: ImproveConfig) -> None:
        self.backend, self.task, self.config = backend, task, config
        self.rng = random.Random(config.seed)
        self.used = 0
        self.single: dict[PlanKey, PlanCost] = {}  # first measurement of each plan measured
        self.samples: dict[PlanKey, list[Reading]] = {}  # every reading of each plan
        self.confirmed: dict[PlanKey, PlanCost] = {}  # median of `rounds` measurements
        self.plans: dict[PlanKey, Plan] = {}
        self.best: PlanKey | None = None
        self.best_origin = -1
        self.history: list[tuple[int, float]] = []
        self.local_optima: set[PlanKey] = set()

    # ------------------------------------------------------------ measuring

    def _measure(self, keys: Sequence[PlanKey], counts: Sequence[int]) -> None:
        """`counts[i]` more readings of `keys[i]`, taken in turns (measure_rounds); each reading is one of the
        budget's measurements."""
        if self.used + sum(counts) > self.config.budget:
            raise _BudgetSpent
        self.used += sum(counts)
        plans = [self.plans[k] for k in keys]
        for k, readings in zip(keys, measure_rounds(self.backend, self.task, plans, list(counts), list)):
            self.samples.setdefault(k, []).extend(readings)
            self.single.setdefault(k, readings[0].cost)

    def _register(self, plan: Plan) -> PlanKey:
        key = plan.key()
        if key not in self.plans:
            validate_plan(self.task, plan)
            self.plans[key] = plan
        return key

    def references(self, incumbent: PlanKey) -> list[PlanKey]:
        """The plans a candidate is read beside on a measured backend: the incumbent and the best plan so far."""
        return list(dict.fromkeys(k for k in (incumbent, self.best) if k is not None))

    def screen(self, keys: Sequence[PlanKey], incumbent: PlanKey) -> float:
        """One reading of each of `keys` in one round: on a measured backend with the references read in that round
        too (the devices they share with `keys` read once), else only of keys never read. The incumbent's cost to
        beat: its reading of the round, or its confirmed median where the backend reads the same every time."""
        if self.backend.measured:  # every reading of this round, read afresh: older ones are of another machine
            todo = list(dict.fromkeys([*keys, *self.references(incumbent)]))
        else:  # the same reading every time: a plan is read once
            todo = [k for k in keys if k not in self.single]
        if todo:
            if self.used + len(todo) > self.config.budget:
                raise _BudgetSpent
            self._measure(todo, [1] * len(todo))
        if self.backend.measured:
            return self.samples[incumbent][-1].cost.cost_ms
        return self.confirmed[incumbent].cost_ms

    def confirm(self, keys: Sequence[PlanKey], origin: int, incumbent: PlanKey) -> list[PlanKey]:
        """Measure `keys` to `rounds` readings, in interleaved turns, and return those that beat the incumbent by
        `min_gain`. On a measured backend the machine drifts, so the incumbent (and the best plan) are read in the
        same turns and only readings of the same rounds are compared: each plan's last `rounds` readings (the
        screening round's and `rounds - 1` fresh ones). Plans the budget cannot complete stay unconfirmed."""
        refs = [k for k in self.references(incumbent) if k not in keys] if self.backend.measured else []
        todo = [k for k in keys if k not in self.confirmed or self.backend.measured]
        if self.backend.measured:
            extra = self.config.rounds - 1
            left = self.config.budget - self.used - extra * len(refs)
            affordable = todo[:max(left // extra, 0)] if extra else list(todo)
            if not affordable:
                raise _BudgetSpent
            if extra:
                self._measure(affordable + refs, [extra] * (len(affordable) + len(refs)))
            for k in [*affordable, *refs]:
                self.confirmed[k] = median_cost(self.samples[k][-self.config.rounds:])
        else:
            need = {k: self.config.rounds - len(self.samples.get(k, [])) for k in todo}
            affordable, left = [], self.config.budget - self.used
            for k in todo:
                if need[k] <= left:
                    affordable.append(k)
                    left -= max(need[k], 0)
            short = [k for k in affordable if need[k] > 0]
            if short:
                self._measure(short, [need[k] for k in short])
            for k in affordable:
                self.confirmed[k] = median_cost(self.samples[k][:self.config.rounds])
        for k in affordable:
            self._offer(k, origin)
        bar = self.confirmed[incumbent].cost_ms * (1.0 - self.config.min_gain)
        return [k for k in affordable if self.confirmed[k].cost_ms < bar]

    def _offer(self, key: PlanKey, origin: int) -> None:
        cost = self.confirmed[key].cost_ms
        # a new best beats the old by min_gain too, wherever it comes from (a descent from a later seed, a kick)
        if self.best is None or cost < self.confirmed[self.best].cost_ms * (1.0 - self.config.min_gain):
            self.best, self.best_origin = key, origin
            self.history.append((self.used, cost))

    # ------------------------------------------------------------ searching

    def seeds(self, seeds: Sequence[Plan]) -> list[PlanKey]:
        keys = [self._register(p) for p in seeds]
        distinct = list(dict.fromkeys(keys))
        if len(distinct) * self.config.rounds > self.config.budget:
            raise ValueError(f"improve: a budget of {self.config.budget} measurements cannot measure the "
                             f"{len(distinct)} distinct seed plans {self.config.rounds} times each")
        self._measure(distinct, [self.config.rounds] * len(distinct))
        for k in distinct:
            self.confirmed[k] = median_cost(self.samples[k])
        for k in sorted(distinct, key=lambda k: self.confirmed[k].cost_ms):  # the cheapest seed first
            self._offer(k, keys.index(k))
        return keys

    def descend(self, start: PlanKey, origin: int) -> None:
        """Local search from a confirmed plan until no neighbour improves (or the budget ends)."""
        incumbent = start
        while incumbent not in self.local_optima:
            inc_cost = self.confirmed[incumbent]
            hood = _Neighbourhood(self.task, self.plans[incumbent], self.config.moves)
            ranked = hood.from_devices(critical_devices(inc_cost))
            order = sorted(inc_cost.devices[d].total_ms for d in range(self.task.num_devices))
            load_rank = {d: order.index(inc_cost.devices[d].total_ms) for d in range(self.task.num_devices)}
            keyed = [(load_rank.get(d, len(load_rank)), self.rng.random(), nb) for d, nb in ranked]
            keyed.sort(key=lambda x: (x[0], x[1]))
            step = None
            for tier in TIERS:  # whole-table moves first; a larger neighbourhood only when they are exhausted
                tier_neighbours = [nb for _, _, nb in keyed if nb[0] in tier]
                step = self._scan(tier_neighbours, hood, incumbent, origin)
                if step is not None:
                    break
            if step is None:
                self.local_optima.add(incumbent)
                return
            incumbent = step

    def _scan(self, neighbours: Sequence[Neighbour], hood: _Neighbourhood, incumbent: PlanKey,
              origin: int) -> PlanKey | None:
        """The first chunk's best confirmed improvement on the incumbent, or None if no neighbour has one."""
        size = self.config.max_neighbours
        gain = 1.0 - self.config.min_gain
        for start in range(0, len(neighbours), size):
            chunk = list(dict.fromkeys(self._register(hood.build(nb)) for nb in neighbours[start:start + size]))
            threshold = self.screen(chunk, incumbent) * gain
            if not self.backend.measured:  # confirmed before (from another incumbent) and better: no new reading
                done = [k for k in chunk if k in self.confirmed and k != incumbent
                        and self.confirmed[k].cost_ms < self.confirmed[incumbent].cost_ms * gain]
                if done:
                    return min(done, key=lambda k: self.confirmed[k].cost_ms)
            reading = {k: (self.samples[k][-1].cost if self.backend.measured else self.single[k]).cost_ms
                       for k in chunk}
            promising = sorted((k for k in chunk if k != incumbent and reading[k] < threshold
                                and (self.backend.measured or k not in self.confirmed)), key=lambda k: reading[k])
            while promising:
                batch, promising = promising[:self.config.confirm], promising[self.config.confirm:]
                won = self.confirm(batch, origin, incumbent)
                if not any(k in self.confirmed for k in batch):
                    raise _BudgetSpent  # not even one candidate can be confirmed
                if won:
                    return min(won, key=lambda k: self.confirmed[k].cost_ms)
        return None

    def kick(self) -> PlanKey | None:
        """A confirmed plan 2-3 random neighbours away from the best one (None: none found that is new)."""
        assert self.best is not None
        for _ in range(50):
            plan = self.plans[self.best]
            for _ in range(self.rng.choice((2, 3))):
                step = _Neighbourhood(self.task, plan, self.config.moves).random_step(self.rng)
                if step is None:
                    break
                plan = step
            key = self._register(plan)
            if key in self.confirmed:
                continue
            self.screen([key], self.best)
            self.confirm([key], self.best_origin, self.best)
            if key in self.confirmed:
                return key
            raise _BudgetSpent
        return None


def improve(backend: CostBackend, task: Task, seeds: Sequence[Plan], config: ImproveConfig | None = None) -> ImproveResult:
    """The best plan a measured local search finds from `seeds` (each a valid plan of `task`): module docstring."""
    config = config or ImproveConfig()
    if not seeds:
        raise ValueError("improve: no seed plans")
    search = _MeasuredSearch(backend, task, config)
    keys = search.seeds(seeds)
    seed_costs = tuple(search.confirmed[k] for k in keys)
    order = sorted(dict.fromkeys(keys), key=lambda k: search.confirmed[k].cost_ms)
    start_seed = keys.index(order[0])
    descents = 0
    try:
        for i, k in enumerate(order):
            if i > 0 and not config.restarts:
                break
            descents += 1
            search.descend(k, keys.index(k))
        while config.restarts:
            kicked = search.kick()
            if kicked is None:
                break
            descents += 1
            search.descend(kicked, search.best_origin)
    except _BudgetSpent:
        pass
    assert search.best is not None
    best_cost = search.confirmed[search.best]
    if not backend.measured:  # never worse than the best seed (a measured backend's medians are of other rounds)
        assert best_cost.cost_ms <= min(c.cost_ms for c in seed_costs)
    assert search.used <= config.budget
    return ImproveResult(search.plans[search.best], best_cost, seed_costs, search.used, tuple(search.history),
                         start_seed, search.best_origin, descents)
