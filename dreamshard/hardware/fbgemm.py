"""Real-kernel cost backend: FBGEMM's fused embedding operator (TBE) on CPU or CUDA.

Each logical device of a plan becomes one TBE operator holding all its shards, timed forward and backward
(median of `iterations` after `warmup`) on the one physical device this process runs on; communication
comes from dreamshard.hardware.comm. The protocol, the thread-count rule and what FBGEMM supports on CPU:
docs/cost-backends.md.
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import time
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

import numpy as np

from dreamshard.errors import DreamShardError, InvalidPlanError, OverBudgetError
from dreamshard.hardware.allocator import HUGE_PAGES_ENV, huge_pages_enabled
from dreamshard.hardware.base import ComputeCost, PlanCost
from dreamshard.hardware.comm import Topology, assemble_plan_cost, communication_ms
from dreamshard.memory import DEFAULT_BATCH_SIZE, GB
from dreamshard.plan import Plan, Shard, check_shard_block, lookup_kind
from dreamshard.tables import Table
from dreamshard.tasks import Task

if TYPE_CHECKING:  # LookupSource is a Protocol; only needed for annotations
    from dreamshard.data.lookups import LookupSource

DEVICES = ("cpu", "cuda")
WEIGHT_MEMORY = ("reused", "fresh", "zeroed")  # FbgemmConfig.weight_memory
LOOKUP_GROUPS = ("device", "kind")  # FbgemmConfig.lookup_groups
# our optimizer name -> FBGEMM EmbOptimType member name
OPTIMIZERS = {
    "exact_sgd": "EXACT_SGD",
    "exact_row_wise_adagrad": "EXACT_ROWWISE_ADAGRAD",
    "exact_adagrad": "EXACT_ADAGRAD",
    "adam": "ADAM",
}
PRECISIONS = {"fp32": "FP32", "fp16": "FP16"}
# (precision, optimizer) pairs FBGEMM's CPU kernels run; CUDA runs all of OPTIMIZERS x PRECISIONS
CPU_SUPPORTED = frozenset(
    (p, o) for p in PRECISIONS for o in ("exact_sgd", "exact_row_wise_adagrad", "exact_adagrad")
)
INIT_RANGE = 0.01  # the rows lookups read start uniform in [-INIT_RANGE, INIT_RANGE] (FBGEMM's own start: zeros)
SHARD_INPUT_CACHE_BYTES = 512 << 20  # FbgemmBackend.shard_inputs keeps at most this much, the latest used
INIT_BLOCK = 1 << 20  # values drawn once from the seeded generator, then repeated over the rows read


@dataclass(frozen=True)
class FbgemmConfig:
    batch_size: int = DEFAULT_BATCH_SIZE
    warmup: int = 3
    iterations: int = 15
    threads: int = 1  # CPU threads of a measurement: torch.get_num_threads() must equal it (see pin_threads)
    huge_pages: bool = False  # CPU: torch allocates weights on transparent huge pages (dreamshard.hardware.allocator)
    device: str = "cpu"  # "cpu" or "cuda"
    memory_budget_gb: float = 4.0  # refuse to build an operator whose weights + optimizer state exceed this
    learning_rate: float = 0.01
    topology: Topology = field(default_factory=Topology)
    # CPU: where an operator's weights live. reused: one buffer kept across builds (its pages touched once);
    # fresh: a new unwritten buffer each build; zeroed: FBGEMM's own, every byte zeroed (benchmarks.weight_init)
    weight_memory: str = "reused"
    # a device's pooled shards: "kind", one TBE per TorchRec sharding kind (whole tables, column slices, row blocks),
    # as TorchRec's lookup groups run them; "device", one TBE for all of them (results/lookup-groups)
    lookup_groups: str = "kind"

    def __post_init__(self) -> None:
        for name, low in (("batch_size", 1), ("warmup", 0), ("iterations", 1), ("threads", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
        if not isinstance(self.huge_pages, bool):
            raise ValueError(f"huge_pages: expected true or false, got {self.huge_pages!r}")
        if self.weight_memory not in WEIGHT_MEMORY:
            raise ValueError(f"weight_memory: expected one of {', '.join(WEIGHT_MEMORY)}, got {self.weight_memory!r}")
        if self.lookup_groups not in LOOKUP_GROUPS:
            raise ValueError(f"lookup_groups: expected one of {', '.join(LOOKUP_GROUPS)}, got {self.lookup_groups!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device: expected one of {', '.join(DEVICES)}, got {self.device!r}")
        for name in ("memory_budget_gb", "learning_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")
        if not isinstance(self.topology, Topology):
            raise ValueError(f"topology: expected a dreamshard.hardware.comm.Topology, got {type(self.topology).__name__}")


@dataclass(eq=False)
class ShardInputs:
    """One shard's lookups (FbgemmBackend.shard_inputs): ids rebased to its first row and per-sample lengths, both
    read-only, and the sorted distinct rows they read (the rows a CPU build fills), found when first asked for."""

    indices: np.ndarray
    lengths: np.ndarray
    _read_rows: np.ndarray | None = None

    @property
    def read_rows(self) -> np.ndarray:
        if self._read_rows is None:
            self._read_rows = np.unique(self.indices)
            self._read_rows.setflags(write=False)
        return self._read_rows

    @property
    def nbytes(self) -> int:
        """What it holds once its rows read are found: at most its ids twice and its lengths."""
        return 2 * self.indices.nbytes + self.lengths.nbytes


@dataclass(frozen=True)
class Samples:
    """Per-iteration timings of one fused operator, ms."""

    fwd_ms: tuple[float, ...]
    bwd_ms: tuple[float, ...]

    def median(self) -> ComputeCost:
        return ComputeCost(float(statistics.median(self.fwd_ms)), float(statistics.median(self.bwd_ms)))

    def __add__(self, other: Samples) -> Samples:
        """Two operators of one device, timed one after the other: their iterations summed in order."""
        return Samples(tuple(a + b for a, b in zip(self.fwd_ms, other.fwd_ms, strict=True)),
                       tuple(a + b for a, b in zip(self.bwd_ms, other.bwd_ms, strict=True)))


def operator_groups(task: Task, shards: Sequence[Shard], by_kind: bool = False) -> list[list[Shard]]:
    """The TBE operators a device's shards run in: one for its pooled tables (an EmbeddingBagCollection's; with
    `by_kind`, one per TorchRec sharding kind, `sharding_kind`, as TorchRec's lookup groups split them) and, for
    `sequence` tables (an EmbeddingCollection's, no pooling: a row per id), one per width, as an operator without
    pooling outputs rows of one width; its data-parallel replicas in one dense operator of their own (TorchRec's
    dense kernel), at the device's share of the batch."""
    sequence = {t.name for t in task.tables if t.sequence}
    replicas = [s for s in shards if s.replica]
    shards = [s for s in shards if not s.replica]
    pooled = [s for s in shards if s.table not in sequence]
    tables = {t.name: t for t in task.tables}
    kind = {s: sharding_kind(s, tables.get(s.table)) if by_kind else "" for s in pooled}
    pooled_groups = [[s for s in pooled if kind[s] == k] for k in sorted(set(kind.values()))]
    widths = sorted({s.width for s in shards if s.table in sequence})
    groups = [g for g in pooled_groups if g] + [[s for s in shards if s.table in sequence and s.width == w]
                                                for w in widths]
    # UVM-cached shards in an operator of their own per load factor (one cache per FBGEMM operator)

    def cache_of(s: Shard) -> float:  # a shard of an unknown table is refused later, by _shard_specs
        factor = s.load_factor(tables[s.table]) if s.table in tables else s.cache
        return -1.0 if factor is None else factor  # -1: in HBM; 0: wholly in host memory

    split = [[s for s in g if cache_of(s) == f] for g in groups for f in sorted({cache_of(s) for s in g})]
    return split + ([replicas] if replicas else [])


def sharding_kind(shard: Shard, table: Table | None) -> str:
    """TorchRec's sharding kind of a model-parallel shard, by its shape: "row" (some of its table's rows),
    "column" (all rows, some columns), "table" (the whole table; also where the table is unknown)."""
    if table is None:
        return "table"
    return lookup_kind(shard.num_rows(table.rows), shard.width, table.rows, table.dim)


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def fbgemm_version() -> str:
    for dist in ("fbgemm-gpu-cpu", "fbgemm-gpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


class FbgemmBackend:
    """Measures fused TBE operators; see the module docstring for the protocol."""

    name = "fbgemm"
    measured = True

    def __init__(self, lookups: LookupSource, config: FbgemmConfig = FbgemmConfig()) -> None:
        import torch

        if config.device == "cuda" and not torch.cuda.is_available():
            raise DreamShardError(
                "fbgemm backend: device 'cuda' requested but torch.cuda.is_available() is False on this machine "
                f"(torch {torch.__version__}); use device='cpu' for CPU kernel timings"
            )
        self.lookups = lookups
        self.config = config
        self._init_block: Any = None  # INIT_BLOCK seeded values (fill_read_rows), drawn on the first build
        self._weight_pool: Any = None  # weight_memory "reused": bytes that every CPU build's weights view
        # a shard's lookups and the rows they read, by (table, row range, batch): a table's lookups are the same
        # in every build (LookupSource), so neither is found again (results/make-run-time/)
        self._shard_inputs: OrderedDict[tuple, ShardInputs] = OrderedDict()
        self._shard_input_bytes = 0

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def topology(self) -> Topology:
        return self.config.topology

    # ---------------------------------------------------------------- metadata

    def device_name(self) -> str:
        if self.config.device == "cuda":
            import torch

            return torch.cuda.get_device_name()
        n = self.config.threads
        pages = ", huge pages" if self.config.huge_pages else ""
        return f"cpu: {cpu_model_name()} ({n} thread{'s' if n != 1 else ''}{pages})"

    def versions(self) -> dict[str, str]:
        import torch

        out = {"torch": torch.__version__, "fbgemm_gpu": fbgemm_version()}
        if self.config.device == "cuda":
            out["cuda"] = str(torch.version.cuda)
        return out

    # ---------------------------------------------------------------- costs

    def compute_cost(self, task: Task, shards: Sequence[Shard]) -> ComputeCost:
        if not shards:
            return ComputeCost(0.0, 0.0)
        return self.compute_samples(task, shards).median()

    def communication_cost(self, fwd_ms, traffic):
        """The communication model (dreamshard.hardware.comm): not measured by this backend."""
        return communication_ms(fwd_ms, traffic, self.batch_size, self.topology)

    def plan_cost(self, task: Task, plan: Plan) -> PlanCost:
        self._check_devices(task, plan)
        compute = [self.compute_cost(task, plan.device_shards(d)) for d in range(plan.num_devices)]
        return self.plan_cost_from(task, plan, compute)

    def plan_cost_from(self, task: Task, plan: Plan, compute: Sequence[ComputeCost]) -> PlanCost:
        self._check_devices(task, plan)
        return assemble_plan_cost(self, plan, compute, self.batch_size, self.topology,
                                  hosts=task.host_ids(), task=task)

    def _check_devices(self, task: Task, plan: Plan) -> None:
        if plan.num_devices != task.num_devices:
            raise InvalidPlanError(f"plan is for {plan.num_devices} devices, task {task.name!r} has {task.num_devices}")
        speeds = sorted({d.speed for d in task.devices})
        if speeds != [1.0]:
            raise DreamShardError(
                f"task {task.name!r}: devices of relative speeds {speeds}: the fbgemm backend measures every device "
                "on the one physical device it runs on, so it cannot measure devices of different speeds; measure "
                "each kind on its own hardware, or model them with the analytic backend")

    def compute_samples(self, task: Task, shards: Sequence[Shard]) -> Samples:
        """Every timed iteration of one device's fused operator (compute_cost takes their medians)."""
        if not shards:
            return Samples((0.0,), (0.0,))
        return self._sample_sets(task, shards, 1)[0]

    def compute_readings(self, task: Task, shards: Sequence[Shard], readings: int) -> list[ComputeCost]:
        """`readings` readings of one device's operator from one build: warmed up once, then timed `readings`
        times over (`iterations` steps each, their medians). For the bounds' probes (evaluation.ProbeCache),
        which keep the least reading: a rebuilt operator would add a build's time to each reading, and the probes
        are most of a bound's time (results/make-run-time/)."""
        if isinstance(readings, bool) or not isinstance(readings, int) or readings < 1:
            raise ValueError(f"readings: expected an integer >= 1, got {readings!r}")
        if not shards:
            return [ComputeCost(0.0, 0.0)] * readings
        return [s.median() for s in self._sample_sets(task, shards, readings)]

    def _sample_sets(self, task: Task, shards: Sequence[Shard], sets: int) -> list[Samples]:
        """`sets` runs of `iterations` timed steps of each operator of a device's shards, built and warmed up once."""
        import torch

        if self.config.device == "cpu" and torch.get_num_threads() != self.config.threads:
            raise DreamShardError(
                f"fbgemm backend: CPU timings need torch's thread count to be threads={self.config.threads}, "
                f"but this process runs {torch.get_num_threads()}; set it once at the start of the process "
                f"(dreamshard.hardware.fbgemm.pin_threads(backend) or torch.set_num_threads), never mid-measurement")
        if self.config.device == "cpu" and huge_pages_enabled() != self.config.huge_pages:
            raise DreamShardError(
                f"fbgemm backend: huge_pages={self.config.huge_pages}, but this process has "
                f"{HUGE_PAGES_ENV}={os.environ.get(HUGE_PAGES_ENV)!r}; torch reads it once, at its first allocation, "
                f"so start the process with {HUGE_PAGES_ENV}={'1' if self.config.huge_pages else '0'} (python -m "
                "pipeline sets it from params backend.fbgemm.huge_pages) or change huge_pages")
        groups = operator_groups(task, shards, by_kind=self.config.lookup_groups == "kind")
        if len(groups) > 1:  # pooled and sequence tables, or sequences of several widths: timed one after another
            self._check_budget(task, shards, self._shard_specs(task, shards))
            per_group = [self._sample_sets(task, group, sets) for group in groups]
            return [sum(runs[1:], start=runs[0]) for runs in zip(*per_group)]
        fused = None
        try:
            # the operator lives only until it is timed: it may take the buffer kept across builds
            fused = self.build_operator(task, shards, reuse_memory=self.config.weight_memory == "reused")
            fused.warm_up(self.config.warmup)
            timed = fused.time_cuda if fused.device.type == "cuda" else fused.time_cpu
            return [timed(self.config.iterations) for _ in range(sets)]
        finally:
            del fused  # free the operator (and its weights) before anything else is built
            if self.config.device == "cuda":
                torch.cuda.empty_cache()

    def build_operator(self, task: Task, shards: Sequence[Shard], reuse_memory: bool = False) -> FusedOperator:
        """The fused operator compute_cost measures, with its inputs: for inspection and tests.

        Checks the optimizer and precision, the shards and the memory budget before allocating. `reuse_memory`
        (CPU): its weights view the buffer kept across builds, which the next such build overwrites. The shards
        must make one operator (`operator_groups`): pooled tables, or sequence tables of one width.
        """
        if not shards:
            raise DreamShardError("fbgemm backend: no shards to build an operator from")
        if len(operator_groups(task, shards)) > 1:
            raise DreamShardError("fbgemm backend: these shards make several operators (pooled and sequence tables, "
                                  "or sequence tables of several widths); build each of operator_groups(task, shards)")
        self._check_supported(task)
        specs = self._shard_specs(task, shards)  # [(table, width, row_start, row_end)], validated
        self._check_budget(task, shards, specs)
        if shards[0].replica:  # data-parallel replicas: the dense kernel at this device's share of the batch
            if any(t.sequence for t, _, _, _ in specs):
                raise DreamShardError("fbgemm backend: data-parallel sequence tables are not measured")
            batch = max(1, self.config.batch_size // task.num_devices)
            indices, offsets, _ = self._inputs(specs, batch)
            return self._build_dense(task, specs, indices, offsets, batch)
        factor = shards[0].load_factor(specs[0][0])
        if factor is not None and self.config.device == "cpu":
            raise DreamShardError(f"fbgemm backend: {shards[0].label()} is UVM-cached (fused_uvm_caching), a CUDA "
                                  "kernel: FBGEMM's CPU kernels keep every table in host memory, so a CPU timing would "
                                  "not be of it; measure on CUDA, or price it with the analytic backend")
        batch = self.config.batch_size
        indices, offsets, parts = self._inputs(specs, batch)
        return self._build(task, specs, indices, offsets, parts, reuse_memory, factor)

    # ---------------------------------------------------------------- checks and inputs

    def _check_supported(self, task: Task) -> None:
        prec, opt = task.memory.weights_precision, task.memory.optimizer
        mixed = sorted({t.precision for t in task.tables if t.precision not in (None, prec)})
        if mixed:
            raise DreamShardError(f"fbgemm backend: task {task.name!r} mixes {prec} tables with {', '.join(mixed)} "
                                  "ones; one FBGEMM operator holds one precision, so mixed tasks are planned but "
                                  "not measured")
        if prec not in PRECISIONS or opt not in OPTIMIZERS:
            raise DreamShardError(f"fbgemm backend: no FBGEMM mapping for weights {prec!r} with optimizer {opt!r}")
        if self.config.device == "cpu" and (prec, opt) not in CPU_SUPPORTED:
            ok = sorted({o for _, o in CPU_SUPPORTED})
            raise DreamShardError(
                f"fbgemm backend: task {task.name!r} uses optimizer {opt!r} with {prec} weights, which FBGEMM's CPU "
                f"kernels (fbgemm_gpu {fbgemm_version()}) do not support; on CPU use one of {', '.join(ok)} "
                "(fp32 or fp16), or measure on CUDA"
            )

    def _shard_specs(self, task: Task, shards: Sequence[Shard]) -> list[tuple[Table, int, int, int]]:
        """(table, width, row_start, row_end) of each shard, validated."""
        tables = {t.name: t for t in task.tables}
        specs = []
        for s in shards:
            table = tables.get(s.table)
            if table is None:
                raise InvalidPlanError(f"shard of unknown table {s.table!r} (task {task.name!r})")
            check_shard_block(s, table)
            specs.append((table, s.width, *s.rows(table.rows)))
        return specs

    def _check_budget(self, task: Task, shards: Sequence[Shard], specs) -> None:
        needed = sum(task.memory.shard_bytes(end - start, w) for _, w, start, end in specs)
        budget = self.config.memory_budget_gb * GB
        if needed > budget:
            devices = sorted({s.device for s in shards})
            names = ", ".join(s.label() for s in shards)
            raise OverBudgetError(
                f"fbgemm backend: device {', '.join(map(str, devices))} holds {len(shards)} shard(s) ({names}) needing "
                f"{needed} bytes ({needed / GB:.2f} GB) of {task.memory.weights_precision} weights and "
                f"{task.memory.optimizer} state, over the measurement budget of {self.config.memory_budget_gb} GB "
                "(FbgemmConfig.memory_budget_gb); nothing was allocated", needed, int(budget))

    def _inputs(self, specs, batch: int) -> tuple[np.ndarray, np.ndarray, list[ShardInputs]]:
        """Table-major int64 indices and offsets (T*B+1) over the shards at `batch` samples, as in the DLRM format,
        and each shard's ShardInputs.

        A row shard [start, end) is its own table of end - start rows: it gets the lookups of
        its table that fall in its range, rebased to start at 0, so hot rows land where they are.
        """
        parts = [self.shard_inputs(table, start, end, batch) for table, _, start, end in specs]
        indices = np.concatenate([p.indices for p in parts])
        offsets = np.concatenate([[0], np.cumsum(np.concatenate([p.lengths for p in parts]))]).astype(np.int64)
        return indices, offsets, parts

    def shard_inputs(self, table: Table, start: int, end: int, batch: int) -> ShardInputs:
        """The lookups of rows [start, end) of `table` at `batch` samples (rebased to start), and the sorted rows
        they read: computed once and kept (read-only arrays; the least recently used dropped beyond
        SHARD_INPUT_CACHE_BYTES)."""
        # what the lookups depend on (LookupSource: a table's name, rows, pooling and bins), hashable whatever
        # sequence the bins came in
        bins = None if table.bins is None else tuple(float(b) for b in table.bins)
        key = (table.name, table.rows, float(table.pooling_factor), bins, start, end, batch)
        hit = self._shard_inputs.get(key)
        if hit is not None:
            self._shard_inputs.move_to_end(key)
            return hit
        if (start, end) != (0, table.rows):
            whole = self.shard_inputs(table, 0, table.rows, batch)
            idx, lengths = whole.indices, whole.lengths
            sample = np.repeat(np.arange(batch), lengths)
            inside = (idx >= start) & (idx < end)
            idx, lengths = idx[inside] - start, np.bincount(sample[inside], minlength=batch).astype(np.int64)
        else:
            idx, lengths = self._table_lookups(table, batch)
        part = ShardInputs(idx, lengths)
        idx.setflags(write=False)
        lengths.setflags(write=False)
        self._shard_inputs[key] = part
        self._shard_input_bytes += part.nbytes
        while self._shard_input_bytes > SHARD_INPUT_CACHE_BYTES and len(self._shard_inputs) > 1:
            _, dropped = self._shard_inputs.popitem(last=False)
            self._shard_input_bytes -= dropped.nbytes
        return part

    def _table_lookups(self, table: Table, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """The lookup source's (indices, lengths) of `table` at `batch` samples, checked."""
        req = self.lookups.lookups(table, batch)
        idx = np.array(req.indices, dtype=np.int64)  # copies: the kept arrays are made read-only, not the source's
        lengths = np.array(req.lengths, dtype=np.int64)
        if lengths.shape != (batch,):
            raise DreamShardError(
                f"table {table.name!r}: lookups have {lengths.shape[0] if lengths.ndim else 0} samples, "
                f"expected the batch size {batch}"
            )
        if (lengths < 0).any() or int(lengths.sum()) != idx.shape[0]:
            raise DreamShardError(
                f"table {table.name!r}: lookup lengths sum to {int(lengths.sum())} for {idx.shape[0]} indices"
            )
        if idx.size and (idx.min() < 0 or idx.max() >= table.rows):
            raise DreamShardError(
                f"table {table.name!r}: lookup row ids span [{idx.min()}, {idx.max()}], "
                f"outside the table's {table.rows} rows"
            )
        return idx, lengths

    # ---------------------------------------------------------------- the measurement

    def _host_weights(self, embedding_specs, precision, device, reuse: bool) -> dict[str, Any] | None:
        """On CPU, FBGEMM's host weights as a buffer it does not zero (zeroing every byte, or first-touching
        fresh pages, was most of a build): a view of the one buffer kept across builds (`reuse`), or a fresh
        one. Its rows nobody reads hold whatever they held; the kernels never read them. None (FBGEMM
        allocates and zeroes) for weight_memory `zeroed` and on CUDA."""
        if device.type != "cpu" or self.config.weight_memory == "zeroed":
            return None
        import torch
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import construct_split_state

        size = construct_split_state(embedding_specs, rowwise=False, cacheable=True, precision=precision).host_size
        dtype = precision.as_dtype()
        if not reuse:
            return HostBuffers(weights=torch.empty(size, dtype=dtype, device=device))
        nbytes = size * torch.empty(0, dtype=dtype).element_size()
        if self._weight_pool is None or self._weight_pool.numel() < nbytes:
            self._weight_pool = None  # freed before the larger one is taken
            self._weight_pool = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return HostBuffers(weights=self._weight_pool[:nbytes].view(dtype))

    def _build(self, task: Task, specs, indices_np: np.ndarray, offsets_np: np.ndarray, parts: list[ShardInputs],
               reuse_memory: bool, cache_load_factor: float | None = None) -> FusedOperator:
        import torch

        with warnings.catch_warnings():
            # the CPU wheel announces, on first import, each GPU-only (SSD) optimizer it lacks
            warnings.filterwarnings("ignore", message=r"(?s).*Failed to import", category=DeprecationWarning)
            from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
            from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
            from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
                ComputeDevice,
                SplitTableBatchedEmbeddingBagsCodegen,
            )

        cached: dict[str, Any] = {}
        if self.config.device == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
            location, compute = EmbeddingLocation.DEVICE, ComputeDevice.CUDA
            if cache_load_factor == 0:  # weights in UVM, no cache (TorchRec's fused_uvm)
                location = EmbeddingLocation.MANAGED
            elif cache_load_factor is not None:  # weights in UVM, the load factor's share of rows cached in HBM
                location, cached = EmbeddingLocation.MANAGED_CACHING, {"cache_load_factor": cache_load_factor}
        else:
            device = torch.device("cpu")
            location, compute = EmbeddingLocation.HOST, ComputeDevice.CPU
        embedding_specs = [(end - start, w, location, compute) for _, w, start, end in specs]
        sequence = specs[0][0].sequence  # one operator: all sequence tables (of one width) or all pooled
        precision = SparseType[PRECISIONS[task.memory.weights_precision]]
        host = self._host_weights(embedding_specs, precision, device, reuse_memory)
        if host is not None:  # only where it is used: older FBGEMM (1.6, CUDA builds) has no such argument
            cached = {**cached, "preallocated_host_buffers": host}
        try:
            op = SplitTableBatchedEmbeddingBagsCodegen(
                embedding_specs=embedding_specs,
                optimizer=EmbOptimType[OPTIMIZERS[task.memory.optimizer]],
                weights_precision=precision,
                pooling_mode=PoolingMode.NONE if sequence else PoolingMode.SUM,
                learning_rate=self.config.learning_rate,
                device=device,
                **cached,
            )
        except AssertionError as exc:  # FBGEMM states unsupported configurations as assertions
            raise DreamShardError(f"fbgemm backend: FBGEMM refused the operator on {device}: {exc}") from exc
        if self._init_block is None or self._init_block.device != device:
            # its own generator, so that `gen` below draws the same output gradient in every build
            block_gen = torch.Generator(device=device).manual_seed(0)
            self._init_block = torch.empty(INIT_BLOCK, device=device).uniform_(-INIT_RANGE, INIT_RANGE,
                                                                                generator=block_gen)
        gen = torch.Generator(device=device).manual_seed(0)
        batch = self.config.batch_size
        with torch.no_grad():
            # seeded uniform values in the rows the lookups read, the others never written (on CPU not even
            # zeroed: their pages are never touched): the kernels never read those, and their work does not
            # depend on the values (results/make-run-time/README.md compares the ways)
            indices = torch.from_numpy(indices_np).to(device)
            for t, w in enumerate(op.split_embedding_weights()):
                lo, hi = int(offsets_np[t * batch]), int(offsets_np[(t + 1) * batch])
                # the same sorted row ids either way; on CUDA the device finds them (np.unique of a table's
                # lookups at batch 65536 took most of a build's host time there), on CPU shard_inputs kept them
                read = torch.unique(indices[lo:hi]) if device.type == "cuda" else torch.tensor(parts[t].read_rows)
                fill_read_rows(w, read, self._init_block)
        offsets = torch.from_numpy(offsets_np).to(device)
        # the output: a row per sample of the widths side by side, or without pooling a row per id of the one width
        shape = (indices_np.shape[0], specs[0][1]) if sequence else (batch, sum(w for _, w, _, _ in specs))
        grad = torch.randn(shape, generator=gen, device=device) * 0.01
        return FusedOperator(op, indices, offsets, grad, device)


    def _build_dense(self, task: Task, specs, indices_np: np.ndarray, offsets_np: np.ndarray,
                     batch: int) -> FusedOperator:
        """Data-parallel replicas as TorchRec runs them: FBGEMM's dense TBE (autograd gives every weight a
        gradient) at `batch` samples, the optimizer step a dense SGD update of every weight."""
        import torch

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"(?s).*Failed to import", category=DeprecationWarning)
            from fbgemm_gpu.split_embedding_configs import SparseType
            from fbgemm_gpu.split_table_batched_embeddings_ops_training import DenseTableBatchedEmbeddingBagsCodegen

        if task.memory.optimizer != "exact_sgd":
            raise DreamShardError(f"fbgemm backend: data-parallel tables are measured with a dense SGD update; task "
                                  f"{task.name!r} trains with {task.memory.optimizer!r}")
        cuda = self.config.device == "cuda"
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        precision = SparseType[PRECISIONS[task.memory.weights_precision]]
        op = DenseTableBatchedEmbeddingBagsCodegen([(end - start, w) for _, w, start, end in specs],
                                                   weights_precision=precision, use_cpu=not cuda).to(device)
        with torch.no_grad():
            op.weights.uniform_(-INIT_RANGE, INIT_RANGE, generator=torch.Generator(device=device).manual_seed(0))
        gen = torch.Generator(device=device).manual_seed(0)
        grad = torch.randn((batch, sum(w for _, w, _, _ in specs)), generator=gen, device=device) * 0.01
        return FusedOperator(op, torch.from_numpy(indices_np).to(device), torch.from_numpy(offsets_np).to(device),
                             grad, device, dense_lr=self.config.learning_rate)


class HostBuffers(dict):
    """FBGEMM's `preallocated_host_buffers`, printed by name only: its constructor logs the text of all its
    arguments, and formatting the weights tensor is costly work in every CPU build (results/make-run-time/)."""

    def __repr__(self) -> str:
        return f"HostBuffers({', '.join(self)})"


def fill_read_rows(weights, rows, block) -> None:
    """Fill the `rows` (int64 row ids) of `weights` (rows x width) with `block` repeated in order: seeded,
    uniform, and as many values as the rows read hold."""
    if rows.numel() == 0:
        return
    count = rows.numel() * weights.shape[1]
    values = block.repeat(-(-count // block.numel()))[:count] if count > block.numel() else block[:count]
    # row copies: faster than `weights[rows] = ...` (an element-wise scatter) on CPU, the same result
    weights.index_copy_(0, rows, values.view(rows.numel(), weights.shape[1]).to(weights.dtype))


@dataclass
class FusedOperator:
    """One device's TBE with its table-major inputs and the fixed output gradient of its backward."""

    op: Any  # SplitTableBatchedEmbeddingBagsCodegen (torch is imported lazily: no annotations of its types)
    indices: Any  # torch.Tensor, int64
    offsets: Any  # torch.Tensor, int64, T*B+1
    grad: Any  # torch.Tensor [B, sum of widths]; without pooling (sequence tables) [ids, width]
    device: Any  # torch.device
    dense_lr: float | None = None  # a dense operator (data-parallel): its backward ends with this SGD update

    def _backward(self, out) -> None:
        if self.dense_lr is None:
            out.backward(self.grad)
            return
        import torch

        with warnings.catch_warnings():  # FBGEMM's dense CPU lookup has no autograd kernel of its own (its
            # gradient, checked in tests/unit/test_replicas.py, is right): torch warns on every backward
            warnings.filterwarnings("ignore", message=r".*autograd kernel was not registered", category=UserWarning)
            out.backward(self.grad)
        with torch.no_grad():  # the fused kernels update in their backward; a dense one's optimizer steps here
            self.op.weights.add_(self.op.weights.grad, alpha=-self.dense_lr)
        self.op.weights.grad = None

    def step(self):
        """One forward and backward (the backward applies the optimizer update); returns the output."""
        out = self.op(self.indices, self.offsets)
        self._backward(out)
        return out.detach()

    def warm_up(self, n: int) -> None:
        for _ in range(n):
            self.step()

    def time_cpu(self, iterations: int) -> Samples:
        fwd, bwd = [], []
        for _ in range(iterations):
            t0 = time.perf_counter()
            out = self.op(self.indices, self.offsets)
            t1 = time.perf_counter()
            self._backward(out)
            t2 = time.perf_counter()
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
            del out
        return Samples(tuple(fwd), tuple(bwd))

    def time_cuda(self, iterations: int) -> Samples:
        import torch

        events = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(iterations)]
        torch.cuda.synchronize(self.device)
        for start, mid, end in events:
            start.record()
            out = self.op(self.indices, self.offsets)
            mid.record()
            self._backward(out)
            end.record()
            del out
        torch.cuda.synchronize(self.device)
        fwd = tuple(float(s.elapsed_time(m)) for s, m, _ in events)
        bwd = tuple(float(m.elapsed_time(e)) for _, m, e in events)
        return Samples(fwd, bwd)


def pin_threads(backend: object) -> None:
    """For an application's start: give torch the thread count a CPU `FbgemmBackend` measures with.

    Process-wide: call it once, before any measurement, from the program (a stage, a CLI
    command, a benchmark, a worker process), never from library code. Other backends: no-op.
    """
    if isinstance(backend, FbgemmBackend) and backend.config.device == "cpu":
        import torch

        torch.set_num_threads(backend.config.threads)
