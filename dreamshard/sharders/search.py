"""NeuroShard's search: beam search over column splits around a greedy grid search.

Shards are tables or column slices. The inner greedy grid search places the shards in
descending predicted cost, each onto the device whose predicted fused cost after taking
it is lowest, among the devices with memory for it and whose dim sum stays within
scale x (total dim / N); it runs for every scale of a grid at once and keeps the plan
scored best. Score: max over devices of predicted compute + predicted forward and
backward communication (the straggler offsets come from the predicted forward times).
If no device satisfies the dim bound the bound is dropped for that shard; if a scale's
greedy meets a shard no device has room for, that scale has no plan, and if none has,
the placement backs up (dreamshard.sharders.placement) with the same preference.

The beam search keeps `beams` shard sets; each step splits one candidate shard in two
halves of its columns (widths stay multiples of 4), candidates being the `candidates`
largest shards by size and by predicted cost, and keeps the best `beams` results. It
stops at `depth` splits or when no split improves the best plan. Memory is never exceeded.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dreamshard.learning.features import shard_features
from dreamshard.learning.neuroshard import CommNet, NeuroShardModel
from dreamshard.plan import Plan, Shard
from dreamshard.sharders.pieces import with_pieces
from dreamshard.sharders.placement import PlacementState, place_tables
from dreamshard.tables import Table
from dreamshard.tasks import Task


@dataclass(frozen=True)
class SearchConfig:
    beams: int = 3
    depth: int = 10
    candidates: int = 5
    scale_min: float = 1.0
    scale_max: float = 1.5
    scale_steps: int = 11

    def __post_init__(self) -> None:
        if self.beams < 1 or self.depth < 0 or self.candidates < 1 or self.scale_steps < 1:
            raise ValueError("search: beams, candidates, scale_steps >= 1 and depth >= 0 required")
        if not 0 < self.scale_min <= self.scale_max:
            raise ValueError("search: 0 < scale_min <= scale_max required")


# a shard set: (table index, col_start, col_end) triples
ShardSet = tuple[tuple[int, int, int], ...]


class _Evaluator:
    """The cost models as numpy-friendly batched functions for one task."""

    def __init__(self, model: NeuroShardModel, task: Task) -> None:
        self.model, self.task = model, task
        self.cache: dict[tuple[int, int], np.ndarray] = {}
        self.capacity = np.array([d.memory_bytes for d in task.devices], dtype=np.float64)

    def encode(self, shards: ShardSet) -> np.ndarray:
        missing = [(t, e - s) for t, s, e in shards if (t, e - s) not in self.cache]
        if missing:
            raw = np.stack([shard_features(self.task.tables[t], w, self.task.memory) for t, w in missing])
            with torch.no_grad():
                enc = self.model.compute.encode(torch.from_numpy(self.model.scaler.transform(raw))).numpy()
            self.cache.update(zip(missing, enc))
        return np.stack([self.cache[(t, e - s)] for t, s, e in shards])

    def compute_ms(self, device_sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[..., E] -> (fwd, fwd + bwd) predicted ms."""
        with torch.no_grad():
            c = self.model.compute.device_costs(torch.from_numpy(device_sums).float()).numpy()
        return c[..., 0], c[..., 0] + c[..., 1]

    def score(self, device_sums: np.ndarray, dim_sums: np.ndarray) -> np.ndarray:
        """[..., D, E], [..., D] -> [...] predicted plan cost: max over devices of compute + comm."""
        fwd, compute = self.compute_ms(device_sums)
        offsets = fwd.max(axis=-1, keepdims=True) - fwd
        with torch.no_grad():
            comm = self.model.comm(CommNet.inputs(dim_sums, offsets)).numpy().sum(axis=-1)
        return (compute + comm).max(axis=-1)


def greedy_grid(ev: _Evaluator, shards: ShardSet, cfg: SearchConfig) -> tuple[float, list[int]] | None:
    """Best (score, device per shard) over the dim-balance scales; None if no scale places all."""
    task, n = ev.task, ev.task.num_devices
    enc = ev.encode(shards)
    widths = np.array([e - s for _, s, e in shards], dtype=np.float64)
    sizes = np.array([task.memory.shard_bytes(task.tables[t].rows, e - s) for t, s, e in shards], dtype=np.float64)
    _, single = ev.compute_ms(enc)
    order = np.argsort(-single, kind="stable")
    scales = np.linspace(cfg.scale_min, cfg.scale_max, cfg.scale_steps)
    bound = scales[:, None] * widths.sum() / n  # [S, 1]
    k = len(scales)
    dev = np.zeros((k, n, enc.shape[1]))
    dims = np.zeros((k, n))
    used = np.zeros((k, n))
    alive = np.ones(k, dtype=bool)
    assign = np.full((k, len(shards)), -1)
    for i in order:
        _, after = ev.compute_ms(dev + enc[i])  # [S, D] predicted cost of each device with shard i added
        room = used + sizes[i] <= ev.capacity
        balanced = room & (dims + widths[i] <= bound)
        allowed = np.where(balanced.any(axis=1, keepdims=True), balanced, room)
        alive &= allowed.any(axis=1)
        choice = np.where(allowed, after, np.inf).argmin(axis=1)
        rows = np.arange(k)
        dev[rows, choice] += enc[i]
        dims[rows, choice] += widths[i]
        used[rows, choice] += sizes[i]
        assign[:, i] = choice
    if not alive.any():
        return None
    scores = np.where(alive, ev.score(dev, dims), np.inf)
    best = int(scores.argmin())
    return float(scores[best]), assign[best].tolist()


def backtracking_plan(ev: _Evaluator, shards: ShardSet) -> tuple[float, list[int]]:
    """The greedy preference (lowest predicted cost after adding) with backing up on memory dead ends."""
    slices = tuple(Table(f"{tb.name}[{s}:{e}]", tb.rows, e - s, tb.pooling_factor, tb.bins)
                   for tb, (_, s, e) in zip((ev.task.tables[t] for t, _, _ in shards), shards))
    shard_task = Task(ev.task.name, slices, ev.task.devices, ev.task.memory)
    enc = ev.encode(shards)
    _, single = ev.compute_ms(enc)
    order = np.argsort(-single, kind="stable").tolist()

    def rank(i: int, state: PlacementState) -> list[int]:
        _, after = ev.compute_ms(state.load + enc[i])
        return np.argsort(after, kind="stable").tolist()

    assignment = place_tables(shard_task, order, rank, weights=enc)
    dev = np.zeros((ev.task.num_devices, enc.shape[1]))
    dims = np.zeros(ev.task.num_devices)
    for i, d in enumerate(assignment):
        dev[d] += enc[i]
        dims[d] += shards[i][2] - shards[i][1]
    return float(ev.score(dev, dims)), assignment


def split_candidates(ev: _Evaluator, shards: ShardSet, count: int) -> list[int]:
    """Indices of the largest shards by size and by predicted cost that can be halved."""
    splittable = [i for i, (_, s, e) in enumerate(shards) if (e - s) >= 8 and (e - s) % 8 == 0]
    if not splittable:
        return []
    task = ev.task
    size = {i: task.memory.shard_bytes(task.tables[shards[i][0]].rows, shards[i][2] - shards[i][1]) for i in splittable}
    _, cost = ev.compute_ms(ev.encode(tuple(shards[i] for i in splittable)))
    by_cost = dict(zip(splittable, cost))
    top = sorted(splittable, key=lambda i: -size[i])[:count] + sorted(splittable, key=lambda i: -by_cost[i])[:count]
    return list(dict.fromkeys(top))


def halve(shards: ShardSet, i: int) -> ShardSet:
    t, s, e = shards[i]
    mid = s + (e - s) // 2
    return tuple(sorted(shards[:i] + ((t, s, mid), (t, mid, e)) + shards[i + 1:]))


@dataclass
class NeuroShardSharder:
    model: NeuroShardModel
    config: SearchConfig = SearchConfig()
    name: str = "neuroshard"

    def shard(self, task: Task) -> Plan:
        return with_pieces(task, self._shard)

    def _shard(self, task: Task) -> Plan:
        ev = _Evaluator(self.model, task)
        root: ShardSet = tuple((i, 0, t.dim) for i, t in enumerate(task.tables))
        found = greedy_grid(ev, root, self.config)
        if found is None:
            found = backtracking_plan(ev, root)  # raises InfeasibleTaskError when nothing fits
        best = (found[0], root, found[1])
        beams = [best]
        seen = {root}
        for _ in range(self.config.depth):
            children = []
            for _, shards, _ in beams:
                for i in split_candidates(ev, shards, self.config.candidates):
                    child = halve(shards, i)
                    if child in seen:
                        continue
                    seen.add(child)
                    result = greedy_grid(ev, child, self.config)
                    if result is not None:
                        children.append((result[0], child, result[1]))
            if not children:
                break
            children.sort(key=lambda c: c[0])
            beams = children[: self.config.beams]
            if beams[0][0] >= best[0]:
                break  # no split improves the best plan
            best = beams[0]
        _, shards, assignment = best
        return Plan(task.num_devices, tuple(Shard(task.tables[t].name, int(d), s, e)
                                            for (t, s, e), d in zip(shards, assignment)))

