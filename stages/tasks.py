"""tasks: split tables into disjoint train/test pools and sample feasible tasks of each family."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from dreamshard.project.domain import tasks_to_arrow, write_parquet
from dreamshard.project.params import section
from dreamshard.project.tasks import sample_family, sampling_inputs, task_families


def run(params: dict[str, Any]) -> None:
    families = task_families(params)
    stats, pools, dims, memory, seed = sampling_inputs(params)
    name_to_id = dict(zip(stats["name"], stats["table_id"]))
    out = Path(section(params, "paths.tasks"))
    for split, pool in pools.items():
        tasks = [t for fam in families for t in sample_family(stats, pool, fam, split, dims, memory, seed)]
        write_parquet(tasks_to_arrow(tasks, split, name_to_id), out / f"{split}.parquet")
        print(f"tasks: {len(tasks)} {split} tasks from a pool of {len(pool)} tables -> {out / f'{split}.parquet'}")
