"""Baseline sharders: random placement and one greedy parameterised by a key.

Greedy: tables in descending key order, each onto the device with the smallest
accumulated key that still has room (ties: less memory used, then lower index).
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dreamshard.placement import LazyRanking, PlacementState, by_least_load, place_tables
from dreamshard.plan import Plan
from dreamshard.sharders.pieces import with_pieces
from dreamshard.tasks import Task

# key(task, table index) -> float
TableKey = Callable[[Task, int], float]


def size_key(task: Task, i: int) -> float:
    return task.table_bytes(i) / 1024**3


def dim_key(task: Task, i: int) -> float:
    return float(task.tables[i].dim)


def lookup_key(task: Task, i: int) -> float:
    t = task.tables[i]
    return t.dim * t.pooling_factor


def size_lookup_key(task: Task, i: int) -> float:
    t = task.tables[i]
    return t.dim * t.pooling_factor * math.log10(t.rows)


GREEDY_KEYS: dict[str, TableKey] = {"size_greedy": size_key, "dim_greedy": dim_key, "lookup_greedy": lookup_key,
                                    "size_lookup_greedy": size_lookup_key}


def greedy_assignment(task: Task, key: TableKey) -> list[int]:
    """The greedy's device per table of `task` (module docstring), as place_tables finds it."""
    keys = [key(task, i) for i in range(len(task.tables))]
    order = sorted(range(len(keys)), key=lambda i: (-keys[i], i))
    return place_tables(task, order, by_least_load, weights=keys)


@dataclass(frozen=True)
class GreedySharder:
    name: str
    key: TableKey

    def shard(self, task: Task) -> Plan:
        return with_pieces(task, self._shard)

    def _shard(self, task: Task) -> Plan:
        return Plan.from_assignment(task, greedy_assignment(task, self.key))


@dataclass(frozen=True)
class RandomSharder:
    """Each table onto a uniformly random device with room; seeded per (seed, task name)."""

    seed: int = 0
    name: str = "random"

    def shard(self, task: Task) -> Plan:
        return with_pieces(task, self._shard)

    def _shard(self, task: Task) -> Plan:
        rng = np.random.default_rng([self.seed, zlib.crc32(task.name.encode())])
        order = rng.permutation(len(task.tables)).tolist()

        def random_devices(t: int, state: PlacementState) -> Sequence[int]:
            return RandomRanking(rng, len(state.load))

        return Plan.from_assignment(task, place_tables(task, order, random_devices))


class RandomRanking(LazyRanking):
    """`rng.permutation(n)`, drawn now, kept as its first device and the generator's state before the draw: the
    rest is drawn again from that state when the search backs up to it (a million tables on a thousand devices
    would otherwise keep gigabytes of permutations)."""

    def __init__(self, rng: np.random.Generator, n: int) -> None:
        state = rng.bit_generator.state
        self._rng_state = (state["state"]["state"], state["has_uint32"], state["uinteger"])
        self._rng = rng
        self._first = int(rng.permutation(n)[0])
        self._n = n
        self._order: list[int] | None = None

    def _full(self) -> list[int]:
        if self._order is None:
            bits = type(self._rng.bit_generator)()
            state: dict[str, Any] = dict(self._rng.bit_generator.state)
            at, has_uint32, uinteger = self._rng_state
            bits.state = {**state, "state": {**state["state"], "state": at}, "has_uint32": has_uint32,
                          "uinteger": uinteger}
            self._order = np.random.Generator(bits).permutation(self._n).tolist()
        return self._order
