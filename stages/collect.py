"""collect: measure plans of the training tasks with the cost backend -> data/costs/.

Resumable: measured chunks go to data/costs/journal/ at once (the output is `persist`ed
in dvc.yaml, so DVC keeps it across an interrupted run); a rerun measures only the plans
whose rows are missing, then merges everything into plans.parquet and devices.parquet.

`run` measures the chunks one after another in this process. The pipeline's flow
(pipeline/collect.py) uses the same pieces to measure them anywhere: `prepare` says what
is missing, in deterministic chunks; `CollectJob.chunk_backend` is the backend to ship
with a chunk; the caller journals each chunk's rows; `finish` merges. The merged files
follow the plans' order, so they are the same bytes whoever measured the chunks.
"""
from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm import tqdm

from dreamshard.project.backend import backend_of
from dreamshard.project.collection import (
    COMM_MODEL_VERSION,
    CostJournal,
    PlanToMeasure,
    measure_chunk,
    pending_chunks,
    plans_to_measure,
)
from dreamshard.project.data import RecordedLookups
from dreamshard.project.domain import DreamShardError, read_tasks, write_parquet
from dreamshard.project.hardware import CostBackend
from dreamshard.project.params import ParamsError, section


@dataclass
class CollectJob:
    """One run of the stage: the plans, the backend, the journal and what is still missing."""

    backend: CostBackend
    items: list[PlanToMeasure]
    journal: CostJournal
    chunks: list[list[PlanToMeasure]]  # the plans not yet journaled, in deterministic chunks
    extra: dict  # columns added to every row
    out: Path
    rounds: int  # measurements of each plan, in turns within its chunk (collect.measure_chunk)

    @property
    def missing(self) -> int:
        return sum(len(c) for c in self.chunks)

    def chunk_backend(self, chunk: Sequence[PlanToMeasure]) -> CostBackend:
        """The backend to send with `chunk` to a worker: recorded lookups cut down to the chunk's tables.

        A remote worker needs no files then, and receives no more lookups than it uses.
        Backends without recorded lookups (analytic) are sent as they are.
        """
        lookups = getattr(self.backend, "lookups", None)
        if not isinstance(lookups, RecordedLookups):
            return self.backend
        names = {t.name for item in chunk for t in item.task.tables}
        shipped = copy.copy(self.backend)
        shipped.lookups = RecordedLookups({n: r for n, r in lookups.by_name.items() if n in names})
        return shipped


def prepare(params: dict[str, Any]) -> CollectJob:
    cfg = section(params, "collect")
    for key in ("num_plans", "chunk_size", "seed", "rounds"):
        if not isinstance(cfg.get(key), int) or isinstance(cfg.get(key), bool) or cfg[key] < (0 if key == "seed" else 1):
            raise ParamsError(f"params.yaml: collect.{key}: expected a positive integer, got {cfg.get(key)!r}")
    backend = backend_of(params)
    tasks = read_tasks(Path(section(params, "paths.tasks")) / "train.parquet", section(params, "paths.tables"))
    extra = {"batch_size": int(section(params, "backend.batch_size")), "seed": cfg["seed"]}
    # plans measured with other backend settings must not be reused
    fingerprint = json.dumps({"backend": section(params, "backend"), "versions": backend.versions(),
                              "comm_model": COMM_MODEL_VERSION,
                              "device": backend.device_name(), "rounds": cfg["rounds"]}, sort_keys=True)
    perturb = float(section(params, "collect.perturb_fraction"))
    items = plans_to_measure(tasks, cfg["num_plans"], perturb, cfg["seed"], fingerprint,
                             float(section(params, "collect.cut_fraction")),
                             float(section(params, "collect.row_fraction")))
    out = Path(section(params, "paths.costs"))
    journal = CostJournal(out / "journal")
    chunks = pending_chunks(items, journal.done_ids(), cfg["chunk_size"])
    job = CollectJob(backend, items, journal, chunks, extra, out, cfg["rounds"])
    print(f"collect: {len(items)} plans on {len(tasks)} training tasks, {job.missing} to measure "
          f"in {len(chunks)} chunk(s), {cfg['rounds']} round(s) each, with {backend.name} on {backend.device_name()}")
    return job


def finish(job: CollectJob) -> None:
    """Merge the journal into plans.parquet and devices.parquet (in the plans' order); drop the journal."""
    ids = [it.plan_id for it in job.items]
    plans = job.journal.read("plans", ids)
    devices = job.journal.read("devices", ids)
    missing = len(set(ids) - set(plans["plan_id"]))
    if missing:
        raise DreamShardError(f"collect: {missing} plan(s) have no rows in {job.journal.folder}; rerun to measure them")
    write_parquet(pa.Table.from_pandas(plans, preserve_index=False), job.out / "plans.parquet")
    write_parquet(pa.Table.from_pandas(devices, preserve_index=False), job.out / "devices.parquet")
    shutil.rmtree(job.journal.folder, ignore_errors=True)
    print(f"collect: {len(plans)} plans, {len(devices)} device rows -> {job.out}")


def run(params: dict[str, Any]) -> None:
    """The whole stage in this process, chunk after chunk."""
    job = prepare(params)
    with tqdm(total=job.missing, desc="collect", unit="plan") as bar:
        for chunk in job.chunks:
            job.journal.write_chunk(*measure_chunk(job.backend, chunk, job.extra, job.rounds, on_plan=bar.update))
    finish(job)
