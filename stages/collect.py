"""collect: measure plans of the training tasks with the cost backend -> data/costs/.

Resumable: measured chunks go to data/costs/journal/ at once (the output is `persist`ed
in dvc.yaml, so DVC keeps it across an interrupted run); a rerun measures only the plans
whose rows are missing, then merges everything into plans.parquet and devices.parquet.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm import tqdm

from dreamshard.collect import CostJournal, collect, plans_to_measure
from dreamshard.io import write_parquet
from dreamshard.tasks import read_tasks
from stages.common import ParamsError, make_stage_backend, section


def run(params: dict[str, Any]) -> None:
    cfg = section(params, "collect")
    for key in ("num_plans", "chunk_size", "seed"):
        if not isinstance(cfg.get(key), int) or cfg[key] < (0 if key == "seed" else 1):
            raise ParamsError(f"params.yaml: collect.{key}: expected a positive integer, got {cfg.get(key)!r}")
    backend = make_stage_backend(params)
    tasks = read_tasks(Path(section(params, "paths.tasks")) / "train.parquet", section(params, "paths.tables"))
    extra = {"batch_size": int(section(params, "backend.batch_size")), "seed": cfg["seed"]}
    # plans measured with other backend settings must not be reused
    fingerprint = json.dumps({"backend": section(params, "backend"), "versions": backend.versions(),
                              "device": backend.device_name()}, sort_keys=True)
    items = plans_to_measure(tasks, cfg["num_plans"], float(cfg.get("perturb_fraction", 0.5)), cfg["seed"], fingerprint)
    out = Path(section(params, "paths.costs"))
    journal = CostJournal(out / "journal")
    done = journal.done_ids()
    missing = len({it.plan_id for it in items} - done)
    print(f"collect: {len(items)} plans on {len(tasks)} training tasks, {missing} to measure "
          f"with {backend.name} on {backend.device_name()}")
    with tqdm(total=missing, desc="collect", unit="plan") as bar:
        collect(backend, items, journal, cfg["chunk_size"], extra, on_plan=lambda: bar.update())
    ids = [it.plan_id for it in items]
    plans = journal.read("plans", ids)
    devices = journal.read("devices", ids)
    write_parquet(pa.Table.from_pandas(plans, preserve_index=False), out / "plans.parquet")
    write_parquet(pa.Table.from_pandas(devices, preserve_index=False), out / "devices.parquet")
    shutil.rmtree(journal.folder)
    print(f"collect: {len(plans)} plans, {len(devices)} device rows -> {out}")
