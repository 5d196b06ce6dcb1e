"""DreamShard with cuts (`dreamshard_cut`): the trained policy places, the cost network decides which tables
to cut into column slices or row-wise blocks.

TorchRec's planner splits the tables that dominate a device, which a plan of whole tables cannot follow; this
searches over cuts and moves on the busiest device with DreamShard's own trained parts, nothing trained
anew, each move scored in microseconds. The search and its options: docs/learning.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from dreamshard.data.bins import BinEstimator
from dreamshard.errors import InfeasibleTaskError
from dreamshard.hardware.comm import host_block_bytes
from dreamshard.hardware.topology import Topology
from dreamshard.learning.cost_model import kind_index
from dreamshard.learning.decoding import StepScorer, rank_devices
from dreamshard.learning.mdp import TaskContext
from dreamshard.learning.policy import LearnedModel
from dreamshard.limits import BYTES_PER_CUT_PIECE, check_memory
from dreamshard.placement import Rules, place_tables
from dreamshard.plan import Plan, validate_plan
from dreamshard.sharders.fallback import AnalyticSharder, Decision
from dreamshard.sharders.learned import LearnedSharder
from dreamshard.sharders.pieces import Cut, cut_task, host_cuts, merge_pieces, num_pieces, table_pieces
from dreamshard.tables import Table
from dreamshard.tasks import Task

ROW_WISE = 0  # the cut "row-wise blocks" among the column slice counts (1: whole)
# the cut "row-wise over host h's devices" (TorchRec's table_row_wise) is HOST_WISE - h: -1, -2, ...
HOST_WISE = -1


def host_cut(h: int) -> int:
    """The cut that lays a table row-wise over the devices of host `h` (pieces.host_cuts)."""
    return HOST_WISE - h


def host_of_cut(k: int) -> int:
    """The host of `host_cut(h)`: h."""
    return HOST_WISE - k


# a host block's columns in the cut search's load (_Universe): the bytes it reduce-scatters within its host, the
# bytes it sends across hosts, and its share of what each device of another host receives (comm.host_block_bytes)
HOST_COLUMNS = ("intra", "send", "recv_share")


def is_blocks(k: int) -> bool:
    """Does cut `k` make row-wise blocks, each pinned to its device (ROW_WISE or a host's)?"""
    return k <= ROW_WISE


@dataclass(frozen=True)
class CutConfig:
    """The search's settings (module docstring)."""

    max_slices: int = 8  # most column slices of one table (also at most dim/4 and the devices it may use)
    depth: int = 24  # moves at most
    candidates: int = 3  # costliest tables of the busiest device tried per move
    min_gain: float = 0.005  # relative predicted gain a move must bring
    escapes: int = 3  # times a stalled search takes its best-rated cut all the same, to rebalance around it
    row_wise: bool = True  # also try TorchRec's row-wise blocks (where the task allows row cuts)
    # also try row-wise over one host's devices (TorchRec's table_row_wise), per host whose devices the blocks fit,
    # where the task allows "host" and its devices name several hosts (off: results/cut_designs/host-wise)
    host_wise: bool = False
    row_start: bool = False  # also search from every table row-wise, less the tables the cost network rates better whole
    # also search from starts with this share of the tables row-wise, the costliest by predicted single cost
    # (the rest placed by the policy), e.g. (0.125, 0.25): the layouts TorchRec's planner reaches, without it
    row_shares: tuple[float, ...] = ()
    # also search from a start with the dominant tables row-wise: those the cost network rates costlier alone
    # than `dominant_share` of a device's fair share (all tables' predicted compute / devices), which a whole
    # placement balances badly or not at all
    dominant_start: bool = True
    dominant_share: float = 0.6
    # where that start does not fit in memory (blocks on every device leave no room for a large whole table), also
    # cut row-wise up to this many of the other tables, the largest in bytes first, until it fits (0: no such retry)
    dominant_room: int = 4
    # a plan with cuts is kept over the best plan of whole tables the search saw only where the cost network rates
    # it cheaper by at least this share: a smaller predicted gain is within the network's error per device
    cut_gain: float = 0.02
    # a table the cost network rates costlier alone than this share of a device's fair share is not kept whole
    # where a plan that cuts it exists (0: no such rule): whole, it alone sets its device's cost, and such a table
    # lies beyond the tables the network learned from, where it rates too low
    must_cut_share: float = 1.0
    # fewest rows a table cut row-wise has (0: any): each block of a small, hot table adds a whole table's share of
    # per-sample work to its device (experiments.cut_gain measures it)
    min_row_rows: int = 0

    def __post_init__(self) -> None:
        for name, least in (("max_slices", 1), ("depth", 0), ("candidates", 1), ("escapes", 0),
                            ("dominant_room", 0), ("min_row_rows", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}: expected an integer >= {least}, got {value!r}")
        if isinstance(self.dominant_share, bool) or not isinstance(self.dominant_share, (int, float)) \
                or not 0 < self.dominant_share <= 1:
            raise ValueError(f"dominant_share: expected a number in (0, 1], got {self.dominant_share!r}")
        if isinstance(self.must_cut_share, bool) or not isinstance(self.must_cut_share, (int, float)) \
                or self.must_cut_share < 0:
            raise ValueError(f"must_cut_share: expected a number >= 0 (0: off), got {self.must_cut_share!r}")
        for name in ("min_gain", "cut_gain"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"{name}: expected a number in [0, 1), got {value!r}")
        for name in ("row_wise", "host_wise", "row_start", "dominant_start"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")
        shares = self.row_shares
        if not isinstance(shares, (tuple, list)) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 1 for x in shares):
            raise ValueError(f"row_shares: expected a list of shares in (0, 1], got {shares!r}")
        object.__setattr__(self, "row_shares", tuple(float(x) for x in shares))


def cut_options(task: Task, table: Table, config: CutConfig) -> list[int]:
    """The cuts tried for `table`, whole first: 1, then 2, 4, ... column slices (each at least its min_width wide,
    on at most as many devices as it may use, at most `max_slices`), then ROW_WISE (every device holds a block),
    then host_cut(h) for each host whose devices its blocks fit (`host_wise`); the block cuts alone for a table
    whose kinds allow no whole table."""
    if table.name in task.never_cut() or task.num_devices < 2:
        return [1]
    out, k = [1], 2
    top = min(task.max_slices(table), len(task.allowed_devices(table.name)), config.max_slices)
    while k <= top:
        out.append(k)
        k *= 2
    if config.row_wise and task.allows(table.name, "row") and table.name not in task.avoided() \
            and table.rows >= max(2, config.min_row_rows):
        out.append(ROW_WISE)
    if config.host_wise:
        out += [host_cut(c.host or 0) for c in host_cuts(table, task)]
    if not task.allows(table.name, "table") and any(is_blocks(k) for k in out):
        return [k for k in out if is_blocks(k)]  # its constraint allows row-wise blocks alone
    return out


def as_cut(k: int, per_host: int | None = None) -> Cut:
    """Cut `k` as pieces.Cut (`per_host`: Task.per_host, for a host's cut)."""
    if k < ROW_WISE:
        if not per_host:
            raise ValueError(f"cut {k} lays a table over one host's devices: it needs the devices per host")
        return Cut(row_wise=True, host=host_of_cut(k), per_host=per_host)
    return Cut(row_wise=True) if k == ROW_WISE else Cut(columns=k)


def cuts_of(task: Task, cuts: list[int]) -> dict[str, Cut]:
    return {t.name: as_cut(k, task.per_host()) for t, k in zip(task.tables, cuts) if k != 1}


@dataclass
class _Universe:
    """Every piece the search may use: each table whole and at each of its cuts, one scorer over all of them.

    A device's load is the sum of its pieces' `weights`: the scorer's, then HOST_COLUMNS for the blocks of a
    table row-wise over one host's devices, whose outputs leave by TorchRec's two-level exchange, not the flat
    all-to-all (the scorer counts no output traffic for them): as comm.host_exchange_ms prices a plan."""

    pieces: dict[tuple[int, int], list[int]]  # (table, cut) -> universe indices of its pieces, in cut_task's order
    sizes: np.ndarray  # bytes of each universe piece
    scorer: StepScorer
    order: list[int]  # universe indices by predicted single cost, descending
    rules: Rules  # where each universe piece may go: its table's constraints, a row-wise block its own device
    weights: np.ndarray  # [P, k + 3] the scorer's weights, then HOST_COLUMNS
    per_host: int | None  # Task.per_host where the universe holds a host's blocks; None: no exchange to price
    topology: Topology  # the cost network's: the links host_exchange_ms prices

    @classmethod
    def build(cls, task: Task, model: LearnedModel, options: list[list[int]]) -> _Universe:
        tables = list(task.tables)
        owner: list[int] = list(range(len(tables)))  # the table of each universe piece
        fixed: list[int | None] = [None] * len(tables)  # the device of a row-wise block
        kinds = [kind_index(t.rows, t.dim, t) for t in tables]  # the lookup group of each universe piece
        pieces: dict[tuple[int, int], list[int]] = {}
        per_host, cfg = task.per_host(), model.cost_net.config
        exchange: dict[int, tuple[float, float, float]] = {}  # universe index of a host's block -> HOST_COLUMNS
        for i, t in enumerate(task.tables):
            pieces[(i, 1)] = [i]
            for k in options[i][1:]:
                cut = table_pieces(t, as_cut(k, per_host), task.num_devices)
                pieces[(i, k)] = list(range(len(tables), len(tables) + len(cut)))
                if k < ROW_WISE and per_host:  # (as_cut refused a host cut without per_host)
                    intra, send, recv = host_block_bytes(t, per_host, task.num_devices, cfg.batch_size, cfg.topology)
                    exchange.update((p, (intra, send, recv / per_host)) for p in pieces[(i, k)])
                # a host's blocks are named as another host's are: named apart here, where every cut is one task
                tables += [replace(piece, name=f"{piece.name} on host {host_of_cut(k)}") if k < ROW_WISE else piece
                           for piece, _, _ in cut]
                owner += [i] * len(cut)
                fixed += [device for _, _, device in cut]
                kinds += [kind_index(piece.rows, piece.dim, t) for piece, _, _ in cut]
        ctx = TaskContext.build(replace(task, tables=tuple(tables), pins=(), avoid=(), groups=(), whole=()),
                                model.cost_net, model.scaler, kinds)
        scorer = StepScorer.build(model.cost_net, model.policy, ctx)
        sizes = np.array([task.shard_bytes(t) for t in tables], dtype=np.int64)
        weights = np.concatenate([scorer.weights, np.zeros((len(tables), len(HOST_COLUMNS)))], axis=1)
        for p, columns in exchange.items():
            weights[p, -len(HOST_COLUMNS) - 2] = 0.0  # no output elements in the flat all-to-all (comm.plan_traffic)
            weights[p, -len(HOST_COLUMNS):] = columns
        return cls(pieces, sizes, scorer, ctx.order, Rules.of_task(task).of_pieces(owner, sizes, fixed), weights,
                   per_host if exchange else None, cfg.topology)

    def load(self, cuts: list[int], where: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Each device's summed scorer input and bytes, with the pieces of `cuts` on the devices `where`."""
        load = np.zeros((len(self.scorer.speed), self.weights.shape[1]))
        used = np.zeros(len(self.scorer.speed), dtype=np.int64)
        for i, devices in enumerate(where):
            for p, d in zip(self.pieces[(i, cuts[i])], devices):
                load[d] += self.weights[p]
                used[d] += self.sizes[p]
        return load, used

    def devices(self, load: np.ndarray) -> np.ndarray:
        """The cost network's estimate of each device's cost under `load` ([..., D, k + 3] -> [..., D])."""
        costs = self.scorer.device_costs(load[..., :-len(HOST_COLUMNS)]).sum(axis=-1)
        if not self.per_host:
            return costs
        intra, send, share = (load[..., c] for c in range(-len(HOST_COLUMNS), 0))
        total = share.sum(axis=-1, keepdims=True)
        own = share.reshape(*share.shape[:-1], -1, self.per_host).sum(axis=-1)  # [..., hosts]
        recv = total - np.repeat(own, self.per_host, axis=-1)  # the other hosts' tables' outputs
        topo, latency = self.topology, self.topology.latency_us * 1e-6
        one_way = (2 * latency + intra / (topo.intra_host_gbps * 1e9)
                   + np.maximum(send, recv) / (topo.inter_host_gbps * 1e9)) * 1e3
        return costs + np.where(total > 0, 2 * one_way, 0.0)  # both ways, on every device once any table is so

    def logits(self, p: int, load: np.ndarray) -> np.ndarray:
        """[D] the policy's logit of each device for universe piece p under `load` (StepScorer.logits)."""
        return self.scorer.logits(p, load[..., :-len(HOST_COLUMNS)])

    def cost(self, cuts: list[int], where: list[list[int]]) -> float:
        """The cost network's device-max estimate of the pieces of `cuts` on the devices `where`."""
        return float(self.devices(self.load(cuts, where)[0]).max())


def _move(u: _Universe, i: int, k: int, devices: list[int], load: np.ndarray, used: np.ndarray):
    """A candidate step of the search, rated: (device-max estimate, table, cut, its pieces' devices, the devices'
    loads, bytes and estimates after it)."""
    rated = u.devices(load)
    return float(rated.max()), i, k, devices, load, used, rated


@dataclass
class CutSearchSharder(LearnedSharder):
    name: str
    model: LearnedModel
    config: CutConfig = field(default_factory=CutConfig)
    bins: BinEstimator | None = None
    fallback: AnalyticSharder | None = None  # plans tasks beyond the training range too (sharders/fallback.py)
    last_decision: Decision | None = field(default=None, init=False, compare=False)

    @torch.no_grad()
    def _shard(self, task: Task) -> Plan:
        n = len(task.tables)
        options = [cut_options(task, t, self.config) for t in task.tables]
        # what _Universe.build makes: each table whole, then its pieces at each further cut
        scored = sum(1 + sum(num_pieces(as_cut(k, task.per_host()), task.num_devices) for k in o[1:])
                     for o in options)
        check_memory(scored * BYTES_PER_CUT_PIECE, f"{self.name}: scoring {scored} pieces ({n} tables whole and at "
                     "each cut, a row-wise cut a block per device)", "plan fewer tables or devices, without row-wise "
                     "cuts (--sharding table,column), with whole tables (dreamshard), or on a larger machine")
        u = _Universe.build(task, self.model, options)

        def decode(cuts: list[int]) -> list[list[int]]:
            """The policy's placement of every piece of `cuts` from scratch: the devices of each table's pieces."""
            active = [p for i in range(n) for p in u.pieces[(i, cuts[i])]]
            local = {p: j for j, p in enumerate(active)}
            cut, _ = cut_task(task, cuts_of(task, cuts))
            order = [local[p] for p in u.order if p in local]
            devices = place_tables(cut, order, lambda j, s: rank_devices(u.logits(active[j], s.load)),
                                   u.weights[active])
            out, j = [], 0
            for i in range(n):
                size = len(u.pieces[(i, cuts[i])])
                out.append(devices[j:j + size])
                j += size
            return out

        cuts = [1] * n
        where = decode(cuts)
        if any(len(o) > 1 for o in options):
            starts = [(cuts, where)]
            if self.config.row_start and any(ROW_WISE in o for o in options):
                rows = [ROW_WISE if ROW_WISE in o else 1 for o in options]
                try:
                    starts.append(self._fewer_row_wise(task, u, rows, decode(rows)))
                except InfeasibleTaskError:
                    pass  # the blocks do not fit every device: no such start

            def add_start(rows: list[int]) -> bool:
                """A start with `rows` cut (ROW_WISE) and the policy's placement, unless it is already one; False
                where its blocks do not fit every device (no such start)."""
                if rows not in [c for c, _ in starts]:
                    try:
                        starts.append((rows, decode(rows)))
                    except InfeasibleTaskError:
                        return False
                return True

            can_row = [i for i in u.order if i < n and ROW_WISE in options[i]]  # whole tables, costliest first
            alone = np.zeros((n, task.num_devices, u.scorer.weights.shape[1]))
            alone[:, 0] = u.scorer.weights[:n]
            single = u.scorer.device_costs(alone)[:, 0, :2].sum(axis=-1) * u.scorer.speed[0]  # each table alone
            fair = single.sum() / task.num_devices
            share = self.config.must_cut_share
            must_cut = {i for i in range(n) if share and len(options[i]) > 1 and single[i] > share * fair}
            for part in self.config.row_shares:
                rows = [1] * n
                for i in can_row[:max(1, round(part * n))]:
                    rows[i] = ROW_WISE
                add_start(rows)
            if self.config.dominant_start and can_row:
                rowable = set(can_row)
                rows = [ROW_WISE if i in rowable and single[i] > self.config.dominant_share * fair else 1
                        for i in range(n)]
                if ROW_WISE in rows:  # else no table is dominant: the policy's start is this one
                    room = sorted((i for i in can_row if rows[i] == 1), key=lambda i: -u.sizes[i])
                    for extra in [None, *room[:self.config.dominant_room]]:
                        if extra is not None:  # a start not added is not kept: its rows may take one more cut
                            rows[extra] = ROW_WISE
                        if add_start(rows):
                            break
            ends = [(u.cost(cuts, where), cuts, where)]  # the policy's plan of whole tables
            for start_cuts, start_where in starts:
                where, cuts = self._search(task, u, options, start_cuts, start_where)
                cost = u.cost(cuts, where)
                if any(k != 1 for k in cuts):
                    again = decode(cuts)
                    again_cost = u.cost(cuts, again)
                    if again_cost < cost:
                        where, cost = again, again_cost
                ends.append((cost, cuts, where))
            # ends that cut every table that must be cut, where there are such ends
            ends = [e for e in ends if all(e[1][i] != 1 for i in must_cut)] or ends
            plain = [e for e in ends if all(k == 1 or i in must_cut for i, k in enumerate(e[1]))]
            if plain:  # cuts beyond those must be rated cut_gain cheaper than the best end without them
                whole = min(plain, key=lambda e: e[0])
                bar = whole[0] * (1 - self.config.cut_gain)
                ends = [e for e in ends if e is whole or e[0] <= bar]
            _, cuts, where = min(ends, key=lambda e: e[0])  # the first of equals: the policy's plan
        cut, pieces = cut_task(task, cuts_of(task, cuts))
        plan = Plan.from_assignment(cut, [d for devices in where for d in devices])
        if pieces:
            validate_plan(cut, plan)  # row-wise blocks on their devices
            plan = merge_pieces(cut, plan, pieces)
        validate_plan(task, plan)
        return plan

    def _fewer_row_wise(self, task: Task, u: _Universe, cuts: list[int],
                        where: list[list[int]]) -> tuple[list[int], list[list[int]]]:
        """From `cuts` with row-wise tables: each of them, the cheapest first, made whole again on the device the
        policy ranks best with room, where the cost network rates that no worse (TorchRec's planner cuts most
        tables row-wise; this start lets the search begin near such a plan)."""
        load, used = u.load(cuts, where)
        current = float(u.devices(load).max())
        cuts, where = cuts.copy(), where.copy()
        w = u.weights
        for i in reversed(u.order):  # the cheapest whole table first (universe index i is table i whole)
            if i >= len(task.tables) or cuts[i] != ROW_WISE:
                continue  # a piece of a cut, or a table that is not row-wise
            trial_load, trial_used = load.copy(), used.copy()
            for q, d in zip(u.pieces[(i, ROW_WISE)], where[i]):
                trial_load[d] -= w[q]
                trial_used[d] -= u.sizes[q]
            room = u.rules.with_room(i, trial_used)
            if not room:
                continue
            logits = u.logits(i, trial_load)
            d = max(room, key=lambda d: (logits[d], -d))
            trial_load[d] += w[i]
            trial_used[d] += u.sizes[i]
            rated = float(u.devices(trial_load).max())
            if rated <= current:
                current, load, used = rated, trial_load, trial_used
                cuts[i], where[i] = 1, [d]
        return cuts, where

    def _search(self, task: Task, u: _Universe, options: list[list[int]], cuts: list[int],
                where: list[list[int]]) -> tuple[list[list[int]], list[int]]:
        cfg, scorer, w = self.config, u.scorer, u.weights
        load, used = u.load(cuts, where)

        per_device = u.devices(load)
        current = float(per_device.max())
        best = (current, cuts, where)  # the cheapest state seen
        escapes = cfg.escapes
        for _ in range(cfg.depth):
            busiest = int(np.argmax(per_device))
            here = [i for i, on in enumerate(where) if busiest in on]
            # the costliest first: a piece's share of the cost heads' input
            here.sort(key=lambda i: -float(np.abs(w[u.pieces[(i, cuts[i])][0], :scorer.cost_width]).sum()))
            moves: list[tuple[float, int, int, list[int], np.ndarray, np.ndarray, np.ndarray]] = []
            for i in here[:cfg.candidates]:
                for k in options[i][options[i].index(cuts[i]) + 1:]:  # every finer cut
                    trial_load, trial_used = load.copy(), used.copy()
                    for p, d in zip(u.pieces[(i, cuts[i])], where[i]):
                        trial_load[d] -= w[p]
                        trial_used[d] -= u.sizes[p]
                    devices: list[int] = []
                    for p in u.pieces[(i, k)]:
                        # a row-wise block on its own device (TorchRec's row-wise layout), slices on distinct devices
                        room = [d for d in u.rules.with_room(p, trial_used) if d not in devices]
                        if not room:
                            break
                        if len(room) == 1:  # no choice: the policy is not asked
                            d = room[0]
                        else:
                            logits = u.logits(p, trial_load)
                            d = max(room, key=lambda d: (logits[d], -d))
                        devices.append(d)
                        trial_load[d] += w[p]
                        trial_used[d] += u.sizes[p]
                    if len(devices) == len(u.pieces[(i, k)]):
                        moves.append(_move(u, i, k, devices, trial_load, trial_used))
                if u.rules.movable(i) and not is_blocks(cuts[i]):  # its piece on the busiest device to another one
                    j = where[i].index(busiest)
                    p = u.pieces[(i, cuts[i])][j]
                    targets = [d for d in u.rules.with_room(p, used) if d not in where[i]]
                    if targets:  # rated together: one call of the cost heads for every target
                        trial = np.repeat(load[None], len(targets), axis=0)
                        trial[:, busiest] -= w[p]
                        trial[np.arange(len(targets)), targets] += w[p]
                        rated = u.devices(trial)
                        for m, d in enumerate(targets):
                            trial_used = used.copy()
                            trial_used[busiest] -= u.sizes[p]
                            trial_used[d] += u.sizes[p]
                            moved = where[i].copy()
                            moved[j] = d
                            moves.append((float(rated[m].max()), i, cuts[i], moved, trial[m], trial_used, rated[m]))
            if not moves:
                break
            cost, i, k, devices, new_load, new_used, new_devices = min(moves, key=lambda m: m[0])
            if cost > current * (1 - cfg.min_gain):  # stalled: cut anyway, at most `escapes` times
                cut_moves = [m for m in moves if m[2] != cuts[m[1]]]
                if escapes == 0 or not cut_moves:
                    break
                escapes -= 1
                cost, i, k, devices, new_load, new_used, new_devices = min(cut_moves, key=lambda m: m[0])
            current, load, used, per_device = cost, new_load, new_used, new_devices
            cuts, where = cuts.copy(), where.copy()
            cuts[i], where[i] = k, devices
            if current < best[0] * (1 - 1e-12):
                best = (current, cuts, where)
        return best[2], best[1]
