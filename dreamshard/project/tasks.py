"""Drawing task families: the inputs every family's draw reads, and one family's tasks of a split."""
from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from dreamshard.data.sampling import TaskFamily, sample_tasks, split_table_pools
from dreamshard.memory import MemoryModel
from dreamshard.project.params import ParamsError, build, section
from dreamshard.tasks import Task


def task_families(params: dict[str, Any]) -> list[TaskFamily]:
    """The families of params.yaml's tasks.profile (a ParamsError names a profile that is not in tasks.profiles)."""
    cfg = section(params, "tasks")
    profile, profiles = cfg.get("profile"), cfg.get("profiles", {})
    if profile not in profiles:
        raise ParamsError(f"params.yaml: tasks.profile: {profile!r} is not one of tasks.profiles ({', '.join(profiles)})")
    return [build(TaskFamily, f, f"tasks.profiles.{profile}[{i}]") for i, f in enumerate(profiles[profile])]


def sample_family(stats: pd.DataFrame, pool: Sequence[int], family: TaskFamily, split: str, dims: Sequence[int],
                 memory: MemoryModel, seed: int) -> list[Task]:
    """`family`'s tasks of `split` (its num_train or num_test) drawn from the table ids in `pool`: one random
    stream per (family, split), so adding a family leaves the others' tasks unchanged."""
    rng = np.random.default_rng([seed, zlib.crc32(family.name.encode()), zlib.crc32(split.encode())])
    count = family.num_train if split == "train" else family.num_test
    return sample_tasks(stats, pool, family, count, split, dims, memory, rng)


def sampling_inputs(params: dict[str, Any]) -> tuple[pd.DataFrame, dict[str, list[int]], list[int], MemoryModel, int]:
    """What every family's draw reads: the table stats, the disjoint {"train", "test"} pools of table ids, the
    dims, the memory model and the seed (a bad value is a ParamsError naming its key)."""
    memory = build(MemoryModel, section(params, "memory"), "memory")
    dims = section(params, "tasks").get("dims")
    if not dims or any(not isinstance(d, int) or d < 4 or d % 4 for d in dims):
        raise ParamsError(f"params.yaml: tasks.dims: expected a list of positive multiples of 4, got {dims!r}")
    seed = int(section(params, "tasks.seed"))
    stats = pd.read_parquet(section(params, "paths.tables"))
    test_fraction = section(params, "tasks.test_fraction")
    pools = dict(zip(("train", "test"), split_table_pools(stats["table_id"].tolist(), test_fraction, seed)))
    return stats, pools, dims, memory, seed
