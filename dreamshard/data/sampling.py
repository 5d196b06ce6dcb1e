"""Sampling train and test tasks from disjoint table pools."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from dreamshard.errors import InfeasibleTaskError
from dreamshard.memory import MemoryModel
from dreamshard.placement import find_feasible_assignment
from dreamshard.tasks import Task, stats_table


@dataclass(frozen=True)
class TaskFamily:
    """A kind of task: `num_tables` tables on `num_devices` devices of `memory_gb` each."""

    name: str
    num_tables: int
    num_devices: int
    memory_gb: float
    num_train: int
    num_test: int


def split_table_pools(table_ids: Sequence[int], test_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Shuffle table ids with `seed` and cut them into disjoint (train, test) pools."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    ids = np.array(sorted(table_ids))
    np.random.default_rng(seed).shuffle(ids)
    n_test = int(round(len(ids) * test_fraction))
    return sorted(ids[n_test:].tolist()), sorted(ids[:n_test].tolist())


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
) -> list[Task]:
    """Sample `count` feasible tasks of `family` from the table ids in `pool`.

    A task is kept only when a size-ordered placement with backtracking finds a
    plan within memory: the plan is the certificate that the task is feasible.
    """
    if family.num_tables > len(pool):
        raise ValueError(
            f"family {family.name!r}: needs {family.num_tables} tables per task but the {split} pool has {len(pool)}"
        )
    by_id = stats.set_index("table_id")
    tasks = []
    for k in range(count):
        for _ in range(max_tries):
            ids = rng.choice(np.asarray(pool), size=family.num_tables, replace=False)
            chosen_dims = rng.choice(np.asarray(dims), size=family.num_tables)
            tables = [stats_table(by_id.loc[int(i)], int(d)) for i, d in zip(ids, chosen_dims)]
            task = Task.uniform(f"{split}/{family.name}/{k:04d}", tables, family.num_devices,
                                family.memory_gb, memory, family.name)
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
