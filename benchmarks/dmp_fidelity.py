"""Does our cost order plans as TorchRec's DistributedModelParallel runs them? (issue 52, item 4)

    python -m benchmarks.dmp_fidelity --out results/dmp-fidelity [--tasks 10] [--rounds 5] [--models DIR]
                                      [--iterations N] [--seed 0] [--tables 8-30] [--root .] [--smoke]

Tasks: 2 devices, 8-30 tables (--tables) drawn from the training pool of the pipeline's synthetic tables (params
`data.synthetic`, split as stage `tasks` splits them: `tasks.*_fraction`, `tasks.seed`; never a test-pool
table), each at a dim of `tasks.dims`, their statistics and recorded lookups made as stages download and process
make them (first `process.sample_batch` samples). Tables of more than --max-rows rows are left out and a task's
weights kept under --max-task-mb, so that every plan's DMP model fits in memory at once. Each device holds
55-80% of its memory in tables (drawn per task), so that some plans cut tables; a task that size_greedy cannot
place whole is drawn again.

Plans: the heuristics, random (seeded), torchrec_model, TorchRec's own planners (torchrec, torchrec_full) and,
with --models DIR (DIR/dreamshard.pt, DIR/neuroshard.pt), dreamshard, dreamshard_cut and neuroshard; identical
plans (Plan.key) are measured once, named by their sharders joined by '='; a sharder that raises, or whose plan
TorchRec's export refuses, is listed with the reason and has no plan on either side.

DMP's time: one pair of gloo CPU processes (one thread each, spawned once for the whole run) runs every task.
Per task each rank builds every plan's DistributedModelParallel of the task's EmbeddingBagCollection (the export
of dreamshard.interop.torchrec, fused FBGEMM CPU kernels, fp32, SGD applied in the backward: exact_sgd; kept for
the whole task when their weights fit --dmp-memory-gb, else rebuilt at each turn) and times, in the turns
hardware.base.measure_rounds uses (A, B, C, then B, C, A, ...), `backend.fbgemm.warmup` steps and then
`backend.fbgemm.iterations` timed steps: a barrier, then the forward (input dist, lookups, output dist, waited
for) and the backward of a fixed output gradient (the output dist's backward, the lookups' backward with the
update). A step's time is the larger of the two ranks'; a round's reading the median step, a plan's time the
median round. The global batch is the backend's (`backend.batch_size`, half on each rank), made of the same
recorded lookups the backend's kernels read, so each table sees the batch our kernels see.

Our cost: the same plans measured by the pipeline's backend (params `backend`, fbgemm on this CPU) in the same
turns, right after DMP's readings of the task (never at the same time), with the all-to-all model's topology set
to the gloo link: before each task the ranks time all_to_all_single of 1 KB - 4 MB a peer, and latency_us and
intra_host_gbps are the least-squares line through those times (2 devices on one host).

Reported: Kendall tau of our cost against DMP's time over each task's plans, pooled over the tasks' pairs, beside
DMP against itself (its even rounds' medians against its odd rounds': how far its own readings repeat); per
task our best plan (the cheapest by our cost among ours: every sharder but random and TorchRec's) over
TorchRec's (torchrec_full, or torchrec where it failed) in both worlds; the pairs the two order differently.
Writes summary.json, README.md (its first line the answer) and dmp_fidelity.png to --out. --smoke: 2 tiny
tasks, 3 sharders, 1 round, batch 32 (the test's end-to-end run).
"""
from __future__ import annotations

import argparse
import json
import math
import queue
import socket
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.run_info import commit, machine

HEURISTICS = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy", "random")
TORCHREC = ("torchrec_full", "torchrec")  # TorchRec's own planners; the reference is the first that planned
SHARDERS = (*HEURISTICS, "torchrec_model", *TORCHREC)
LEARNED = ("dreamshard", "dreamshard_cut", "neuroshard")  # with --models
SMOKE_SHARDERS = ("size_greedy", "lookup_greedy", "torchrec_full")
NOT_OURS = ("random", *TORCHREC)  # plans that are not candidates for "our best plan"
FILL = (0.55, 0.80)  # share of the devices' memory the tables take, drawn per task
FIT_BYTES = tuple(2 ** k for k in range(10, 23, 2))  # all-to-all message sizes a peer: 1 KB .. 4 MB
SMOKE_FIT_BYTES = (1024, 1 << 18, 1 << 20)
TAU_GOAL, MARGIN, MIN_TASKS, MIN_PLANS = 0.7, 0.10, 10, 5  # issue 52's bar
MB = 1024 ** 2
GB = 1024 ** 3
DEVICES = 2
RANK_TIMEOUT_S = 3600.0  # one task's DMP readings, at most


@dataclass(frozen=True)
class Settings:
    """How DMP is timed (the ranks read these) and how tasks are drawn."""

    batch: int  # global batch, half on each rank (the backend's batch_size)
    warmup: int
    iterations: int
    rounds: int
    fit_bytes: tuple[int, ...]
    fit_reps: int
    learning_rate: float
    dmp_memory_bytes: int


# ---------------------------------------------------------------- the numbers (unit-tested on hand-made ones)

def parse_link(text: str) -> tuple[float, float]:
    """--link US,GBPS: a latency >= 0 microseconds and a bandwidth > 0 GB/s."""
    try:
        us, gbps = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected US,GBPS (two numbers), got {text!r}") from None
    if not (us >= 0 and gbps > 0):
        raise argparse.ArgumentTypeError(f"expected a latency >= 0 and a bandwidth > 0, got {text!r}")
    return us, gbps


def fit_link(sizes: list[int] | tuple[int, ...], ms: list[float]) -> dict[str, float]:
    """Least-squares line ms = latency + bytes / bandwidth through all-to-all times: latency_us, gbps (GB/s, 1e9
    bytes) and r2. A negative intercept is held at 0 (the slope refitted through the origin)."""
    x, y = np.asarray(sizes, dtype=np.float64), np.asarray(ms, dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    if intercept < 0:
        intercept, slope = 0.0, float((x * y).sum() / (x * x).sum())
    if slope <= 0:
        raise ValueError(f"all-to-all times do not grow with the bytes sent ({list(zip(sizes, ms))})")
    fitted = intercept + slope * x
    total = ((y - y.mean()) ** 2).sum()
    r2 = 1.0 - ((y - fitted) ** 2).sum() / total if total > 0 else 1.0
    return {"latency_us": float(intercept * 1e3), "gbps": float(1e-6 / slope), "r2": float(r2)}


def task_tau(ours: list[float], dmp: list[float]) -> float:
    """Kendall's tau-a of our costs against DMP's times over one task's plans (nan for fewer than 2)."""
    from dreamshard.project.learning import kendall_tau

    return kendall_tau(np.asarray(ours, dtype=np.float64), np.asarray(dmp, dtype=np.float64))


def pooled_tau(tasks: list[tuple[list[float], list[float]]]) -> float:
    """Tau over every task's pairs of plans at once (pairs of two tasks' plans are not compared): each task's tau
    weighted by its pairs."""
    pairs = [len(o) * (len(o) - 1) for o, _ in tasks]
    if sum(pairs) == 0:
        return float("nan")
    return float(sum(task_tau(o, d) * n for (o, d), n in zip(tasks, pairs) if n) / sum(pairs))


def round_halves(readings: list[list[float]]) -> tuple[list[float], list[float]] | None:
    """Each plan's median of its even rounds and of its odd rounds (None where a plan has fewer than 2 rounds)."""
    if not readings or min(len(r) for r in readings) < 2:
        return None
    return [lower_median(r[0::2]) for r in readings], [lower_median(r[1::2]) for r in readings]


def split_tau(readings: list[list[float]]) -> float:
    """DMP against itself: tau between the plans' medians of their even rounds and of their odd rounds (nan with
    fewer than 2 rounds or 2 plans). How well DMP's own readings repeat bounds how well any cost can order them."""
    halves = round_halves(readings)
    return task_tau(*halves) if halves is not None and len(readings) >= 2 else float("nan")


def best_vs_torchrec(names: list[str], ours: list[float], dmp: list[float]) -> dict[str, Any] | None:
    """Our best plan (the cheapest by our cost among ours: not random nor TorchRec's) over TorchRec's plan
    (torchrec_full, else torchrec) in both worlds; None without either. `names`: each plan's sharders, joined
    by '='."""
    def has(i: int, wanted: tuple[str, ...]) -> bool:
        return any(n in wanted for n in names[i].split("="))

    theirs = next((i for want in TORCHREC for i in range(len(names)) if want in names[i].split("=")), None)
    mine = [i for i in range(len(names)) if not all(n in NOT_OURS for n in names[i].split("="))]
    if theirs is None or not mine:
        return None
    best = min(mine, key=lambda i: ours[i])
    ratio_ours, ratio_dmp = ours[best] / ours[theirs], dmp[best] / dmp[theirs]
    claim = ratio_ours <= 1 - MARGIN  # our cost says ours beats TorchRec's by the margin or more
    return {"ours": names[best], "torchrec": names[theirs], "same_plan": best == theirs or has(best, TORCHREC),
            "ratio_our_cost": float(ratio_ours), "ratio_dmp": float(ratio_dmp), "claims_win": bool(claim),
            "dmp_agrees": bool(ratio_dmp < 1) if claim else None}


def disagreements(names: list[str], ours: list[float], dmp: list[float], min_gap: float = 0.0) -> list[dict]:
    """The pairs of plans our cost and DMP order differently, each with both relative gaps (the dearer over the
    cheaper, less 1), the clearest first (by the smaller of the two gaps); only those whose gaps are both at
    least `min_gap`."""
    out = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            if (ours[i] - ours[j]) * (dmp[i] - dmp[j]) < 0:
                cheap, dear = (i, j) if ours[i] < ours[j] else (j, i)
                gap_ours, gap_dmp = ours[dear] / ours[cheap] - 1, dmp[cheap] / dmp[dear] - 1
                if min(gap_ours, gap_dmp) >= min_gap:
                    out.append({"cheaper_by_our_cost": names[cheap], "cheaper_by_dmp": names[dear],
                                "our_gap": float(gap_ours), "dmp_gap": float(gap_dmp)})
    return sorted(out, key=lambda d: -min(d["our_gap"], d["dmp_gap"]))


def lower_median(values: list[float]) -> float:
    """The median, the lower of the two middle values for an even count (DMP times a step whole, not per device)."""
    return sorted(values)[(len(values) - 1) // 2]


def nan_if_none(value: float | None) -> float:
    return float("nan") if value is None else value


def geomean(values: list[float]) -> float:
    return float(math.exp(statistics.fmean(math.log(v) for v in values))) if values else float("nan")


# ---------------------------------------------------------------- tables and tasks

class TrainPool:
    """The pipeline's synthetic tables of the training pool, made as stages download and process make them:
    statistics of the generated batch, and its first `process.sample_batch` samples as the recorded lookups."""

    def __init__(self, params: dict[str, Any], max_rows: int) -> None:
        from dreamshard.project.data import SyntheticConfig, sample_table_profiles, synthetic_pooling
        from dreamshard.project.params import build, section
        from dreamshard.project.tasks import family_dims, holdout_settings, split_heavy, split_table_pools

        self.config = build(SyntheticConfig, section(params, "data.synthetic"), "data.synthetic")
        self.sample_batch = int(section(params, "process.sample_batch"))
        self.profiles = sample_table_profiles(self.config)
        # the tasks stage's pools: the tables pooled beyond tasks.holdout.pooling_above are left out first
        light, _ = split_heavy(list(range(len(self.profiles))), synthetic_pooling(self.config),
                               holdout_settings(params, family_dims(params))[0])
        train = split_table_pools(light, float(section(params, "tasks.test_fraction")),
                                  int(section(params, "tasks.seed")),
                                  float(section(params, "tasks.validation_fraction")))["train"]
        self.ids = [i for i in train if self.profiles[i].hash_size <= max_rows]
        self._made: dict[int, tuple[Any, Any]] = {}  # id -> (statistics, recorded requests)

    def _make(self, i: int) -> tuple[Any, Any]:
        if i not in self._made:
            from dreamshard.project.data import TableRequests, generate_lookups, table_seed, table_statistics

            indices, lengths = generate_lookups(self.profiles[i], self.config.batch_size,
                                                table_seed(self.config.seed, f"t{i}"))
            kept = int(lengths[:self.sample_batch].sum())
            self._made[i] = (table_statistics(indices, lengths),
                             TableRequests(indices[:kept], lengths[:self.sample_batch]))
        return self._made[i]

    def table(self, i: int, dim: int):
        """Table `i` at `dim` (named t<id>: the pipeline's name without its file stem, which TorchRec's module
        names would not take)."""
        from dreamshard.project.domain import Table

        s = self._make(i)[0]
        return Table(f"t{i:04d}", s.rows, int(dim), s.pooling_factor, bins=tuple(s.bins))

    def lookups(self, tables: list) -> Any:
        """The recorded lookups of `tables` (RecordedLookups, by name)."""
        from dreamshard.project.data import RecordedLookups

        return RecordedLookups({t.name: self._make(int(t.name[1:]))[1] for t in tables})


def draw_tasks(pool: TrainPool, params: dict[str, Any], count: int, tables: tuple[int, int], seed: int,
               max_task_bytes: int) -> list:
    """`count` tasks of 2 devices: tables from the pool at random dims of `tasks.dims`, each device's memory
    drawn so that the tables fill FILL of it; drawn again when over `max_task_bytes` or not placeable whole."""
    from dreamshard.project.domain import InfeasibleTaskError, MemoryModel, Task, table_sizes
    from dreamshard.project.params import build, section
    from dreamshard.project.sharders import make_sharder

    memory = build(MemoryModel, section(params, "memory"), "memory")
    dims = np.asarray(section(params, "tasks.dims"))
    greedy = make_sharder("size_greedy")
    lo, hi = tables
    if len(pool.ids) < hi:
        raise SystemExit(f"--tables {lo}-{hi}: the training pool has {len(pool.ids)} tables of at most --max-rows")
    out = []
    for k in range(count):
        rng = np.random.default_rng([seed, k])
        for _ in range(200):
            n = int(rng.integers(lo, hi + 1))
            ids = rng.choice(np.asarray(pool.ids), size=n, replace=False)
            chosen = [pool.table(int(i), int(d)) for i, d in zip(ids, rng.choice(dims, size=n))]
            fill = float(rng.uniform(*FILL))
            total = int(table_sizes(Task.uniform("probe", chosen, DEVICES, 1.0, memory)).sum())
            if total > max_task_bytes:
                continue
            per_device = total / fill / DEVICES / (1.0 - memory.reservation)
            task = Task.uniform(f"train/dmp-{n}-2/{k:04d}", chosen, DEVICES, per_device / GB, memory, f"dmp-{n}-2")
            try:
                greedy.shard(task)
            except InfeasibleTaskError:
                continue
            out.append(task)
            break
        else:
            raise SystemExit(f"task {k}: no task of {lo}-{hi} tables under --max-task-mb placeable whole in 200 draws")
    return out


def task_fill(task) -> float:
    from dreamshard.project.domain import table_sizes

    return float(table_sizes(task).sum() / sum(task.capacities()))


# ---------------------------------------------------------------- the plans

def make_sharders(params: dict[str, Any], names: tuple[str, ...], models: Path | None, seed: int) -> dict:
    """Each sharder named, as `evaluate` makes it (the options it takes: batch size, seed, params' cut and NeuroShard
    searches, `evaluate.decoding`), its checkpoint from `models`."""
    from dreamshard.project.evaluation import make_sharders as evaluated_sharders
    from dreamshard.project.params import section
    from dreamshard.project.sharders import spec

    needing = [n for n in names if spec(n).needs_model]
    if needing and models is None:
        raise SystemExit(f"sharder {needing[0]}: needs a trained model; give --models DIR")
    paths = {n: models / f"{spec(n).trained_as}.pt" for n in needing} if models is not None else {}
    made = evaluated_sharders(params, int(section(params, "backend.batch_size")), list(names), paths, seed)
    return dict(zip(names, made))


def plan_task(task, sharders: dict) -> tuple[list[str], list, dict[str, str], dict[str, float]]:
    """Every sharder's plan of `task`, identical plans once (named `a=b`), plans TorchRec cannot export for CPU
    ranks left out: (names, plans, {sharder: why it has no plan}, {sharder: planning seconds})."""
    from dreamshard.project.torchrec import quiet_torchrec, to_torchrec_plan

    names: list[str] = []
    plans: list = []
    failed: dict[str, str] = {}
    seconds: dict[str, float] = {}
    keys: dict[Any, int] = {}
    for name, sharder in sharders.items():
        start = time.perf_counter()
        try:
            with quiet_torchrec():
                plan = sharder.shard(task)
                to_torchrec_plan(task, plan, device_type="cpu")  # DMP runs it: else left out
        except Exception as exc:  # noqa: BLE001  # a sharder's failure is a finding, not the run's end
            failed[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            continue
        finally:
            seconds[name] = time.perf_counter() - start
        key = plan.key()
        if key in keys:
            names[keys[key]] += f"={name}"
        else:
            keys[key] = len(plans)
            names.append(name)
            plans.append(plan)
    return names, plans, failed, seconds


def cuts(plan) -> bool:
    return len(plan.shards) > len({s.table for s in plan.shards})


# ---------------------------------------------------------------- the ranks (spawned: gloo, one thread)

def _cpu_sharder():
    """TorchRec's EBC sharder, offering row-wise blocks on CPU ranks too (it offers them on CUDA only; its CPU
    kernels run them)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    class CpuSharder(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type):
            extra = ["row_wise", "table_row_wise", "grid_shard"]
            return list(dict.fromkeys([*super().sharding_types(compute_device_type), *extra]))

    return CpuSharder()


def _build_dmp(task, plan, learning_rate: float):
    """`plan`'s DistributedModelParallel of the task's EBC (module `ebc`), SGD in the backward, weights seeded
    uniform in [-0.01, 0.01] (the backend's range)."""
    import torch
    from torchrec.distributed import DistributedModelParallel
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from dreamshard.project.torchrec import meta_ebc, to_torchrec_plan

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = meta_ebc(task)

        def forward(self, features):
            return self.ebc(features)

    model = Model()
    apply_optimizer_in_backward(torch.optim.SGD, model.ebc.parameters(), {"lr": learning_rate})
    sharder = _cpu_sharder()
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=to_torchrec_plan(task, plan,
                                   device_type="cpu"), sharders=[sharder])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in dmp.state_dict().items():
            if ".embedding_bags." in name and name.endswith(".weight"):
                for t in ([s.tensor for s in tensor.local_shards()] if hasattr(tensor, "local_shards") else [tensor]):
                    t.uniform_(-0.01, 0.01, generator=gen)
    return dmp


def _rank_batch(task, requests: dict[str, tuple[np.ndarray, np.ndarray]], rank: int, batch: int):
    """This rank's half of the global batch: samples [rank B/2, (rank + 1) B/2) of every table's lookups."""
    import torch
    from torchrec import KeyedJaggedTensor

    half = batch // DEVICES
    values, lengths = [], []
    for t in task.tables:
        idx, lens = requests[t.name]
        offsets = np.concatenate([[0], np.cumsum(lens)])
        lo, hi = rank * half, (rank + 1) * half
        values.append(idx[offsets[lo]:offsets[hi]])
        lengths.append(lens[lo:hi])
    return KeyedJaggedTensor.from_lengths_sync(keys=[t.name for t in task.tables],
                                               values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
                                               lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int64)))


def _link_times(sizes: tuple[int, ...], reps: int) -> list[float]:
    """Median ms of all_to_all_single sending `size` bytes to the other rank (and as many to itself), the
    larger of the two ranks' times, per size."""
    import torch
    import torch.distributed as dist

    out = []
    for size in sizes:
        n = max(1, size // 4)
        send, recv = torch.zeros(DEVICES * n), torch.empty(DEVICES * n)
        for _ in range(3):
            dist.all_to_all_single(recv, send)
        times = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_to_all_single(recv, send)
            times.append((time.perf_counter() - t0) * 1e3)
        worst = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        out.append(float(worst.median()))
    return out


def _time_plans(rank: int, job: dict[str, Any]) -> dict[str, Any]:
    """DMP's readings of one task's plans, in turns (module docstring)."""
    import torch
    import torch.distributed as dist

    from dreamshard.project.domain import table_sizes
    from dreamshard.project.hardware import turns

    task, plans, s = job["task"], job["plans"], Settings(**job["settings"])
    sizes = list(s.fit_bytes)
    link_ms = _link_times(tuple(sizes), s.fit_reps)
    features = _rank_batch(task, job["requests"], rank, s.batch)
    width = sum(t.dim for t in task.tables)
    grad = torch.randn((s.batch // DEVICES, width), generator=torch.Generator().manual_seed(1 + rank)) * 0.01
    keep = len(plans) * int(table_sizes(task).sum()) <= s.dmp_memory_bytes
    built: dict[int, Any] = {}
    build_s: list[float] = []

    def model(j: int):
        if j in built:
            return built[j]
        if not keep:
            built.clear()
        start = time.perf_counter()
        dmp = _build_dmp(task, plans[j], s.learning_rate)
        build_s.append(time.perf_counter() - start)
        built[j] = dmp
        return dmp

    def step(dmp) -> tuple[float, float]:
        t0 = time.perf_counter()
        out = dmp(features).values()  # input dist, lookups, output dist, waited for
        t1 = time.perf_counter()
        out.backward(grad)  # the output dist's backward, the lookups' backward with the SGD update
        return t1 - t0, time.perf_counter() - t1

    readings: list[list[dict[str, float]]] = [[] for _ in plans]
    if keep:
        for j in range(len(plans)):
            model(j)
    for _, j in turns(len(plans), s.rounds):
        dmp = model(j)
        for _ in range(s.warmup):
            step(dmp)
        times = []
        for _ in range(s.iterations):
            dist.barrier()
            times.append(step(dmp))
        dist.barrier()
        worst = torch.tensor([[f, b, f + b] for f, b in times], dtype=torch.float64) * 1e3
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # each step: the slower rank's
        fwd, bwd, total = (float(worst[:, k].median()) for k in range(3))
        readings[j].append({"ms": total, "fwd_ms": fwd, "bwd_ms": bwd})
    built.clear()
    return {"link_bytes": sizes, "link_ms": link_ms, "readings": readings, "models_kept": keep,
            "build_s_median": statistics.median(build_s) if build_s else 0.0}


def _rank_loop(rank: int, port: int, inbox, outbox) -> None:
    """One rank: joins the gloo group, then runs the tasks the parent sends until it sends None."""
    import warnings

    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # TorchRec's calls of renamed collectives

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=DEVICES)
        from dreamshard.project.torchrec import quiet_torchrec

        with quiet_torchrec():
            outbox.put(("ready", rank, None))
            while (job := inbox.get()) is not None:
                result = _time_plans(rank, job)
                if rank == 0:
                    outbox.put(("done", rank, result))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  # the parent reports it, and stops the other rank
        outbox.put(("error", rank, traceback.format_exc()))


class RankPair:
    """The two gloo ranks, spawned once; `run` sends both a task and waits for rank 0's readings."""

    def __init__(self) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.inboxes = [ctx.Queue() for _ in range(DEVICES)]
        self.outbox = ctx.Queue()
        self.procs = [ctx.Process(target=_rank_loop, args=(r, port, self.inboxes[r], self.outbox), daemon=True)
                      for r in range(DEVICES)]
        for p in self.procs:
            p.start()
        self.ready = 0

    def _get(self, timeout: float) -> tuple[str, int, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                kind, rank, payload = self.outbox.get(timeout=2.0)
            except queue.Empty:
                if any(not p.is_alive() for p in self.procs):
                    raise RuntimeError("a DMP rank died without a word (out of memory?)") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no word from the DMP ranks in {timeout:.0f} s") from None
                continue
            if kind == "error":
                raise RuntimeError(f"DMP rank {rank} failed:\n{payload}")
            return kind, rank, payload

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        while self.ready < DEVICES:
            self._get(600.0)
            self.ready += 1
        for box in self.inboxes:
            box.put(job)
        return self._get(RANK_TIMEOUT_S)[2]

    def close(self) -> None:
        for box in self.inboxes:
            box.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():  # our own child: stopped by its handle
                p.terminate()
                p.join(timeout=10)


# ---------------------------------------------------------------- our side

def link_topology(fit: dict[str, float]) -> dict[str, Any]:
    """backend.topology for 2 devices on one host joined by the fitted gloo link."""
    return {"devices_per_host": DEVICES, "intra_host_gbps": fit["gbps"], "inter_host_gbps": fit["gbps"],
            "latency_us": fit["latency_us"], "output_bytes": 4}


def our_costs(params: dict[str, Any], task, plans: list, lookups, fit: dict[str, float], rounds: int):
    """The plans measured by the params' backend with the fitted link, in turns: (each plan's median PlanCost,
    the backend)."""
    import copy

    from dreamshard.project.backend import backend_of
    from dreamshard.project.hardware import measure_rounds, median_cost

    with_link = copy.deepcopy(params)
    with_link["backend"]["topology"] = link_topology(fit)
    backend = backend_of(with_link, lookups)
    return measure_rounds(backend, task, plans, rounds, median_cost), backend


# ---------------------------------------------------------------- the run

def parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    a, b = int(lo), int(hi or lo)
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"expected LOW-HIGH tables with 1 <= LOW <= HIGH, got {text!r}")
    return a, b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.dmp_fidelity", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("results/dmp-fidelity"))
    ap.add_argument("--root", type=Path, default=Path("."), help="the project whose params.yaml is used")
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", type=Path, default=None,
                    help="folder of dreamshard.pt and neuroshard.pt: adds dreamshard, dreamshard_cut, neuroshard")
    ap.add_argument("--iterations", type=int, default=None,
                    help="timed steps a reading, DMP's and our backend's (default: backend.fbgemm.iterations)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tables", type=parse_range, default=(8, 30), metavar="LOW-HIGH")
    ap.add_argument("--max-rows", type=int, default=200_000, help="pool tables of at most this many rows")
    ap.add_argument("--max-task-mb", type=float, default=256.0, help="a task's weights at most (fp32 MB)")
    ap.add_argument("--dmp-memory-gb", type=float, default=4.0,
                    help="keep every plan's DMP model of a task while their weights fit this; else rebuild each turn")
    ap.add_argument("--sharders", default=None,
                    help=f"comma-separated, instead of {','.join(SHARDERS)} (and {','.join(LEARNED)} with --models)")
    ap.add_argument("--smoke", action="store_true", help="2 tiny tasks, 3 sharders, 1 round, batch 32")
    ap.add_argument("--link", type=parse_link, default=None, metavar="US,GBPS",
                    help="price our all-to-all at this latency (us) and bandwidth (GB/s) instead of the fit of the "
                         "gloo link's measured times (still measured and recorded)")
    args = ap.parse_args(argv)
    if args.tasks < 1 or args.rounds < 1:
        ap.error("--tasks and --rounds: expected at least 1")
    from dreamshard.project.backend import huge_pages_from_params

    huge_pages_from_params(str(args.root / "params.yaml"))  # before torch is imported (the ranks inherit it)
    started = time.perf_counter()
    from dreamshard.project.params import load_params, section

    params = load_params(args.root / "params.yaml")
    names = tuple(args.sharders.split(",")) if args.sharders else SHARDERS + (LEARNED if args.models else ())
    if args.smoke:
        args.tasks, args.rounds, args.tables, args.max_rows, names = 2, 1, (4, 6), 20_000, SMOKE_SHARDERS
        params["backend"]["batch_size"] = 32
        params["backend"]["fbgemm"] = {**params["backend"]["fbgemm"], "warmup": 1, "iterations": 2}
    if args.iterations is not None:
        if args.iterations < 1:
            ap.error("--iterations: expected at least 1")
        params["backend"]["fbgemm"] = {**params["backend"]["fbgemm"], "iterations": args.iterations}
    fbgemm = section(params, "backend.fbgemm")
    settings = Settings(batch=int(section(params, "backend.batch_size")), warmup=int(fbgemm["warmup"]),
                        iterations=int(fbgemm["iterations"]), rounds=args.rounds,
                        fit_bytes=SMOKE_FIT_BYTES if args.smoke else FIT_BYTES, fit_reps=10 if args.smoke else 30,
                        learning_rate=0.01,
                        dmp_memory_bytes=int(args.dmp_memory_gb * GB))
    if settings.batch % DEVICES:
        raise SystemExit(f"backend.batch_size {settings.batch}: expected a multiple of {DEVICES} (half a rank)")
    command = " ".join(["python -m benchmarks.dmp_fidelity", *(sys.argv[1:] if argv is None else argv)])

    if args.models:
        missing = [str(args.models / f"{m}.pt") for m in ("dreamshard", "neuroshard") if not (args.models / f"{m}.pt").is_file()]
        if missing:
            raise SystemExit(f"--models {args.models}: no {', '.join(missing)}")
    ranks = RankPair()  # they import torch and TorchRec while the tasks are drawn and planned
    try:
        pool = TrainPool(params, args.max_rows)
        tasks = draw_tasks(pool, params, args.tasks, args.tables, args.seed, int(args.max_task_mb * MB))
        sharders = make_sharders(params, names, args.models, args.seed)
        rows, backend = [], None
        for k, task in enumerate(tasks):
            plan_names, plans, failed, planning_s = plan_task(task, sharders)
            lookups = pool.lookups(list(task.tables))
            requests = {t.name: (np.asarray(r.indices), np.asarray(r.lengths))
                        for t in task.tables for r in [lookups.lookups(t, settings.batch)]}
            t0 = time.perf_counter()
            dmp = ranks.run({"task": task, "plans": plans, "requests": requests, "settings": vars(settings)})
            dmp_s = time.perf_counter() - t0
            fit = fit_link(dmp["link_bytes"], dmp["link_ms"]) if args.link is None else \
                {"latency_us": args.link[0], "gbps": args.link[1], "r2": float("nan"), "given": True}
            t0 = time.perf_counter()
            costs, backend = our_costs(params, task, plans, lookups, fit, args.rounds)
            ours_s = time.perf_counter() - t0
            row = task_row(task, plan_names, plans, failed, planning_s, costs, dmp, fit)
            row["seconds"] = {"dmp": dmp_s, "ours": ours_s, "planning": sum(planning_s.values())}
            rows.append(row)
            print(f"task {k + 1}/{len(tasks)} {task.name}: {len(plans)} plans, tau {row['tau']:.2f}, link "
                  f"{fit['latency_us']:.0f} us + {fit['gbps']:.2f} GB/s; DMP {dmp_s:.0f} s, ours {ours_s:.0f} s",
                  flush=True)
    finally:
        ranks.close()
    summary = summarise(rows, {"command": command, "commit": commit(), "machine": machine(),
                               "date": time.strftime("%Y-%m-%d"),
                               "device": backend.device_name() if backend else "",
                               "versions": backend.versions() if backend else {}, "settings": {
                                   k: list(v) if isinstance(v, tuple) else v for k, v in vars(settings).items()},
                               "sharders": list(names), "seed": args.seed, "tables": list(args.tables),
                               "max_rows": args.max_rows, "max_task_mb": args.max_task_mb, "smoke": args.smoke,
                               "total_seconds": time.perf_counter() - started})
    write_outputs(summary, args.out)
    print(readme(summary).split("\n")[0])
    return 0


def task_row(task, names: list[str], plans: list, failed: dict, planning_s: dict, costs: list, dmp: dict,
             fit: dict) -> dict[str, Any]:
    ours = [c.cost_ms for c in costs]
    times = [lower_median([r["ms"] for r in readings]) for readings in dmp["readings"]]
    plan_rows = []
    for name, plan, cost, readings, t in zip(names, plans, costs, dmp["readings"], times):
        worst = max(range(len(cost.devices)), key=lambda d: cost.devices[d].total_ms)
        dev = cost.devices[worst]
        plan_rows.append({"sharder": name, "cuts": cuts(plan), "shards": len(plan.shards), "our_cost_ms": cost.cost_ms,
                          "our_compute_ms": dev.fwd_ms + dev.bwd_ms, "our_comm_ms": dev.fwd_comm_ms + dev.bwd_comm_ms,
                          "dmp_ms": t, "dmp_ms_rounds": [r["ms"] for r in readings],
                          "dmp_fwd_ms": lower_median([r["fwd_ms"] for r in readings]),
                          "dmp_bwd_ms": lower_median([r["bwd_ms"] for r in readings])})
    return {"task": task.name, "tables": len(task.tables), "fill": task_fill(task),
            "memory_gb_per_device": task.devices[0].memory_bytes / GB, "plans": plan_rows, "failed": failed,
            "planning_s": planning_s, "link": {**fit, "bytes": dmp["link_bytes"], "ms": dmp["link_ms"]},
            "models_kept": dmp["models_kept"], "dmp_build_s_median": dmp["build_s_median"],
            "tau": task_tau(ours, times), "dmp_split_tau": split_tau([[r["ms"] for r in rd] for rd in dmp["readings"]]),
            "vs_torchrec": best_vs_torchrec(names, ours, times),
            "disagreements": disagreements(names, ours, times)}


def summarise(rows: list[dict], run: dict[str, Any]) -> dict[str, Any]:
    pairs = [([p["our_cost_ms"] for p in r["plans"]], [p["dmp_ms"] for p in r["plans"]]) for r in rows]
    taus = [r["tau"] for r in rows if not math.isnan(r["tau"])]
    versus = [r["vs_torchrec"] for r in rows if r["vs_torchrec"]]
    claims = [v for v in versus if v["claims_win"]]
    all_ours = [c for o, _ in pairs for c in o]
    all_dmp = [t for _, d in pairs for t in d]
    pooled = pooled_tau(pairs)
    halves = [h for r in rows if (h := round_halves([p["dmp_ms_rounds"] for p in r["plans"]])) is not None]
    criteria = {"tasks": len(rows), "min_plans": min((len(r["plans"]) for r in rows), default=0),
                "pooled_tau": pooled, "claims": len(claims), "claims_dmp_agrees": sum(v["dmp_agrees"] for v in claims)}
    criteria["met"] = bool(criteria["tasks"] >= MIN_TASKS and criteria["min_plans"] >= MIN_PLANS
                           and pooled >= TAU_GOAL and criteria["claims_dmp_agrees"] == len(claims))
    return {"run": run, "tasks": rows, "pooled_tau": pooled,
            "dmp_split_tau": pooled_tau(halves) if halves else float("nan"),
            "mean_task_tau": statistics.fmean(taus) if taus else None,
            "min_task_tau": min(taus, default=None), "all_plans_tau": task_tau(all_ours, all_dmp),
            "best_over_torchrec": {"tasks": len(versus),
                                   "our_cost_geomean": geomean([v["ratio_our_cost"] for v in versus]),
                                   "dmp_geomean": geomean([v["ratio_dmp"] for v in versus])},
            "criteria": criteria}


def readme(summary: dict[str, Any]) -> str:
    c, bt, run = summary["criteria"], summary["best_over_torchrec"], summary["run"]
    rows = summary["tasks"]
    clear = [dict(d, task=r["task"]) for r in rows for d in r["disagreements"] if min(d["our_gap"], d["dmp_gap"]) >= 0.05]
    verdict = "yes" if c["met"] else ("no" if c["tasks"] >= MIN_TASKS and c["min_plans"] >= MIN_PLANS else
                                     "not settled (fewer tasks or plans than the issue's bar)")
    answer = (f"**Answer: {verdict}: Kendall tau of our cost against DMP's measured time {c['pooled_tau']:.2f} over "
              f"{c['tasks']} tasks' pairs of plans (per task " + ", ".join(f"{r['tau']:.2f}" for r in rows)
              + f"; bar {TAU_GOAL}); DMP's even rounds against its odd ones: tau "
              f"{nan_if_none(summary.get('dmp_split_tau')):.2f}; our best plan over TorchRec's: "
              f"{bt['our_cost_geomean']:.3f} by our cost, "
              f"{bt['dmp_geomean']:.3f} in DMP (geometric means over {bt['tasks']} tasks); where our cost has ours "
              f"{MARGIN:.0%} or more cheaper ({c['claims']} tasks), DMP agrees on {c['claims_dmp_agrees']}; "
              f"{len(clear)} pairs of plans ordered the other way by both 5% or more.**")
    s = run["settings"]
    lines = [answer, "", "# Our cost against TorchRec's DistributedModelParallel running the plans", "",
             f"- `{run['command']}`: commit {run['commit']}, {run['date']}, {run['machine']}; {run['device']}; "
             f"{json.dumps(run['versions'])}; {run['total_seconds']:.0f} s in all.",
             f"- 2 gloo CPU ranks, one thread each; global batch {s['batch']} ({s['batch'] // DEVICES} a rank), "
             f"{s['warmup']} warm-up and {s['iterations']} timed steps a reading, {s['rounds']} interleaved rounds "
             "(medians); our cost: params `backend` (fbgemm) in the same turns, the all-to-all over the fitted gloo "
             "link. How each is timed: benchmarks/dmp_fidelity.py's docstring.",
             f"- Tasks: {run['tables'][0]}-{run['tables'][1]} training-pool tables of at most {run['max_rows']:,} "
             f"rows, 2 devices filled {FILL[0]:.0%}-{FILL[1]:.0%}, at most {run['max_task_mb']:g} MB of weights; "
             f"sharders {', '.join(run['sharders'])}.",
             f"- Criteria (issue 52): tau >= {TAU_GOAL} over >= {MIN_TASKS} tasks x >= {MIN_PLANS} plans: "
             f"{c['tasks']} tasks, at least {c['min_plans']} plans each, pooled tau {c['pooled_tau']:.2f} (mean per "
             f"task {nan_if_none(summary['mean_task_tau']):.2f}, least {nan_if_none(summary['min_task_tau']):.2f}; "
             f"over all plans of all tasks {summary['all_plans_tau']:.2f}); sign agreed on "
             f"{c['claims_dmp_agrees']} of {c['claims']} claimed wins: {'met' if c['met'] else 'not met'}.", "",
             "| task | tables | fill | plans | tau | DMP self | our best | TorchRec's | ours / TorchRec's: our cost | "
             "DMP | link (us + GB/s, r2) |", "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---|"]
    for r in rows:
        v, lk = r["vs_torchrec"], r["link"]
        cells = ([v["ours"], v["torchrec"], f"{v['ratio_our_cost']:.3f}", f"{v['ratio_dmp']:.3f}"] if v
                 else ["", "", "", ""])
        lines.append(f"| {r['task']} | {r['tables']} | {r['fill']:.0%} | {len(r['plans'])} | {r['tau']:.2f} | "
                     f"{nan_if_none(r.get('dmp_split_tau')):.2f} | "
                     + " | ".join(cells) + f" | {lk['latency_us']:.0f} + {lk['gbps']:.2f} ({lk['r2']:.2f}) |")
    lines += ["", "## Where the two disagree", "",
              "Pairs of plans of one task that our cost and DMP order the other way, both by 5% or more, the "
              "clearest first (all of them, with smaller gaps too, in summary.json):", ""]
    if clear:
        lines += ["| task | cheaper by our cost | cheaper in DMP | our gap | DMP gap |", "|---|---|---|---:|---:|"]
        lines += [f"| {d['task']} | {d['cheaper_by_our_cost']} | {d['cheaper_by_dmp']} | {d['our_gap']:.1%} | "
                  f"{d['dmp_gap']:.1%} |" for d in clear[:15]]
        if len(clear) > 15:
            lines.append(f"\n... and {len(clear) - 15} more.")
    else:
        lines.append("None.")
    lines += ["", "## Per sharder", "",
              "Geometric means over the tasks it planned: its plan over the task's cheapest, in each world, and DMP's "
              "time over our cost (every plan's ms, forward and backward apart: summary.json).", "",
              "| sharder | tasks | with cuts | our cost / task's least | DMP / task's least | DMP / our cost |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, g in sharder_table(rows).items():
        lines.append(f"| {name} | {g['tasks']} | {g['with_cuts']} | {g['our_over_least']:.3f} | "
                     f"{g['dmp_over_least']:.3f} | {g['dmp_over_ours']:.2f} |")
    failed = sorted({f"{n}: {why}" for r in rows for n, why in r["failed"].items()})
    if failed:
        lines += ["", "Sharders without a plan on some task: " + "; ".join(failed[:10])]
    lines += ["", "![our cost against DMP's time, per task](dmp_fidelity.png)", ""]
    return "\n".join(lines)


def sharder_table(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """Per sharder (a plan named a=b counts for both): tasks, tasks its plan cuts tables in, and the geometric means
    of its plan over the task's cheapest by our cost and in DMP, and of DMP's time over our cost."""
    seen: dict[str, list[tuple[float, float, float, bool]]] = {}
    for r in rows:
        least_ours = min(p["our_cost_ms"] for p in r["plans"])
        least_dmp = min(p["dmp_ms"] for p in r["plans"])
        for p in r["plans"]:
            for name in p["sharder"].split("="):
                seen.setdefault(name, []).append((p["our_cost_ms"] / least_ours, p["dmp_ms"] / least_dmp,
                                                  p["dmp_ms"] / p["our_cost_ms"], p["cuts"]))
    return {name: {"tasks": len(v), "with_cuts": sum(c for *_, c in v),
                   "our_over_least": geomean([o for o, _, _, _ in v]), "dmp_over_least": geomean([d for _, d, _, _ in v]),
                   "dmp_over_ours": geomean([x for _, _, x, _ in v])} for name, v in seen.items()}


def figure(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    from dreamshard.project.domain import atomic_path

    rows = summary["tasks"]
    cols = min(5, max(1, len(rows)))
    nrows = -(-len(rows) // cols) if rows else 1
    fig, axes = plt.subplots(nrows, cols, figsize=(max(6.0, 3.2 * cols), 3.0 * nrows + 0.4), squeeze=False)
    for ax, r in zip(axes.flat, rows):
        x = [p["our_cost_ms"] for p in r["plans"]]
        y = [p["dmp_ms"] for p in r["plans"]]
        colours = ["tab:red" if any(n in TORCHREC for n in p["sharder"].split("=")) else "tab:blue" for p in r["plans"]]
        ax.scatter(x, y, c=colours, s=18)
        for p, xi, yi in zip(r["plans"], x, y):
            ax.annotate(p["sharder"].split("=")[0], (xi, yi), fontsize=5, alpha=0.7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{r['task'].split('/')[-2]}/{r['task'].split('/')[-1]}: tau {r['tau']:.2f}", fontsize=8)
        for axis in (ax.xaxis, ax.yaxis):  # short labels, on the minor ticks too (a task's plans span < 10x)
            axis.set_major_formatter(FormatStrFormatter("%g"))
            axis.set_minor_formatter(FormatStrFormatter("%g"))
        ax.tick_params(which="both", labelsize=6)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(rows):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("DMP ms (step)", fontsize=7)
    for ax in axes[-1, :]:
        ax.set_xlabel("our cost ms", fontsize=7)
    fig.suptitle("Our cost against DMP's time, per task (log-log; red: TorchRec's)", fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def write_outputs(summary: dict[str, Any], out: Path) -> None:
    from dreamshard.project.domain import write_text

    write_text(json.dumps(summary, separators=(",", ":"), allow_nan=True) + "\n", out / "summary.json")
    write_text(readme(summary), out / "README.md")
    figure(summary, out / "dmp_fidelity.png")


if __name__ == "__main__":
    raise SystemExit(main())
