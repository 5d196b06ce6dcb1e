"""The collect stage as Prefect flows: chunks of plans mapped over a measurement task.

`collect` (the stage's flow, `python -m pipeline collect`) reads the runner from
params.yaml `orchestration.collect` and runs `collect-measure` with that task runner:

    runner: local, processes: false  -> ThreadPoolTaskRunner(max_workers=workers)   (default, workers: 1)
    runner: local, processes: true   -> ProcessPoolTaskRunner(max_workers=workers)
    runner: dask,  address: tcp://…  -> prefect_dask.DaskTaskRunner(address=…): an existing cluster
    runner: dask,  address: null     -> DaskTaskRunner on a temporary LocalCluster of `workers` processes

`collect-measure` cuts the missing plans into the stage's chunks (collect.chunk_size),
maps `measure-chunk` over them (with `retries`), and journals each chunk in this process
as soon as it finishes, so a worker needs neither the data files nor write access: each
chunk travels with its own backend (recorded lookups cut down to its tables). A chunk
that still fails after its retries is reported (CollectError) once every other chunk
has finished and been journaled; a rerun measures only what is missing. The merged
files follow the plans' order, so they are the same bytes whichever runner produced them.

GPUs: with `gpus_per_chunk: 1` each chunk asks Dask for the worker resource `GPU`, so a
worker started with `--resources GPU=1` and its own `CUDA_VISIBLE_DEVICES` measures one
chunk at a time on its one GPU (docs/gpu-cluster.md). `orchestration` is not a DVC
dependency: it changes where the chunks are measured, never what the stage writes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner
from prefect.utilities.annotations import unmapped

from dreamshard.project.collection import PlanToMeasure, measure_chunk
from dreamshard.project.domain import DreamShardError
from dreamshard.project.hardware import CostBackend
from dreamshard.project.params import build, load_params

RUNNERS = ("local", "dask")


class CollectError(DreamShardError):
    """Some chunks could not be measured; the others are journaled."""


@dataclass(frozen=True)
class RunnerConfig:
    """params.yaml `orchestration.collect`."""

    runner: str = "local"  # local | dask
    workers: int = 1  # local: chunks measured at once; dask without address: LocalCluster processes
    processes: bool = False  # local: a process pool instead of threads
    address: str | None = None  # dask: scheduler address of an existing cluster (tcp://host:8786)
    gpus_per_chunk: float = 0  # dask: worker resource `GPU` each chunk holds while it runs
    retries: int = 2  # per chunk, after its first attempt
    retry_delay_s: float = 5.0

    def __post_init__(self) -> None:
        if self.runner not in RUNNERS:
            raise ValueError(f"runner: expected one of {', '.join(RUNNERS)}, got {self.runner!r}")
        for name, low in (("workers", 1), ("retries", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
        if not isinstance(self.gpus_per_chunk, (int, float)) or self.gpus_per_chunk < 0:
            raise ValueError(f"gpus_per_chunk: expected a number >= 0, got {self.gpus_per_chunk!r}")
        if self.gpus_per_chunk and not (self.runner == "dask" and self.address):
            raise ValueError("gpus_per_chunk: needs runner 'dask' with the address of a cluster whose workers were "
                             "started with --resources GPU=1, one per GPU (docs/gpu-cluster.md)")


def runner_config(params: dict[str, Any]) -> RunnerConfig:
    values = (params.get("orchestration") or {}).get("collect") or {}
    return build(RunnerConfig, values, "orchestration.collect")


def make_task_runner(cfg: RunnerConfig) -> TaskRunner:
    if cfg.runner == "dask":
        from prefect_dask import DaskTaskRunner

        if cfg.address:
            return DaskTaskRunner(address=cfg.address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": cfg.workers, "threads_per_worker": 1, "processes": True})
    if cfg.processes:
        return ProcessPoolTaskRunner(max_workers=cfg.workers)
    return ThreadPoolTaskRunner(max_workers=cfg.workers)


@task(name="measure-chunk", task_run_name="measure-chunk-{index}", cache_policy=NO_CACHE, persist_result=False)
def measure_chunk_task(index: int, backend: CostBackend, chunk: list[PlanToMeasure],
                       extra: dict, rounds: int) -> tuple[list[dict], list[dict]]:
    """The rows of one chunk, each plan measured `rounds` times, wherever the task runner put this task."""
    from dreamshard.project.hardware import pin_threads

    pin_threads(backend)  # a worker process starts with torch's default thread count
    return measure_chunk(backend, chunk, extra, rounds)


@flow(name="collect-measure")
def measure_flow(params_file: str = "params.yaml") -> dict[str, int]:
    """Measure the missing chunks with this flow's task runner, journal them, merge."""
    from tqdm import tqdm

    from stages import collect as stage

    params = load_params(params_file)
    cfg = runner_config(params)
    job = stage.prepare(params)
    measure = measure_chunk_task.with_options(retries=cfg.retries, retry_delay_seconds=cfg.retry_delay_s)
    indices = list(range(len(job.chunks)))
    backends = [job.chunk_backend(c) for c in job.chunks]
    if not job.chunks:  # everything is journaled already (a run stopped before merging)
        futures = []
    elif cfg.gpus_per_chunk:
        import dask

        with dask.annotate(resources={"GPU": cfg.gpus_per_chunk}):
            futures = measure.map(indices, backends, job.chunks, unmapped(job.extra), unmapped(job.rounds))
    else:
        futures = measure.map(indices, backends, job.chunks, unmapped(job.extra), unmapped(job.rounds))
    index_of = {f.task_run_id: i for i, f in zip(indices, futures, strict=True)}
    failed: dict[int, BaseException] = {}
    with tqdm(total=job.missing, desc="collect", unit="plan") as bar:
        for future in as_completed(list(futures)):
            i = index_of[future.task_run_id]
            try:
                plan_rows, device_rows = future.result()
            except Exception as exc:  # reported below, once the other chunks are journaled
                failed[i] = exc
                continue
            job.journal.write_chunk(plan_rows, device_rows)
            bar.update(len(job.chunks[i]))
    if failed:
        first = min(failed)
        raise CollectError(
            f"{len(failed)} of {len(job.chunks)} chunk(s) failed after {cfg.retries} retr"
            f"{'y' if cfg.retries == 1 else 'ies'} (chunks {sorted(failed)}); the {len(job.chunks) - len(failed)} "
            f"finished chunk(s) are journaled in {job.journal.folder} and a rerun measures only the missing plans. "
            f"Chunk {first}: {type(failed[first]).__name__}: {failed[first]}")
    stage.finish(job)
    return {"plans": len(job.items), "measured": job.missing, "chunks": len(job.chunks)}


@flow(name="collect")
def collect_flow(params_file: str = "params.yaml") -> dict[str, int]:
    """The collect stage: `collect-measure` on the task runner that params.yaml chooses."""
    cfg = runner_config(load_params(params_file))
    return measure_flow.with_options(task_runner=make_task_runner(cfg))(params_file=params_file)
