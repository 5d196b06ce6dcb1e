"""NeuroShard's search: beam search over column and row splits around a greedy grid search.

Shards are blocks of tables priced as the table they would be on their own; the inner greedy places them by
predicted cost under a grid of dim-balance scales, and the beam search halves columns (and, with
`row_splits`, rows) while that lowers the predicted plan cost. Constraints and memory always hold. The
search, its bounds on row cuts and why row moves are off by default: docs/learning.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import torch

from dreamshard.data.bins import BinEstimator
from dreamshard.hardware.comm import dist_group_count, dist_latency_ms, shard_traffic
from dreamshard.learning.cost_model import folded_encodings
from dreamshard.learning.decoding import CostHeads
from dreamshard.learning.features import shard_features
from dreamshard.learning.neuroshard import NeuroShardModel
from dreamshard.placement import PlacementState, Rooms, Rules, place_tables
from dreamshard.plan import Plan, Shard, lookup_kind
from dreamshard.sharders.fallback import AnalyticSharder, Decision
from dreamshard.sharders.learned import LearnedSharder
from dreamshard.tables import Table
from dreamshard.tasks import Task

# how the search rates a device (_Evaluator): part of the evaluate journal's fingerprint, since it decides plans
DEVICE_RATING = "compute heads in NumPy float64 on summed first-layer projections"


@dataclass(frozen=True)
class SearchConfig:
    beams: int = 3
    depth: int = 10  # moves per search at most (with row_splits, a second search follows: module docstring)
    candidates: int = 5
    scale_min: float = 1.0
    scale_max: float = 1.5
    scale_steps: int = 11
    row_splits: bool = False  # also try halving shards' rows (where the task allows row ranges)
    min_rows: int = 1000  # a row half keeps at least this many rows
    max_row_ranges: int | None = None  # distinct row ranges of one table at most; None: the device count

    def __post_init__(self) -> None:
        if self.beams < 1 or self.depth < 0 or self.candidates < 1 or self.scale_steps < 1:
            raise ValueError("search: beams, candidates, scale_steps >= 1 and depth >= 0 required")
        if not 0 < self.scale_min <= self.scale_max:
            raise ValueError("search: 0 < scale_min <= scale_max required")
        for name in ("min_rows", "max_row_ranges"):
            value = getattr(self, name)
            if value is None and name == "max_row_ranges":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"search: {name} must be an integer >= 1, got {value!r}")


class Block(NamedTuple):
    """Rows [row_start, row_end) x columns [col_start, col_end) of task.tables[table]."""

    table: int
    row_start: int
    row_end: int
    col_start: int
    col_end: int

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start

    @property
    def width(self) -> int:
        return self.col_end - self.col_start


# a shard set: the blocks of a candidate plan, sorted
ShardSet = tuple[Block, ...]


def as_blocks(task: Task, shards: Sequence[Sequence[int]]) -> ShardSet:
    """Blocks from 5-tuples (table, row_start, row_end, col_start, col_end), or from the 3-tuples
    (table, col_start, col_end) of all rows that shard sets were before row splits."""
    out = []
    for s in shards:
        if len(s) == 3:
            out.append(Block(s[0], 0, task.tables[s[0]].rows, s[1], s[2]))
        elif len(s) == 5:
            out.append(Block(*s))
        else:
            raise ValueError(f"shard {tuple(s)!r}: expected (table, col_start, col_end) or "
                             "(table, row_start, row_end, col_start, col_end)")
    return tuple(out)


def block_table(task: Task, b: Block) -> Table:
    """The table block `b` is to the cost models (Table.piece)."""
    return task.tables[b.table].piece(b.row_start, b.row_end, b.width)


class _Evaluator:
    """The cost models as numpy-friendly batched functions for one task. A piece's encoding is the compute
    model's, projected through its fwd and bwd heads' first layer (decoding.CostHeads): devices sum those."""

    def __init__(self, model: NeuroShardModel, task: Task) -> None:
        self.model, self.task = model, task
        self.heads = CostHeads.of(model.compute, count=2)  # fwd, bwd
        self.cache: dict[tuple[int, int, int], np.ndarray] = {}  # (table, rows, width) -> projected encoding
        self.rules = Rules.of_task(task)  # capacity, pins, avoid lists and groups of the tables
        self.speed = np.asarray(task.speeds(), dtype=np.float64)  # compute on device d = reference / speed[d]

    def encode(self, shards: Sequence[Sequence[int]]) -> np.ndarray:
        blocks = as_blocks(self.task, shards)
        keys = [(b.table, b.rows, b.width) for b in blocks]
        missing = list(dict.fromkeys(k for k in keys if k not in self.cache))
        if missing:
            by_key = {(b.table, b.rows, b.width): b for b in blocks}
            raw = np.stack([shard_features(block_table(self.task, by_key[k]), k[2], self.task.memory) for k in missing])
            enc = folded_encodings(self.model.compute, self.model.scaler, raw)[1].double().numpy()
            self.cache.update(zip(missing, self.heads.project(enc)))
        return np.stack([self.cache[k] for k in keys])

    def sizes(self, shards: ShardSet) -> np.ndarray:
        return np.array([self.task.shard_bytes(self.task.tables[b.table], b.rows, b.width) for b in shards],
                        dtype=np.float64)

    def compute_ms(self, device_sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[..., E] summed encodings -> (fwd, fwd + bwd) predicted ms on the reference device (speed 1)."""
        c = self.heads.costs(device_sums)
        return c[..., 0], c[..., 0] + c[..., 1]

    def device_compute_ms(self, device_sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[..., D, E] -> (fwd, fwd + bwd) predicted ms on each device, at its speed."""
        fwd, total = self.compute_ms(device_sums)
        return fwd / self.speed, total / self.speed

    def traffic(self, blocks: ShardSet) -> np.ndarray:
        """[k, 2] each block's traffic per sample (hardware.comm.shard_traffic)."""
        topology = self.model.compute.config.topology  # as plan_device_sums counts it (NeuroShardModel.plan_cost)
        return np.array([shard_traffic(self.task.tables[b.table], b.width, b.rows, topology=topology) for b in blocks],
                        dtype=np.float64).reshape(-1, 2)

    def dists_ms(self, blocks: ShardSet) -> float:
        """Both ways, the latencies of the dists of the lookup groups `blocks` make (hardware.comm.dist_latency_ms)."""
        tables = self.task.tables
        groups = dist_group_count(lookup_kind(b.rows, b.width, tables[b.table].rows, tables[b.table].dim)
                                  for b in blocks)
        return sum(dist_latency_ms(groups, self.task.num_devices, self.model.compute.config.topology))

    def score(self, device_sums: np.ndarray, traffic: np.ndarray, blocks: ShardSet) -> np.ndarray:
        """[..., D, E], [..., D, 2] -> [...] predicted plan cost of `blocks` so placed: max over devices of compute
        + comm, the lookup groups' dists included."""
        fwd, compute = self.device_compute_ms(device_sums)
        offsets = fwd.max(axis=-1, keepdims=True) - fwd
        with torch.no_grad():
            comm = self.model.comm(self.model.comm.inputs(traffic, offsets)).numpy().sum(axis=-1)
        return (compute + comm).max(axis=-1) + self.dists_ms(blocks)


def greedy_grid(ev: _Evaluator, shards: Sequence[Sequence[int]], cfg: SearchConfig) -> tuple[float, list[int]] | None:
    """Best (score, device per shard) over the dim-balance scales; None if no scale places all."""
    blocks = as_blocks(ev.task, shards)
    n = ev.task.num_devices
    enc = ev.encode(blocks)
    widths = np.array([b.width for b in blocks], dtype=np.float64)
    traffic = ev.traffic(blocks)
    sizes = ev.sizes(blocks)
    _, single = ev.compute_ms(enc)
    rules = ev.rules.of_pieces([b.table for b in blocks], sizes)  # each block under its table's constraints
    # pinned shards first, as placement.place_tables places them, so every other shard sees their load
    order = rules.pinned_first(np.argsort(-single, kind="stable").tolist())
    scales = np.linspace(cfg.scale_min, cfg.scale_max, cfg.scale_steps)
    bound = scales[:, None] * widths.sum() / n  # [S, 1]
    k = len(scales)
    dev = np.zeros((k, n, enc.shape[1]))
    dims = np.zeros((k, n))
    loads = np.zeros((k, n, 2))  # each device's traffic
    rooms = Rooms(rules, k)  # each scale's bytes per device and its groups' devices
    alive = np.ones(k, dtype=bool)
    assign = np.full((k, len(blocks)), -1)
    for i in order:
        _, after = ev.device_compute_ms(dev + enc[i])  # [S, D] predicted cost of each device with shard i added
        room = rooms.open(i)
        balanced = room & (dims + widths[i] <= bound)
        allowed = np.where(balanced.any(axis=1, keepdims=True), balanced, room)
        alive &= allowed.any(axis=1)
        choice = np.where(allowed, after, np.inf).argmin(axis=1)
        rows = np.arange(k)
        dev[rows, choice] += enc[i]
        dims[rows, choice] += widths[i]
        loads[rows, choice] += traffic[i]
        rooms.place(i, choice)
        assign[:, i] = choice
    if not alive.any():
        return None
    scores = np.where(alive, ev.score(dev, loads, blocks), np.inf)
    best = int(scores.argmin())
    return float(scores[best]), assign[best].tolist()


def backtracking_plan(ev: _Evaluator, shards: ShardSet) -> tuple[float, list[int]]:
    """The greedy preference (lowest predicted cost after adding) with backing up on memory dead ends."""
    tables = tuple(replace(block_table(ev.task, b), name=to_shard(ev.task, b, 0).label()) for b in shards)
    # the task's constraints on the shards of each table (pins, avoid lists, groups: uncut tables, one shard each)
    shard_task = ev.task.derived(tables, {tb.name: ev.task.tables[b.table].name for tb, b in zip(tables, shards)})
    enc = ev.encode(shards)
    _, single = ev.compute_ms(enc)
    order = np.argsort(-single, kind="stable").tolist()

    def rank(i: int, state: PlacementState) -> list[int]:
        _, after = ev.device_compute_ms(state.load + enc[i])
        return np.argsort(after, kind="stable").tolist()

    assignment = place_tables(shard_task, order, rank, weights=enc)
    dev = np.zeros((ev.task.num_devices, enc.shape[1]))
    loads = np.zeros((ev.task.num_devices, 2))
    for d, e, tr in zip(assignment, enc, ev.traffic(shards)):
        dev[d] += e
        loads[d] += tr
    return float(ev.score(dev, loads, shards)), assignment


def can_halve_columns(ev: _Evaluator, b: Block) -> bool:
    name = ev.task.tables[b.table].name
    return ev.task.allows(name, "column") and b.width % 8 == 0 and b.width // 2 >= ev.task.min_width(name)


def can_halve_rows(ev: _Evaluator, shards: ShardSet, i: int, cfg: SearchConfig) -> bool:
    b = shards[i]
    if not (cfg.row_splits and ev.task.allows(ev.task.tables[b.table].name, "row") and b.rows >= 2 * cfg.min_rows):
        return False
    limit = ev.task.num_devices if cfg.max_row_ranges is None else cfg.max_row_ranges
    ranges = {(c.row_start, c.row_end) for j, c in enumerate(shards) if c.table == b.table and j != i}
    mid = b.row_start + b.rows // 2
    return len(ranges | {(b.row_start, mid), (mid, b.row_end)}) <= limit


def split_candidates(ev: _Evaluator, shards: ShardSet, count: int, splittable: Sequence[int]) -> list[int]:
    """The `count` largest of the `splittable` shards (indices) by size and by predicted cost."""
    if not splittable:
        return []
    size = dict(zip(splittable, ev.sizes(tuple(shards[i] for i in splittable))))
    _, cost = ev.compute_ms(ev.encode(tuple(shards[i] for i in splittable)))
    by_cost = dict(zip(splittable, cost))
    top = sorted(splittable, key=lambda i: -size[i])[:count] + sorted(splittable, key=lambda i: -by_cost[i])[:count]
    return list(dict.fromkeys(top))


def halve(shards: ShardSet, i: int) -> ShardSet:
    """Shard i cut into its two column halves."""
    b = shards[i]
    mid = b.col_start + b.width // 2
    return tuple(sorted(shards[:i] + (b._replace(col_end=mid), b._replace(col_start=mid)) + shards[i + 1:]))


def halve_rows(shards: ShardSet, i: int) -> ShardSet:
    """Shard i cut into its two row halves (the second one row larger when its rows are odd)."""
    b = shards[i]
    mid = b.row_start + b.rows // 2
    return tuple(sorted(shards[:i] + (b._replace(row_end=mid), b._replace(row_start=mid)) + shards[i + 1:]))


def moves(ev: _Evaluator, shards: ShardSet, cfg: SearchConfig) -> list[ShardSet]:
    """The shard sets one move away: the column halves of the candidates among the shards whose
    columns can be halved, and the row halves of those among the shards whose rows can be (each
    kind its own candidates: row moves never crowd column moves out)."""
    columns = [i for i, b in enumerate(shards) if can_halve_columns(ev, b)]
    rows = [i for i in range(len(shards)) if can_halve_rows(ev, shards, i, cfg)]
    return ([halve(shards, i) for i in split_candidates(ev, shards, cfg.candidates, columns)]
            + [halve_rows(shards, i) for i in split_candidates(ev, shards, cfg.candidates, rows)])


def to_shard(task: Task, b: Block, device: int) -> Shard:
    """Block `b` on `device`; a block of all rows holds no row range."""
    t = task.tables[b.table]
    rows = (0, None) if b.rows == t.rows else (b.row_start, b.row_end)
    return Shard(t.name, device, b.col_start, b.col_end, *rows)


def to_plan(task: Task, shards: ShardSet, assignment: Sequence[int]) -> Plan:
    """The plan placing block i on device assignment[i]."""
    return Plan(task.num_devices, tuple(to_shard(task, b, int(d)) for b, d in zip(shards, assignment)))


@dataclass
class NeuroShardSharder(LearnedSharder):
    model: NeuroShardModel
    config: SearchConfig = SearchConfig()
    name: str = "neuroshard"
    # estimates the bins of tables that lack them; None: the model's own estimator, if its metadata has one
    bins: BinEstimator | None = None

    fallback: AnalyticSharder | None = None  # plans tasks beyond the training range too (sharders/fallback.py)
    last_decision: Decision | None = field(default=None, init=False, compare=False)

    def own_ms(self, task: Task, plan: Plan) -> float:
        """`plan` rated by NeuroShard's own cost models (ms; a model's estimate)."""
        return self.model.plan_cost(task, plan).cost_ms

    def _shard(self, task: Task) -> Plan:
        ev = _Evaluator(self.model, task)
        root: ShardSet = tuple(Block(i, 0, t.rows, 0, t.dim) for i, t in enumerate(task.tables))
        found = greedy_grid(ev, root, self.config)
        if found is None:
            found = backtracking_plan(ev, root)  # raises InfeasibleTaskError when nothing fits
        seen = {root}
        best = beam_search(ev, (found[0], root, found[1]), replace(self.config, row_splits=False), seen)
        if self.config.row_splits:  # then row moves too, from the column search's best plan: never worse
            best = beam_search(ev, best, self.config, seen)
        _, shards, assignment = best
        return to_plan(task, shards, assignment)


Scored = tuple[float, ShardSet, list[int]]  # (predicted cost, shard set, device per shard)


def beam_search(ev: _Evaluator, start: Scored, cfg: SearchConfig, seen: set[ShardSet]) -> Scored:
    """The best plan found by up to `cfg.depth` moves from `start` (module docstring); `seen` collects the
    shard sets scored, each scored once."""
    best = start
    beams = [best]
    for _ in range(cfg.depth):
        children = []
        for _, shards, _ in beams:
            for child in moves(ev, shards, cfg):
                if child in seen:
                    continue
                seen.add(child)
                result = greedy_grid(ev, child, cfg)
                if result is not None:
                    children.append((result[0], child, result[1]))
        if not children:
            break
        children.sort(key=lambda c: c[0])
        beams = children[: cfg.beams]
        if beams[0][0] >= best[0]:
            break  # no move improves the best plan
        best = beams[0]
    return best
