"""tasks: split tables into disjoint train/validation/test pools and sample feasible tasks of each family (holdout
families: test tasks of distributions no model trains on, tasks.holdout)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from dreamshard.project.domain import tasks_to_arrow, write_parquet
from dreamshard.project.params import section
from dreamshard.project.tasks import POOLS, family_dims, holdout_settings, sample_family, sampling_inputs, task_families


def run(params: dict[str, Any]) -> None:
    families = task_families(params)
    stats, pools, dims, memory, seed = sampling_inputs(params)
    name_to_id = dict(zip(stats["name"], stats["table_id"]))
    out = Path(section(params, "paths.tasks"))
    _, holdout_dims = holdout_settings(params, family_dims(params))
    for split in POOLS:
        tasks = [t for fam in families for t in sample_family(stats, pools, fam, split, dims, memory, seed, holdout_dims)]
        write_parquet(tasks_to_arrow(tasks, split, name_to_id), out / f"{split}.parquet")
        print(f"tasks: {len(tasks)} {split} tasks from a pool of {len(pools[split])} tables "
              f"(and {len(pools['heavy'])} heavy ones) -> {out / f'{split}.parquet'}")
