"""Sampling train, validation and test tasks from disjoint table pools (docs/tasks.md)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dreamshard.errors import InfeasibleTaskError
from dreamshard.memory import MemoryModel
from dreamshard.placement import find_feasible_assignment
from dreamshard.tasks import ALL_SHARDING_KINDS, SHARDING_KINDS, Task, host_names, stats_table


@dataclass(frozen=True)
class TaskFamily:
    """A kind of task: `num_tables` tables on `num_devices` devices of `memory_gb` each."""

    name: str
    num_tables: int
    num_devices: int
    memory_gb: float
    num_train: int
    num_test: int
    num_validation: int = 0
    # a distribution no model trains or is designed on (tasks.holdout): "pooling" draws the tables pooled more
    # heavily than any training table, "dims" draws test tables at dims wider than any training dim; test only
    holdout: str = ""
    # the dims its tables take (a training family spanning wider dims than the test families); () for tasks.dims
    dims: tuple[int, ...] = ()
    # its devices named by host, this many a host (0: none named; the comm model then counts hosts by
    # backend.topology.devices_per_host alike); and the sharding kinds its tasks allow (Task.sharding; () for
    # table, column, row): "host", TorchRec's table_row_wise, needs devices named on two hosts or more
    devices_per_host: int = 0
    sharding: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.dims, (list, tuple)) or not dims_ok(self.dims):
            raise ValueError(f"family {self.name!r}: dims: expected a list of positive multiples of 4, got {self.dims!r}")
        object.__setattr__(self, "dims", tuple(self.dims))
        if self.holdout and self.dims:
            raise ValueError(f"family {self.name!r}: a holdout family takes its dims from tasks.holdout, not dims")
        if self.holdout not in HOLDOUTS:
            raise ValueError(f"family {self.name!r}: holdout: expected one of {', '.join(map(repr, HOLDOUTS))}, "
                             f"got {self.holdout!r}")
        per_host = self.devices_per_host
        try:
            host_names(self.num_devices, per_host)
        except ValueError as exc:
            raise ValueError(f"family {self.name!r}: {exc}") from None
        if not isinstance(self.sharding, (list, tuple)) or any(k not in ALL_SHARDING_KINDS for k in self.sharding) \
                or (self.sharding and "table" not in self.sharding):
            raise ValueError(f"family {self.name!r}: sharding: expected a list of {', '.join(ALL_SHARDING_KINDS)} "
                             f"with table, got {self.sharding!r}")
        object.__setattr__(self, "sharding", tuple(self.sharding) or SHARDING_KINDS)
        if "host" in self.sharding and not (per_host and self.num_devices // per_host >= 2):
            raise ValueError(f"family {self.name!r}: sharding host (row-wise over one host's devices) needs "
                             f"devices_per_host naming two hosts or more, got {per_host} of {self.num_devices} devices")
        if self.holdout and (self.num_train or self.num_validation):
            raise ValueError(f"family {self.name!r}: a holdout family is test only: num_train and num_validation "
                             f"must be 0, got {self.num_train} and {self.num_validation}")

    def count(self, split: str) -> int:
        """How many tasks of `split` (one of POOLS) the family draws."""
        return {"train": self.num_train, "validation": self.num_validation, "test": self.num_test}[split]


def dims_ok(dims: Sequence[object]) -> bool:
    """Every dim a positive multiple of 4 (an int, not a bool): FBGEMM aligns rows to 4 columns."""
    return all(isinstance(d, int) and not isinstance(d, bool) and d >= 4 and d % 4 == 0 for d in dims)


HOLDOUTS = ("", "pooling", "dims")
POOLS = ("train", "validation", "test")  # disjoint table pools: models learn from train, design reads validation,
# only the evaluate stage reads test (tests/unit/test_pools.py holds it)
# splits whose tasks are drawn in disjoint table blocks (sample_tasks), so that their intervals can respect shared tables
GROUPED_SPLITS = ("validation", "test")


def split_table_pools(table_ids: Sequence[int], test_fraction: float, seed: int,
                      validation_fraction: float = 0.0) -> dict[str, list[int]]:
    """Shuffle table ids with `seed` and cut them into disjoint pools {"train", "validation", "test"}: the first
    `test_fraction` of the shuffled ids are test, the next `validation_fraction` validation, the rest train."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if not 0.0 <= validation_fraction < 1.0 - test_fraction:
        raise ValueError(f"validation_fraction must be in [0, 1 - test_fraction = {1 - test_fraction:g}), "
                         f"got {validation_fraction}")
    ids = np.array(sorted(table_ids))
    np.random.default_rng(seed).shuffle(ids)
    n_test = int(round(len(ids) * test_fraction))
    n_val = int(round(len(ids) * validation_fraction))
    return {"train": sorted(ids[n_test + n_val:].tolist()), "validation": sorted(ids[n_test:n_test + n_val].tolist()),
            "test": sorted(ids[:n_test].tolist())}


def split_heavy(table_ids: Sequence[int], pooling: Sequence[float], pooling_above: float) -> tuple[list[int], list[int]]:
    """(ids of tables pooled at most `pooling_above`, ids of those above it): the second never trains nor is
    designed on; only holdout "pooling" families draw them."""
    light = [int(i) for i, p in zip(table_ids, pooling) if p <= pooling_above]
    heavy = [int(i) for i, p in zip(table_ids, pooling) if p > pooling_above]
    return light, heavy


def table_blocks(pool: Sequence[int], num_tables: int, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """`pool` shuffled and cut into as many disjoint blocks of at least `num_tables` ids as it holds, at most
    `count`: task k of a grouped split draws from block k mod len(blocks), so tasks of different blocks share no
    table, and with `count` blocks no two tasks share one."""
    ids = np.asarray(pool).copy()
    rng.shuffle(ids)
    return np.array_split(ids, max(1, min(count, len(ids) // num_tables)))


def sample_tasks(
    stats: pd.DataFrame,
    pool: Sequence[int],
    family: TaskFamily,
    count: int,
    split: str,
    dims: Sequence[int],
    memory: MemoryModel,
    rng: np.random.Generator,
    max_tries: int = 100,
    grouped: bool = False,
) -> list[Task]:
    """Sample `count` feasible tasks of `family` from the table ids in `pool`; `grouped`: task k draws from the
    k-th of table_blocks' disjoint blocks (round robin), so tasks share tables only within a block.

    A task is kept only when a size-ordered placement with backtracking finds a
    plan within memory: the plan is the certificate that the task is feasible.
    """
    if count and family.num_tables > len(pool):
        raise ValueError(
            f"family {family.name!r}: needs {family.num_tables} tables per task but the {split} pool has {len(pool)}"
        )
    by_id = stats.set_index("table_id")
    blocks = table_blocks(pool, family.num_tables, count, rng) if grouped else [np.asarray(pool)]
    tasks = []
    for k in range(count):
        for _ in range(max_tries):
            ids = rng.choice(blocks[k % len(blocks)], size=family.num_tables, replace=False)
            chosen_dims = rng.choice(np.asarray(dims), size=family.num_tables)
            tables = [stats_table(by_id.loc[int(i)], int(d)) for i, d in zip(ids, chosen_dims)]
            task = Task.uniform(f"{split}/{family.name}/{k:04d}", tables, family.num_devices,
                                family.memory_gb, memory, family.name, family.devices_per_host, family.sharding)
            try:
                find_feasible_assignment(task)
            except InfeasibleTaskError:
                continue
            tasks.append(task)
            break
        else:
            raise InfeasibleTaskError(
                f"family {family.name!r}: no feasible task in {max_tries} samples; "
                f"{family.memory_gb} GB per device is too little for {family.num_tables} tables"
            )
    return tasks
