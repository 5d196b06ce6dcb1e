"""Drawing task families: the inputs every family's draw reads, and one family's tasks of a split."""
from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dreamshard.data.sampling import GROUPED_SPLITS, TaskFamily, sample_tasks, split_table_pools
from dreamshard.memory import MemoryModel
from dreamshard.project.params import ParamsError, build, section
from dreamshard.tasks import Task, read_tasks


def task_families(params: dict[str, Any]) -> list[TaskFamily]:
    """The families of params.yaml's tasks.profile (a ParamsError names a profile that is not in tasks.profiles)."""
    cfg = section(params, "tasks")
    profile, profiles = cfg.get("profile"), cfg.get("profiles", {})
    if profile not in profiles:
        raise ParamsError(f"params.yaml: tasks.profile: {profile!r} is not one of tasks.profiles ({', '.join(profiles)})")
    return [build(TaskFamily, f, f"tasks.profiles.{profile}[{i}]") for i, f in enumerate(profiles[profile])]


def sample_family(stats: pd.DataFrame, pool: Sequence[int], family: TaskFamily, split: str, dims: Sequence[int],
                 memory: MemoryModel, seed: int) -> list[Task]:
    """`family`'s tasks of `split` (its num_train, num_validation or num_test) drawn from the table ids in `pool`
    (validation and test tasks in disjoint table blocks, GROUPED_SPLITS): one random stream per (family, split), so
    adding a family leaves the others' tasks unchanged."""
    rng = np.random.default_rng([seed, zlib.crc32(family.name.encode()), zlib.crc32(split.encode())])
    return sample_tasks(stats, pool, family, family.count(split), split, dims, memory, rng,
                        grouped=split in GROUPED_SPLITS)


def sampling_inputs(params: dict[str, Any]) -> tuple[pd.DataFrame, dict[str, list[int]], list[int], MemoryModel, int]:
    """What every family's draw reads: the table stats, the disjoint {"train", "validation", "test"} pools of table
    ids, the dims, the memory model and the seed (a bad value is a ParamsError naming its key)."""
    memory = build(MemoryModel, section(params, "memory"), "memory")
    dims = section(params, "tasks").get("dims")
    if not dims or any(not isinstance(d, int) or d < 4 or d % 4 for d in dims):
        raise ParamsError(f"params.yaml: tasks.dims: expected a list of positive multiples of 4, got {dims!r}")
    seed = int(section(params, "tasks.seed"))
    stats = pd.read_parquet(section(params, "paths.tables"))
    test_fraction = section(params, "tasks.test_fraction")
    validation_fraction = section(params, "tasks.validation_fraction")
    try:
        pools = split_table_pools(stats["table_id"].tolist(), test_fraction, seed, validation_fraction)
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"params.yaml: tasks.test_fraction, tasks.validation_fraction: {exc}") from None
    return stats, pools, dims, memory, seed


def read_split(params: dict[str, Any], split: str) -> list[Task]:
    """The tasks stage's tasks of `split`, "train" or "validation" (paths.tasks/<split>.parquet). The test pool's
    one reader is the evaluation's (`dreamshard.project.evaluation.evaluated_tasks`): design never sees it."""
    if split not in ("train", "validation"):
        raise ValueError(f"read_split: expected train or validation, got {split!r} (test tasks are the evaluate "
                         "stage's alone)")
    return read_tasks(Path(section(params, "paths.tasks")) / f"{split}.parquet", section(params, "paths.tables"))
