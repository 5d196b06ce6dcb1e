"""collect_devices: single-device measurements for the cost models -> `paths.single_devices`/devices.parquet.

Random sets of training tables at random dims, each measured as one fused operator
(dreamshard/learning/devices.py). DreamShard's cost network (train_cost, and its refits while
the policies train) and NeuroShard's compute model learn from them; they are counted apart
from the real plan measurements of `collect`.

Resumable: measured chunks are journaled at once in a folder named by everything that decides
the rows (backend settings, device, versions, this stage's params, the tables drawn from); the
output is `persist`ed in dvc.yaml, so a rerun after an interruption measures only the missing
samples, and a run under other settings starts a new journal instead of reusing rows.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm import tqdm

from dreamshard.project.backend import backend_of
from dreamshard.project.domain import DreamShardError, read_tasks, table_dims, table_pool, write_parquet
from dreamshard.project.learning import DeviceJournal, device_samples, measure_samples, pending
from dreamshard.project.params import ParamsError, section

KEYS = {"seed": 0, "samples": 1, "max_tables": 1, "chunk_size": 1, "rounds": 1}  # integer params and their least values


def run(params: dict[str, Any]) -> None:
    cfg = section(params, "collect_devices")
    for key, low in KEYS.items():
        value = cfg.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ParamsError(f"params.yaml: collect_devices.{key}: expected an integer >= {low}, got {value!r}")
    cap = cfg.get("memory_cap_gb")
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise ParamsError(f"params.yaml: collect_devices.memory_cap_gb: expected a number > 0, got {cap!r}")
    tasks = read_tasks(Path(section(params, "paths.tasks")) / "train.parquet", section(params, "paths.tables"))
    pool = table_pool(tasks)
    dims = table_dims(tasks)
    samples = device_samples(pool, cfg["samples"], cfg["max_tables"], float(cap), dims, tasks[0], cfg["seed"])
    backend = backend_of(params)
    extra = {"batch_size": int(section(params, "backend.batch_size")), "seed": cfg["seed"]}
    fingerprint = json.dumps({"backend": section(params, "backend"), "versions": backend.versions(),
                              "device": backend.device_name(), "collect_devices": cfg, "dims": dims,
                              "memory": dataclasses.asdict(tasks[0].memory), "pool": [t.name for t in pool]},
                             sort_keys=True, default=str)
    out = Path(section(params, "paths.single_devices"))
    journal = DeviceJournal(out / f"journal-{hashlib.sha1(fingerprint.encode()).hexdigest()[:12]}")
    chunks = pending(samples, journal.done(), cfg["chunk_size"])
    todo = sum(len(c) for c in chunks)
    print(f"collect_devices: {len(samples)} samples of up to {cfg['max_tables']} tables, {todo} to measure "
          f"({cfg['rounds']} round(s) each, in turns within a chunk) "
          f"with {backend.name} on {backend.device_name()}")
    with tqdm(total=todo, desc="collect_devices", unit="device") as bar:
        for chunk in chunks:
            journal.write_chunk(measure_samples(backend, chunk, tasks[0], extra, cfg["rounds"], on_sample=bar.update))
    rows = journal.read(samples)
    if len(rows) != len(samples):
        raise DreamShardError(f"collect_devices: {len(samples) - len(rows)} sample(s) have no rows in "
                              f"{journal.folder}; rerun to measure them")
    write_parquet(pa.Table.from_pandas(rows, preserve_index=False), out / "devices.parquet")
    for old in out.glob("journal-*"):  # this run's journal is merged; others hold rows of other settings
        shutil.rmtree(old, ignore_errors=True)
    print(f"collect_devices: {len(rows)} single-device measurements -> {out / 'devices.parquet'}")
