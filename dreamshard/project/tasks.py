"""Drawing task families: the inputs every family's draw reads, and one family's tasks of a split."""
from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dreamshard.data.sampling import (
    GROUPED_SPLITS,
    POOLS,
    TaskFamily,
    dims_ok,
    sample_tasks,
    split_heavy,
    split_table_pools,
)
from dreamshard.memory import MemoryModel
from dreamshard.project.params import ParamsError, build, section
from dreamshard.tasks import Task, read_tasks

__all__ = ["HEAVY", "POOLS", "base_dims", "family_dims", "holdout_settings", "read_split", "sample_family",
           "sampling_inputs", "split_heavy", "split_table_pools", "task_families"]


def task_families(params: dict[str, Any]) -> list[TaskFamily]:
    """The families of params.yaml's tasks.profile (a ParamsError names a profile that is not in tasks.profiles)."""
    cfg = section(params, "tasks")
    profile, profiles = cfg.get("profile"), cfg.get("profiles", {})
    if profile not in profiles:
        raise ParamsError(f"params.yaml: tasks.profile: {profile!r} is not one of tasks.profiles ({', '.join(profiles)})")
    return [build(TaskFamily, f, f"tasks.profiles.{profile}[{i}]") for i, f in enumerate(profiles[profile])]


HEAVY = "heavy"  # sampling_inputs' pool of the tables pooled beyond tasks.holdout.pooling_above


def sample_family(stats: pd.DataFrame, pools: dict[str, list[int]], family: TaskFamily, split: str,
                  dims: Sequence[int], memory: MemoryModel, seed: int, holdout_dims: Sequence[int] = ()) -> list[Task]:
    """`family`'s tasks of `split` (its num_train, num_validation or num_test) drawn from `pools[split]` (a holdout
    "pooling" family: from the heavy pool) at its own dims or else `dims` (a holdout "dims" family: at
    `holdout_dims`); validation and test tasks in disjoint table blocks (GROUPED_SPLITS); one random stream per
    (family, split), so adding a family leaves the others' tasks unchanged."""
    rng = np.random.default_rng([seed, zlib.crc32(family.name.encode()), zlib.crc32(split.encode())])
    dims = family.dims or dims
    pool = pools[HEAVY] if family.holdout == "pooling" else pools[split]
    if family.holdout == "pooling" and family.count(split) and not pool:
        raise ParamsError(f"params.yaml: tasks.holdout.pooling_above: family {family.name!r} draws the tables pooled "
                          "beyond it, but no table is (or tasks.holdout is absent)")
    if family.holdout == "dims":
        if not holdout_dims:
            raise ParamsError(f"params.yaml: tasks.holdout.dims: family {family.name!r} draws at holdout dims, but "
                              "tasks.holdout names none")
        dims = holdout_dims
    return sample_tasks(stats, pool, family, family.count(split), split, dims, memory, rng,
                        grouped=split in GROUPED_SPLITS)


def holdout_settings(params: dict[str, Any], dims: Sequence[int]) -> tuple[float, list[int]]:
    """tasks.holdout: (pooling_above, dims), checked: the holdout dims wider than every dim in `dims` (every
    family's: family_dims). Absent: no table is held out (inf, [])."""
    cfg = section(params, "tasks").get("holdout")
    if cfg is None:
        return math.inf, []
    if not isinstance(cfg, dict):
        raise ParamsError(f"params.yaml: tasks.holdout: expected a mapping with pooling_above and dims, got {cfg!r}")
    above, wide = cfg.get("pooling_above"), cfg.get("dims")
    if isinstance(above, bool) or not isinstance(above, (int, float)) or not above > 0:
        raise ParamsError(f"params.yaml: tasks.holdout.pooling_above: expected a positive pooling factor, got {above!r}")
    if not isinstance(wide, list) or not dims_ok(wide) or any(d <= max(dims) for d in wide):
        raise ParamsError(f"params.yaml: tasks.holdout.dims: expected a list of multiples of 4 wider than every dim "
                          f"of tasks.dims and the families' dims (max {max(dims)}), got {wide!r}")
    return float(above), wide


def base_dims(params: dict[str, Any]) -> list[int]:
    """tasks.dims, checked: the dims of every family that names none of its own."""
    dims = section(params, "tasks").get("dims")
    if not dims or not dims_ok(dims):
        raise ParamsError(f"params.yaml: tasks.dims: expected a list of positive multiples of 4, got {dims!r}")
    return [int(d) for d in dims]


def family_dims(params: dict[str, Any]) -> list[int]:
    """The dims tables take in the profile's (non-holdout) families, sorted: tasks.dims and the families' own
    (what the holdout dims must exceed). What training draws at is read off the training tasks (table_dims)."""
    base = base_dims(params)
    families = [f for f in task_families(params) if not f.holdout]
    return sorted({d for f in families for d in (f.dims or base)} | set(base))


def sampling_inputs(params: dict[str, Any]) -> tuple[pd.DataFrame, dict[str, list[int]], list[int], MemoryModel, int]:
    """What every family's draw reads: the table stats, the pools of table ids (the disjoint "train", "validation"
    and "test" of the tables pooled at most tasks.holdout.pooling_above, and HEAVY, the others), tasks.dims (the
    dims of families without their own), the memory model and the seed (a bad value is a ParamsError naming its
    key)."""
    memory = build(MemoryModel, section(params, "memory"), "memory")
    dims = base_dims(params)
    seed = int(section(params, "tasks.seed"))
    stats = pd.read_parquet(section(params, "paths.tables"))
    test_fraction = section(params, "tasks.test_fraction")
    validation_fraction = section(params, "tasks.validation_fraction")
    pooling_above, _ = holdout_settings(params, family_dims(params))
    light, heavy = split_heavy(stats["table_id"].tolist(), stats["pooling_factor"].tolist(), pooling_above)
    try:
        pools = split_table_pools(light, test_fraction, seed, validation_fraction)
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"params.yaml: tasks.test_fraction, tasks.validation_fraction: {exc}") from None
    return stats, {**pools, HEAVY: heavy}, dims, memory, seed


def read_split(params: dict[str, Any], split: str) -> list[Task]:
    """The tasks stage's tasks of `split`, "train" or "validation" (paths.tasks/<split>.parquet). The test pool's
    one reader is the evaluation's (`dreamshard.project.evaluation.evaluated_tasks`): design never sees it."""
    if split not in ("train", "validation"):
        raise ValueError(f"read_split: expected train or validation, got {split!r} (test tasks are the evaluate "
                         "stage's alone)")
    return read_tasks(Path(section(params, "paths.tasks")) / f"{split}.parquet", section(params, "paths.tables"))
