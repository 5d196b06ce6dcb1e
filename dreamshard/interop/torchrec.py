"""TorchRec interop: export a plan as a TorchRec `ShardingPlan`, and TorchRec's own estimate of a plan.

TorchRec is optional and imported only inside these functions. The exported plan is for one
EmbeddingBagCollection of every table, keyed by its fqn (a wrong fqn leaves it silently unsharded in
TorchRec); row ranges must be in TorchRec's row-wise layout. The model, the shardings and the fqn rule:
docs/torchrec.md.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dreamshard.errors import DreamShardError, InvalidPlanError
from dreamshard.hardware.base import DeviceCost, PlanCost
from dreamshard.io import atomic_path
from dreamshard.memory import DEFAULT_BATCH_SIZE
from dreamshard.plan import Plan, Shard, host_of_blocks, row_blocks, validate_plan
from dreamshard.tasks import Task

if TYPE_CHECKING:
    from dreamshard.hardware.topology import Topology

DEFAULT_FQN = "ebc"
COMPUTE_DEVICE = "cuda"  # plans are for GPU training; planning itself runs anywhere
COMPUTE_KERNEL = "fused"  # FBGEMM TBE with the weights in device memory (HBM)
TABLE_WISE = "table_wise"
COLUMN_WISE = "column_wise"
ROW_WISE = "row_wise"
TABLE_ROW_WISE = "table_row_wise"  # row-wise over the ranks of one host (plan.host_blocks)
DATA_PARALLEL = "data_parallel"  # replicas (Shard.replica), run by TorchRec's dense kernel
DENSE_KERNEL = "dense"
ENUMERATION_ORDER = "the sharder's"  # of a table's sharding types and kernels when TorchRec plans (OrderedEnumerator)
UVM_KERNEL = "fused_uvm_caching"  # dreamshard.caching: weights in host memory, a share of the rows cached in HBM
HOST_KERNEL = "fused_uvm"  # weights in host memory, no cache (a cache load factor of 0)
# TorchRec sharding types made of blocks of a table, each on one rank: what converts to a DreamShard plan
SHARD_TYPES = (TABLE_WISE, COLUMN_WISE, "table_column_wise", ROW_WISE, "table_row_wise", "grid_shard")

INSTALL_HINT = ("TorchRec is not installed; install it with `pip install torchrec==1.8.0 --no-deps` and "
                "`pip install tensordict 'torchmetrics==1.0.3' tqdm pyre-extensions` "
                "(fbgemm-gpu-cpu provides its fbgemm-gpu)")


def require_torchrec() -> None:
    """Raise DreamShardError with install instructions unless torchrec can be imported."""
    try:
        import torchrec  # noqa: F401
    except ImportError as exc:
        raise DreamShardError(f"{INSTALL_HINT} ({exc})") from None


@contextlib.contextmanager
def quiet_torchrec() -> Iterator[None]:
    """TorchRec logs planner summaries, warnings and every planner call; keep them off our output."""
    from torchrec.distributed import logger as torchrec_logger  # its own non-propagating loggers

    loggers = [logging.getLogger("torchrec")]
    loggers += [v for v in vars(torchrec_logger).values() if isinstance(v, logging.Logger)]
    saved = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, saved):
            lg.setLevel(level)


@contextlib.contextmanager
def planner_copies() -> Iterator[None]:
    """TorchRec's planner deep-copies its devices, shards and their Perf and Storage records many times per
    proposal (its partitioner, its proposers, its best plan); Python's generic deepcopy of those dataclasses is
    most of `torchrec_full`'s planning time on our tasks (results/make-run-time/). Within this block they copy
    themselves field by field: the same copies (their fields are numbers, lists of numbers and those records; a record met
    twice in one copy is copied once, as deepcopy's memo does), so TorchRec plans the same, sooner."""
    from torchrec.distributed.planner import types as tt

    def record(self, memo):  # Perf, Storage: numbers only
        copied = self.__class__.__new__(self.__class__)
        copied.__dict__.update(self.__dict__)
        return copied

    def device(self, memo):
        return tt.DeviceHardware(self.rank, copy.deepcopy(self.storage, memo), copy.deepcopy(self.perf, memo))

    def shard(self, memo):
        return tt.Shard(copy.deepcopy(self.size, memo), copy.deepcopy(self.offset, memo),
                        copy.deepcopy(self.storage, memo), copy.deepcopy(self.perf, memo), self.rank)

    copiers = {tt.Perf: record, tt.Storage: record, tt.DeviceHardware: device, tt.Shard: shard}
    installed = [cls for cls in copiers if "__deepcopy__" not in vars(cls)]  # an enclosing block's stay
    for cls in installed:
        cls.__deepcopy__ = copiers[cls]
    try:
        yield
    finally:
        for cls in installed:
            del cls.__deepcopy__


# ------------------------------------------------------------------ the module

def _check_names(task: Task) -> None:
    for t in task.tables:
        if "." in t.name or not t.name:
            raise DreamShardError(f"table {t.name!r}: TorchRec needs table names without '.' "
                                  "(each becomes a module name); rename the table")


def _configs(task: Task, sequence: bool) -> list:
    require_torchrec()
    from torchrec import EmbeddingBagConfig, EmbeddingConfig
    from torchrec.modules.embedding_configs import DataType

    _check_names(task)
    types = {"fp16": DataType.FP16, "fp32": DataType.FP32}
    config = EmbeddingConfig if sequence else EmbeddingBagConfig
    return [config(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name],
                   data_type=types[t.precision or task.memory.weights_precision])
            for t in task.tables if t.sequence == sequence]


def embedding_bag_configs(task: Task) -> list:
    """One `EmbeddingBagConfig` per pooled table of the task (all but the `sequence` ones), in task order."""
    return _configs(task, sequence=False)


def embedding_configs(task: Task) -> list:
    """One `EmbeddingConfig` per `sequence` table of the task (an EmbeddingCollection's), in task order."""
    return _configs(task, sequence=True)


def meta_ebc(task: Task):
    """The task's EmbeddingBagCollection on the meta device: shapes only, no memory (a task of pooled tables)."""
    import torch
    from torchrec import EmbeddingBagCollection

    if any(t.sequence for t in task.tables):
        raise DreamShardError(f"task {task.name!r} holds sequence tables, which an EmbeddingBagCollection does not: "
                              "use meta_module")
    return EmbeddingBagCollection(tables=embedding_bag_configs(task), device=torch.device("meta"))


def meta_module(task: Task):
    """The task's tables as TorchRec modules on the meta device: its EmbeddingBagCollection alone, or, with
    `sequence` tables, a module holding an EmbeddingBagCollection (`ebc`, the pooled tables) and an
    EmbeddingCollection per dim of the sequence tables (`ec_<dim>`: one holds tables of one dim)."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    if not any(t.sequence for t in task.tables):
        return meta_ebc(task)
    module = torch.nn.Module()
    if not all(t.sequence for t in task.tables):
        module.ebc = EmbeddingBagCollection(tables=embedding_bag_configs(task), device=torch.device("meta"))
    by_dim: dict[int, list] = defaultdict(list)
    for c in embedding_configs(task):
        by_dim[c.embedding_dim].append(c)
    for dim, configs in sorted(by_dim.items()):  # an EmbeddingCollection holds tables of one dim
        setattr(module, f"ec_{dim}", EmbeddingCollection(tables=configs, device=torch.device("meta")))
    return module


def topology(task: Task, links: Topology | None = None, hbm_gbps: float | None = None):
    """TorchRec topology: one rank per device of the task, each with the device's memory as HBM. With `links` (the
    cluster our comm model prices), TorchRec is told the same: GPUs per host (`peer_local_size`) and the intra- and
    inter-host bandwidths; `hbm_gbps`: the devices' memory bandwidth (None: TorchRec's default)."""
    bandwidths = {} if links is None else {"intra_host_bw": links.intra_host_gbps * BYTES_PER_MS_IN_GBPS,
                                           "inter_host_bw": links.inter_host_gbps * BYTES_PER_MS_IN_GBPS}
    if hbm_gbps is not None:
        bandwidths["hbm_mem_bw"] = hbm_gbps * BYTES_PER_MS_IN_GBPS
    return _topology(task, local_size_of(task) if links is None else peer_local_size(task, links), bandwidths)


def topology_like(task: Task, given):
    """A new TorchRec topology of the task with the hosts and bandwidths of TorchRec's Topology `given`, as
    topology_from's (which keeps one per task for rating): for a planner to plan on."""
    return _topology(task, given.local_world_size, {"intra_host_bw": given.intra_host_bw,
                                                    "inter_host_bw": given.inter_host_bw,
                                                    "hbm_mem_bw": given.hbm_mem_bw})


@functools.lru_cache(maxsize=8)
def topology_from(task: Task, given):
    """The task's TorchRec topology with the hosts and bandwidths of TorchRec's Topology `given` (a user's, e.g.
    DreamShardPlanner's): its GPUs per host, intra- and inter-host and memory bandwidth, on the compute device our
    ratings use (COMPUTE_DEVICE, whatever `given` trains on), each rank's memory the task's. One object per (task,
    `given`): a plan rated on it by a sharder and checked by the planner is estimated once (torchrec_perf_estimate
    keeps ratings by topology object; a read-only use: rating, never planning)."""
    return topology_like(task, given)


def _topology(task: Task, local_size: int, bandwidths: dict[str, float]):
    """One rank per device of the task (its memory as HBM, CustomTopologyData where they differ), `local_size`
    GPUs per host, TorchRec's bandwidths in bytes/ms where given (its defaults elsewhere), COMPUTE_DEVICE."""
    require_torchrec()
    from torchrec.distributed.planner.types import (
        CustomTopologyData,
        HardwareConfig,
        KernelConfig,
        TopologyFactory,
        TrainerConfig,
    )

    caps = task.capacities()
    extra = {"custom_topology_data": CustomTopologyData({"hbm_cap": caps}, world_size=len(caps))} \
        if len(set(caps)) > 1 else {}  # devices of different sizes
    trainer = TrainerConfig(world_size=task.num_devices, local_world_size=local_size, hbm_cap_bytes=max(caps),
                            additional_params=extra)
    hardware = HardwareConfig(**bandwidths) if bandwidths else None
    # TorchRec 1.8 reads a hardware config's bandwidths only with use_hardware_based_bandwidth (1.6 always did)
    kernel = KernelConfig(compute_device=COMPUTE_DEVICE, use_hardware_based_bandwidth=hardware is not None)
    return TopologyFactory.create_topology(trainer, hardware_config=hardware, kernel_config=kernel)


BYTES_PER_MS_IN_GBPS = 1e9 / 1000  # TorchRec's bandwidths are bytes per ms; ours GB/s (hardware.topology)


def peer_local_size(task: Task, links: Topology) -> int:
    """GPUs per host as our comm model counts them: the hosts the task's devices name, else blocks of
    `links.devices_per_host` (device d on host d // devices_per_host, as TorchRec lays out ranks)."""
    if task.host_ids() is not None:
        return local_size_of(task)
    return min(task.num_devices, links.devices_per_host)


def per_rank_batch(task: Task, batch_size: int) -> int:
    """TorchRec's batch size (per rank) from ours: `batch_size` is the global batch, the samples every table's
    operator reads in a step (backend.batch_size), split over the task's ranks (at least 1)."""
    return max(1, int(batch_size) // task.num_devices)


def torchrec_batch(task: Task, batch_size: int | None) -> int:
    """The batch TorchRec's planner and perf model are given for the task: our global `batch_size` per rank
    (per_rank_batch), or, without one, the task's memory model's batch per device (TorchRec's 512 by default)."""
    return per_rank_batch(task, batch_size) if batch_size else task.memory.batch_size or DEFAULT_BATCH_SIZE


def table_constraints(task: Task, sharding_types: Mapping[str, list[str] | None],
                      caches: Mapping[str, float] | None = None, min_partition: bool = False) -> dict:
    """ParameterConstraints per table: its pooling factor, the sharding types allowed, the fused kernel (dense for a
    table allowed data_parallel alone; fused_uvm_caching with its load factor for a table in `caches`);
    `min_partition`: each table's narrowest column slice (Task.min_width) as TorchRec's column-wise block width,
    where TorchRec's default (128 columns) would leave it whole."""
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import CacheParams

    caches = caches or {}

    def kernel(name: str, types: list[str] | None) -> str:
        return DENSE_KERNEL if types == [DATA_PARALLEL] else kernel_of(caches.get(name))

    return {t.name: ParameterConstraints(sharding_types=sharding_types[t.name],
                                         compute_kernels=[kernel(t.name, sharding_types[t.name])],
                                         pooling_factors=[float(t.pooling_factor)],
                                         cache_params=CacheParams(load_factor=caches[t.name]) if caches.get(t.name)
                                         else None,
                                         min_partition=task.min_width(t.name) if min_partition else None)
            for t in task.tables}


def kernel_of(load_factor: float | None) -> str:
    """TorchRec's compute kernel of a table at a cache load factor: fused (None: in HBM), fused_uvm (0: wholly in
    host memory), fused_uvm_caching (a cache of that share of its rows)."""
    return COMPUTE_KERNEL if load_factor is None else HOST_KERNEL if load_factor == 0 else UVM_KERNEL


def plan_caches(task: Task, plan: Plan) -> dict[str, float]:
    """Table name -> cache load factor of the plan's UVM-cached tables (validate_plan: one per table)."""
    tables = {t.name: t for t in task.tables}
    out = {}
    for s in plan.shards:
        f = s.load_factor(tables[s.table])
        if f is not None:
            out[s.table] = f
    return out


@functools.cache
def _storage_estimator_class():
    from torchrec.distributed.planner.types import ShardEstimator, Storage

    class DreamShardStorageEstimator(ShardEstimator):
        """Shard storage by DreamShard's memory model (Task.shard_bytes), all of it in HBM: TorchRec then plans
        under exactly the rule `validate_plan` checks and every other sharder uses."""

        def __init__(self, task: Task, constraints=None) -> None:
            self._task = task
            self._tables = {t.name: t for t in task.tables}

        def estimate(self, sharding_options, sharder_data_map=None) -> None:
            for option in sharding_options:
                table = self._tables[option.name]
                for shard in option.shards:
                    rows, cols = shard.size
                    shard.storage = Storage(hbm=self._task.shard_bytes(table, int(rows), int(cols)), ddr=0, ssd=0)

    return DreamShardStorageEstimator


def enumerator(task: Task, topo, constraints: dict, batch_size: int, torchrec_storage: bool = False,
               calibration: Any = None):
    """TorchRec's enumerator with its perf estimator and DreamShard's storage estimator (TorchRec's own with
    `torchrec_storage`: to judge a plan by TorchRec's count); `calibration` (interop.calibration.PerfCalibration):
    its perf estimator with compute fitted to our measurements."""
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator

    storage = EmbeddingStorageEstimator(topo, constraints) if torchrec_storage else _storage_estimator_class()(task)
    perf = EmbeddingPerfEstimator(topo, constraints) if calibration is None else \
        calibrated_perf_estimator(topo, constraints, calibration)
    estimators = [perf, storage]
    return _ordered_enumerator_class()(topology=topo, batch_size=batch_size, constraints=constraints,
                                       estimator=estimators)


def _ordered_enumerator_class():
    """TorchRec's EmbeddingEnumerator with a table's sharding types and compute kernels in the order its sharder
    lists them. Stock TorchRec intersects them with the constraints through sets, so their order, and with it the
    planner's tie-breaks and plans, changes with PYTHONHASHSEED from one process to the next."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    class OrderedEnumerator(EmbeddingEnumerator):
        def _filter_sharding_types(self, name, allowed_sharding_types, *args, **kwargs):
            kept = super()._filter_sharding_types(name, allowed_sharding_types, *args, **kwargs)
            return sorted(kept, key=list(allowed_sharding_types).index)

        def _filter_compute_kernels(self, name, allowed_compute_kernels, *args, **kwargs):
            kept = super()._filter_compute_kernels(name, allowed_compute_kernels, *args, **kwargs)
            return sorted(kept, key=list(allowed_compute_kernels).index)

    return OrderedEnumerator if not _STOCK_ENUMERATION else EmbeddingEnumerator


_STOCK_ENUMERATION: list[bool] = []  # within stock_enumeration blocks: TorchRec's own enumerator


@contextlib.contextmanager
def stock_enumeration() -> Iterator[None]:
    """Within the block our TorchRec sharders enumerate through TorchRec's own EmbeddingEnumerator, its order of
    sharding types following the process's string hashes, as a TorchRec user's planner does (tools.plan_digests)."""
    _STOCK_ENUMERATION.append(True)
    try:
        yield
    finally:
        _STOCK_ENUMERATION.pop()


def calibrated_perf_estimator(topo, constraints: dict | None, calibration: Any):
    """TorchRec's EmbeddingPerfEstimator with each shard's compute scaled by `calibration`'s factors of its sharding
    type (interop.calibration.PerfCalibration; TorchRec's estimator subclassed: its comms as TorchRec computes them)."""
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator

    factors, fallback = calibration.factors(), calibration.fallback()

    class CalibratedPerfEstimator(EmbeddingPerfEstimator):
        def estimate(self, sharding_options, *args, **kwargs) -> None:
            super().estimate(sharding_options, *args, **kwargs)
            for option in sharding_options:
                f, b = factors.get(option.sharding_type, fallback)
                for shard in option.shards:
                    if shard.perf is not None:
                        shard.perf.fwd_compute *= f
                        shard.perf.bwd_compute *= b

    return CalibratedPerfEstimator(topo, constraints)


# ------------------------------------------------------------------ export

def _table_shards(task: Task, plan: Plan) -> dict[str, list[Shard]]:
    validate_plan(task, plan)  # every cell covered exactly once: the export never drops or doubles a block
    shards: dict[str, list[Shard]] = defaultdict(list)
    for s in plan.shards:
        shards[s.table].append(s)
    return {name: sorted(blocks, key=lambda s: (s.row_start, s.col_start)) for name, blocks in shards.items()}


def table_layout(task: Task, table_index: int, shards: list[Shard]) -> str:
    """The TorchRec sharding type that holds exactly these shards of the table (module docstring), or an error."""
    t = task.tables[table_index]
    if any(s.replica for s in shards):  # validate_plan: a whole replica on every device
        return DATA_PARALLEL
    if all(not s.is_row_range for s in shards):
        return TABLE_WISE if len(shards) == 1 else COLUMN_WISE
    blocks = [(s.rows(t.rows), s.device) for s in shards]
    expected = [(block, rank) for rank, block in enumerate(row_blocks(t.rows, task.num_devices))]
    if all(s.width == t.dim for s in shards) and blocks == expected:
        return ROW_WISE
    if host_of_blocks(task, t, shards) is not None:
        return TABLE_ROW_WISE
    raise DreamShardError(
        f"table {t.name!r}: its row ranges {', '.join(s.label() + f' on {s.device}' for s in shards[:4])}"
        f"{', ...' if len(shards) > 4 else ''} are not TorchRec's row-wise layout: TorchRec trains a row-wise table "
        f"split into blocks of ceil(rows / ranks) = {expected[0][0][1]} rows, block i on rank i "
        "(plans from dreamshard's sharders always are; see dreamshard.sharders.pieces)")


def _column_slices_generator(slices: list[Shard], kernel: str = COMPUTE_KERNEL):
    """A ParameterShardingGenerator for column slices of any widths, each on its own rank."""
    from torchrec.distributed.sharding_plan import placement
    from torchrec.distributed.types import EnumerableShardingSpec, ParameterSharding, ShardMetadata

    def generate(param, local_size: int, world_size: int, device_type: str, sharder) -> Any:
        rows = int(param.shape[0])
        return ParameterSharding(
            sharding_type=COLUMN_WISE,
            compute_kernel=kernel,
            ranks=[s.device for s in slices],
            sharding_spec=EnumerableShardingSpec([
                ShardMetadata(shard_offsets=[0, s.col_start], shard_sizes=[rows, s.col_end - s.col_start],
                              placement=placement(device_type, s.device, local_size))
                for s in slices
            ]),
        )

    return generate


def table_generators(task: Task, plan: Plan, whole_as: str | Mapping[str, str] = TABLE_WISE,
                     row_as: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Table name -> TorchRec's ParameterShardingGenerator placing it as `plan` does; a whole table as
    `whole_as` (for all tables, or per table; table_wise for those absent): table_wise, or column_wise with one
    slice (for a table allowed column_wise and not table_wise), or on one rank row_wise, table_row_wise or
    data_parallel; row-wise blocks as `row_as` says per table (row_wise for those absent; table_row_wise: the
    same blocks, on a topology of one host)."""
    require_torchrec()
    from torchrec.distributed.sharding_plan import column_wise, data_parallel, row_wise, table_row_wise, table_wise

    shards = _table_shards(task, plan)
    caches = plan_caches(task, plan)
    wholes = {} if isinstance(whole_as, str) else whole_as
    rows_as = row_as or {}
    per_table = {}
    for i, t in enumerate(task.tables):
        blocks = shards[t.name]
        layout = table_layout(task, i, blocks)
        kernel = kernel_of(caches.get(t.name))
        whole = whole_as if isinstance(whole_as, str) else wholes.get(t.name, TABLE_WISE)
        if layout == TABLE_WISE and whole == COLUMN_WISE:
            per_table[t.name] = column_wise(ranks=[blocks[0].device], compute_kernel=kernel)
        elif layout == TABLE_WISE and whole == ROW_WISE:
            per_table[t.name] = row_wise(compute_kernel=kernel)
        elif layout == TABLE_WISE and whole == "table_row_wise":
            per_table[t.name] = _with_kernel(table_row_wise(host_index=0), kernel)
        elif layout == TABLE_WISE and whole == DATA_PARALLEL:
            per_table[t.name] = data_parallel()
        elif layout == TABLE_WISE:
            per_table[t.name] = table_wise(rank=blocks[0].device, compute_kernel=kernel)
        elif layout == TABLE_ROW_WISE:  # a host's ranks: host_of_blocks
            per_table[t.name] = _with_kernel(table_row_wise(host_index=host_of_blocks(task, t, blocks)), kernel)
        elif layout == ROW_WISE and rows_as.get(t.name) == "table_row_wise":
            per_table[t.name] = _with_kernel(table_row_wise(host_index=0), kernel)
        elif layout == ROW_WISE:
            per_table[t.name] = row_wise(compute_kernel=kernel)
        elif layout == DATA_PARALLEL:
            per_table[t.name] = data_parallel()
        elif len({s.width for s in blocks}) == 1:
            per_table[t.name] = column_wise(ranks=[s.device for s in blocks], compute_kernel=kernel)
        else:
            per_table[t.name] = _column_slices_generator(blocks, kernel)
        if caches.get(t.name):  # a cache's load factor (fused_uvm keeps none)
            per_table[t.name] = _cached(per_table[t.name], caches[t.name])
    return per_table


def _with_kernel(generate, kernel: str):
    """The sharding `generate` makes, run by `kernel` (for TorchRec's generators that take no kernel)."""
    def with_kernel(*args, **kwargs) -> Any:
        sharding = generate(*args, **kwargs)
        sharding.compute_kernel = kernel
        return sharding

    return with_kernel


def _cached(generate, load_factor: float):
    """The sharding `generate` makes, with TorchRec's cache parameters at `load_factor` (UVM caching)."""
    from torchrec.distributed.types import CacheParams

    def with_cache(*args, **kwargs) -> Any:
        sharding = generate(*args, **kwargs)
        sharding.cache_params = CacheParams(load_factor=load_factor)
        return sharding

    return with_cache


def check_module_plan(task: Task, plan: Plan, module_plan, names: Mapping[str, str] | None = None) -> None:
    """Raise InvalidPlanError unless TorchRec's sharding of every table holds exactly the plan's blocks.

    `names`: task table name -> its name in `module_plan`, for the tables of one of several modules
    (default: every table of the task, under its own name)."""
    shards = _table_shards(task, plan)
    caches = plan_caches(task, plan)
    names = names if names is not None else {t.name: t.name for t in task.tables}
    for t in task.tables:
        if t.name not in names:
            continue
        sharding = module_plan[names[t.name]]
        factor = caches.get(t.name)
        got_factor = sharding.cache_params.load_factor if sharding.cache_params is not None else None
        host_memory = sharding.compute_kernel in (UVM_KERNEL, HOST_KERNEL)
        if (host_memory or factor is not None) and (sharding.compute_kernel != kernel_of(factor)
                                                    or bool(factor) and got_factor != factor):
            raise InvalidPlanError(f"table {names[t.name]!r}: TorchRec's kernel {sharding.compute_kernel!r} (cache "
                                   f"load factor {got_factor}) differs from the plan's (cache load factor {factor})")
        if sharding.sharding_type == DATA_PARALLEL or any(s.replica for s in shards[t.name]):
            got_dp = (sharding.sharding_type, sorted(sharding.ranks or []))
            want_dp = (DATA_PARALLEL if all(s.replica for s in shards[t.name]) else "not data_parallel",
                       sorted(s.device for s in shards[t.name]))
            if got_dp != want_dp:
                raise InvalidPlanError(f"table {names[t.name]!r}: TorchRec's sharding {got_dp} differs from the "
                                       f"plan's {want_dp}")
            continue
        got = sorted(torchrec_table_shards(names[t.name], sharding, t.rows, t.dim))
        want = sorted((s.device, *s.rows(t.rows), s.col_start, s.col_end) for s in shards[t.name])
        if got != want:
            raise InvalidPlanError(f"table {names[t.name]!r}: TorchRec's sharding {got} differs from the plan's {want}")


def local_size_of(task: Task) -> int:
    """GPUs per host from the hosts the task's devices name (all devices when they name none). TorchRec puts rank r
    on host r // local_size, so the hosts must be consecutive blocks of ranks of one size: else an error."""
    hosts = task.host_ids()
    n = task.num_devices
    if hosts is None:
        return n
    per_host = n // len(set(hosts))
    if n % len(set(hosts)) or list(hosts) != [r // per_host for r in range(n)]:
        raise DreamShardError(f"task {task.name!r}: devices on hosts {list(hosts)} (by device): TorchRec places rank r "
                              "on host r // GPUs per host, so each host must hold one consecutive block of ranks, "
                              "all blocks of one size; order the devices file by host")
    return per_host


def to_torchrec_module_plan(task: Task, plan: Plan, local_size: int | None = None,
                            device_type: str = COMPUTE_DEVICE, module=None):
    """The EBC's `EmbeddingModuleShardingPlan` (table name -> ParameterSharding) for `plan`.

    `local_size`: GPUs per host (default: from the hosts the task's devices name, each host a
    consecutive block of ranks of one size, as TorchRec lays ranks out; else all devices on one
    host); rank r is placed on `cuda:{r % local_size}` of its host. `device_type="cpu"` makes a plan for CPU ranks
    (gloo), e.g. to try a training script without GPUs. `module`: the user's
    EmbeddingBagCollection holding the task's tables (default: one built on the meta device).
    """
    require_torchrec()
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan

    per_table = table_generators(task, plan)
    n = task.num_devices
    if device_type not in ("cuda", "cpu"):
        raise ValueError(f"device_type: expected 'cuda' or 'cpu', got {device_type!r}")
    local = local_size_of(task) if local_size is None else int(local_size)
    if not 1 <= local <= n:
        raise ValueError(f"local_size: expected 1..{n} GPUs per host, got {local_size}")
    module_plan = construct_module_sharding_plan(meta_ebc(task) if module is None else module, per_table,
                                                 sharder=EmbeddingBagCollectionSharder(),
                                                 local_size=local, world_size=n, device_type=device_type)
    check_module_plan(task, plan, module_plan)  # TorchRec builds column-wise and row-wise shards itself
    return module_plan


def to_torchrec_plan(task: Task, plan: Plan, fqn: str = DEFAULT_FQN, local_size: int | None = None,
                     device_type: str = COMPUTE_DEVICE):
    """A TorchRec `ShardingPlan` placing the task's EBC (module `fqn` of the DMP-wrapped model) as `plan` does."""
    from torchrec.distributed.types import ShardingPlan

    return ShardingPlan({fqn: to_torchrec_module_plan(task, plan, local_size, device_type)})


def save_torchrec_plan(task: Task, plan: Plan, path: str | os.PathLike, fqn: str = DEFAULT_FQN,
                       local_size: int | None = None, device_type: str = COMPUTE_DEVICE) -> None:
    """Write the ShardingPlan with torch.save; `torch.load(path, weights_only=False)` returns it."""
    import torch

    sharding_plan = to_torchrec_plan(task, plan, fqn, local_size, device_type)
    with atomic_path(path) as tmp:
        torch.save(sharding_plan, tmp)


def torchrec_table_shards(name: str, sharding, rows: int, dim: int) -> list[tuple[int, int, int, int, int]]:
    """(rank, row_start, row_end, col_start, col_end) per non-empty shard of a table's ParameterSharding.

    Any sharding type whose shards are blocks of the table on one rank each (table-wise,
    column-wise, table-column-wise, row-wise, table-row-wise, grid) converts; data-parallel
    (every rank holds the whole table: replicas, not shards) raises DreamShardError, as do
    shards outside the table or on another rank than listed.
    """
    kind = sharding.sharding_type
    if kind not in SHARD_TYPES:
        raise DreamShardError(
            f"table {name!r}: TorchRec chose {kind!r} sharding, which a DreamShard plan cannot represent "
            f"(it holds blocks of a table on one device each: {', '.join(SHARD_TYPES)})"
        )
    spec = sharding.sharding_spec
    metas = list(spec.shards) if spec is not None else []
    ranks = list(sharding.ranks or [])
    if not metas or len(metas) != len(ranks):
        raise DreamShardError(f"table {name!r}: {kind} sharding with {len(metas)} shards and ranks {ranks}")
    out = []
    for meta, rank in zip(metas, ranks):
        (row_off, col_off), (nrows, ncols) = meta.shard_offsets, meta.shard_sizes
        placed = meta.placement.rank() if meta.placement is not None else rank
        if nrows == 0:
            continue  # TorchRec's row-wise layout leaves the last ranks empty when rows < ranks
        if row_off < 0 or row_off + nrows > rows or col_off < 0 or col_off + ncols > dim or placed != rank:
            raise DreamShardError(
                f"table {name!r}: {kind} shard at offset {list(meta.shard_offsets)} of size {list(meta.shard_sizes)} "
                f"on rank {placed} (ranks {ranks}) is not a block of its {rows} x {dim} table on that rank"
            )
        out.append((int(rank), int(row_off), int(row_off + nrows), int(col_off), int(col_off + ncols)))
    return sorted(out, key=lambda r: (r[1], r[3]))


# ------------------------------------------------------------------ TorchRec's perf model

@dataclass(frozen=True)
class TorchRecEstimate:
    """TorchRec's analytic estimate of a plan: a model, not a measurement.

    Per shard, TorchRec's `EmbeddingPerfEstimator` (bandwidth-based, for CUDA with its
    default bandwidths) gives fwd/bwd compute and comms in ms; per rank they are summed
    (no fusion effect); the plan's rating is the slowest rank, as TorchRec's planner
    rates its own candidates (`NoopPerfModel`): for the plan the `torchrec` sharder
    returns, `cost_ms` equals the rating TorchRec's planner gave it. TorchRec's
    `input_dist_comms` is not part of its total and is left out here too.
    `rank_hbm_bytes`: per rank, the HBM TorchRec's own `EmbeddingStorageEstimator` says the
    plan's shards take (weights, the optimizer state of the task's optimizer, input and
    output buffers at `batch_size`), to compare with what TorchRec's reservation leaves.
    """

    cost_ms: float  # max over ranks of rank_ms
    rank_ms: tuple[float, ...]
    rank_breakdown_ms: tuple[dict[str, float], ...]  # fwd_compute, fwd_comms, bwd_compute, bwd_comms, prefetch_compute
    batch_size: int
    rank_hbm_bytes: tuple[int, ...] = ()
    rank_ddr_bytes: tuple[int, ...] = ()  # per rank, the host memory TorchRec counts (UVM-cached tables' weights)
    model: str = "torchrec EmbeddingPerfEstimator (analytic, CUDA defaults)"


@dataclass(frozen=True)
class TorchRecEstimator:
    """TorchRec's perf model as a CostEstimator (torchrec_perf_estimate at `batch_size`; never a measurement): per
    rank, forward compute (with prefetch), backward compute and the two exchanges, as TorchRec's Perf sums them."""

    batch_size: int = DEFAULT_BATCH_SIZE

    def plan_cost(self, task: Task, plan: Plan) -> PlanCost:
        est = torchrec_perf_estimate(task, plan, self.batch_size)
        devices = tuple(DeviceCost(b["fwd_compute"] + b["prefetch_compute"], b["bwd_compute"], b["fwd_comms"],
                                   b["bwd_comms"]) for b in est.rank_breakdown_ms)
        return PlanCost(devices, "torchrec", est.model, False, "model")


def torchrec_perf_estimate(task: Task, plan: Plan, batch_size: int = DEFAULT_BATCH_SIZE,
                           topo=None, calibration: Any = None) -> TorchRecEstimate:
    """Rate `plan` with TorchRec's own performance and storage models (see TorchRecEstimate), on TorchRec's
    topology `topo` (default: `topology(task)`); `calibration`: its compute as fitted to our measurements
    (interop.calibration). The last few ratings are kept: a sharder choosing between plans and the planner
    checking the chosen one's storage ask for the same one."""
    require_torchrec()
    return _kept_estimate(task, plan, batch_size, topo, calibration)


@functools.lru_cache(maxsize=8)
def _kept_estimate(task: Task, plan: Plan, batch_size: int, topo=None, calibration: Any = None) -> TorchRecEstimate:
    with quiet_torchrec():
        return _perf_estimate(task, plan, batch_size, topo, calibration)


def torchrec_optimizer_classes() -> dict[str, tuple[type, ...]]:
    """Our optimizer name (dreamshard.memory) -> the optimizer classes TorchRec's storage estimator reads off a
    weight for it (torch's and TorchRec's own); the first is the one attached to a module built here."""
    import torch
    from torchrec import optim as trec_optim

    return {"exact_sgd": (torch.optim.SGD, trec_optim.SGD), "exact_row_wise_adagrad": (trec_optim.RowWiseAdagrad,),
            "exact_adagrad": (torch.optim.Adagrad, trec_optim.Adagrad), "adam": (torch.optim.Adam, trec_optim.Adam)}


def shard_estimates(task: Task, slices: Mapping[str, list[Shard]], batch_size: int,
                    caches: Mapping[str, float] | None = None, topo=None, calibration: Any = None) -> list:
    """TorchRec's `ShardingOption` of every table, its shards set to `slices` (table name -> its blocks, each on
    its device, in TorchRec's layout), with TorchRec's perf and storage estimates filled in per shard. Memory is
    not checked here: rating pieces before they are placed (sharders/torchrec_model.py) needs every layout priced.
    `topo`: the task's TorchRec topology, when the caller has built it (`topology(task)`); `calibration`: TorchRec's
    compute as fitted to our measurements (interop.calibration)."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import Shard as TRShard

    topo = topology(task) if topo is None else topo
    kinds = {t.name: [table_layout(task, i, slices[t.name])] for i, t in enumerate(task.tables)}
    constraints = table_constraints(task, kinds, caches or {})
    enum = enumerator(task, topo, constraints, batch_size, torchrec_storage=True, calibration=calibration)
    module = meta_module(task)
    optimizer = torchrec_optimizer_classes()[task.memory.optimizer][0]
    for param in module.parameters():  # TorchRec counts the optimizer state of the class attached to a weight
        param._optimizer_classes = [optimizer]
    options = enum.enumerate(module, [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()])
    by_name = {o.name: o for o in options}
    for t in task.tables:
        option = by_name[t.name]
        option.shards = [TRShard(size=[s.num_rows(t.rows), s.width], offset=[s.row_start, s.col_start])
                         for s in slices[t.name]]
    enum.populate_estimates(options)  # per-shard perf and TorchRec's storage for the plan's own slices
    for t in task.tables:
        for shard, s in zip(by_name[t.name].shards, slices[t.name]):
            shard.rank = s.device
    return options


def _perf_estimate(task: Task, plan: Plan, batch_size: int, topo=None, calibration: Any = None) -> TorchRecEstimate:
    from torchrec.distributed.planner.perf_models import NoopPerfModel

    topo = topology(task) if topo is None else topo
    options = shard_estimates(task, _table_shards(task, plan), batch_size, plan_caches(task, plan), topo, calibration)
    fields = ("fwd_compute", "fwd_comms", "bwd_compute", "bwd_comms", "prefetch_compute")  # Perf.total's terms
    breakdown = [dict.fromkeys(fields, 0.0) for _ in range(task.num_devices)]
    totals = [0.0] * task.num_devices
    hbm, ddr = [0] * task.num_devices, [0] * task.num_devices
    for option in options:
        for shard in option.shards:
            for f in fields:
                breakdown[shard.rank][f] += float(getattr(shard.perf, f))
            totals[shard.rank] += float(shard.perf.total)
            hbm[shard.rank] += int(shard.storage.hbm)
            ddr[shard.rank] += int(shard.storage.ddr)
    cost = float(NoopPerfModel(topo).rate(options))
    estimate = TorchRecEstimate(cost, tuple(totals), tuple(breakdown), batch_size, tuple(hbm), tuple(ddr))
    return estimate if calibration is None else replace(
        estimate, model="torchrec EmbeddingPerfEstimator (analytic, compute calibrated to measurements)")
