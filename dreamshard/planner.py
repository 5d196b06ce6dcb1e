"""`DreamShardPlanner`: a TorchRec `ShardingPlanner` that plans with any DreamShard sharder.

A training script swaps TorchRec's planner for it and changes nothing else: it reads the tables, pooling
factors and per-rank memory TorchRec would, plans them as one task with `algo`, and returns a `ShardingPlan`
checked against TorchRec's own storage estimate. A constraint it cannot honour is an error, never ignored.
What it reads, its arguments and a complete script: docs/torchrec.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreamshard.data.cluster import Constraints
from dreamshard.errors import DreamShardError, InfeasibleTaskError, InvalidPlanError
from dreamshard.interop.torchrec import require_torchrec
from dreamshard.memory import DEFAULT_BATCH_SIZE, DEFAULT_RESERVATION, GB, OPTIMIZER_STATE_BYTES, MemoryModel
from dreamshard.plan import Plan, validate_plan
from dreamshard.tables import Table
from dreamshard.tasks import ALL_SHARDING_KINDS, Device, Task

DEFAULT_POOLING_FACTOR = 1.0  # TorchRec's planner assumes 1.0 when no constraint gives one


@dataclass(frozen=True)
class ModuleTables:
    """The tables of one planned collection (EBC or EC): its fqn, the module, and (task name, TorchRec name) pairs."""

    fqn: str
    module: Any
    names: tuple[tuple[str, str], ...]


require_torchrec()  # this module is TorchRec's planner interface: importing it needs TorchRec

from torchrec.distributed.planner.types import PlannerError, PlannerErrorType  # noqa: E402
from torchrec.distributed.types import ShardingPlanner  # noqa: E402


class DreamShardPlannerError(DreamShardError, PlannerError):
    """A planning failure as TorchRec's planner reports one: a `PlannerError` with TorchRec's `error_type`
    (INSUFFICIENT_STORAGE, STRICT_CONSTRAINTS, INPUT_VALIDATION, OTHER), and a DreamShardError."""

    def __init__(self, message: str, error_type: PlannerErrorType = PlannerErrorType.OTHER) -> None:
        PlannerError.__init__(self, message, error_type)


# TorchRec's sharding types -> our kinds (Task.table_kinds): a whole table is table_wise, or column_wise in one
# slice; table_row_wise is row-wise over one host: TorchRec's row-wise layout when the topology has one host,
# our "host" kind (row-wise over one host's devices) when it has several (ACROSS_HOSTS)
KINDS_OF_TYPE = {"table_wise": ("table",), "column_wise": ("table", "column"), "row_wise": ("row",),
                 "table_row_wise": ("row",), "data_parallel": ("data",)}
ACROSS_HOSTS = {**KINDS_OF_TYPE, "table_row_wise": ("host",)}
# how a whole table is written, in order of preference, and on one rank (every layout holds a whole table there)
WHOLE_TYPES = ("table_wise", "column_wise")
ONE_RANK_TYPES = ("row_wise", "table_row_wise", "data_parallel")
MODEL_PARALLEL_KERNELS = ("fused", "fused_uvm_caching", "fused_uvm")
TIMEOUT_SEARCH_SHARE = 0.7  # of timeout_seconds, the share a sharder's search may take (those taking a time_limit)


@dataclass(frozen=True)
class TableTypes:
    """TorchRec's sharding types one table may take, after its constraint and its module's sharder, and how each
    of our layouts of it is written: a whole table (`whole_as`), row-wise blocks (`row_as`)."""

    kinds: tuple[str, ...]
    whole_as: str | None
    row_as: str | None


class DreamShardPlanner(ShardingPlanner):
    """A TorchRec ShardingPlanner backed by a DreamShard sharder (see the module docstring)."""

    def __init__(self, topology=None, batch_size: int | None = None, enumerator=None, storage_reservation=None,
                 proposer=None, partitioner=None, performance_model=None, stats=None,
                 constraints: dict | None = None, debug: bool = True, callbacks=None,
                 timeout_seconds: int | None = None, plan_loader=None, *,
                 algo: str | None = None, model: Any = None, optimizer: str | None = None,
                 sharding: Sequence[str] = ALL_SHARDING_KINDS, seed: int | None = None,
                 default_pooling_factor: float = DEFAULT_POOLING_FACTOR,
                 devices: Sequence[Device] | str | Path | None = None,
                 placement: Constraints | str | Path | None = None, allow_other_hardware: bool = False) -> None:
        from dreamshard.data.cluster import read_constraints_file, read_devices_file
        from dreamshard.sharders import default_algo, load_model, spec, trained_compute_device

        if algo is None:
            algo = default_algo(model is not None, torchrec=True)

        if topology is None:
            raise DreamShardError("DreamShardPlanner: topology is required (torchrec.distributed.planner.Topology)")
        # TorchRec's search machinery: DreamShard's sharder (algo) takes its place, so none of it is used
        replaced = {"enumerator": enumerator, "proposer": proposer, "partitioner": partitioner,
                    "performance_model": performance_model, "callbacks": callbacks, "plan_loader": plan_loader,
                    "stats": stats or None}
        given = [name for name, value in replaced.items() if value is not None]
        if given:
            raise DreamShardError(f"DreamShardPlanner: {', '.join(given)}: TorchRec's planner parts, which "
                                  f"DreamShard's sharder {algo!r} replaces; leave them out")
        # per rank: kind, speed and host (a devices file, or Device records); memory as the topology says
        self.devices = read_devices_file(devices) if isinstance(devices, (str, Path)) else (
            None if devices is None else tuple(devices))
        # DreamShard's placement constraints by table name (pin, avoid, group, whole): a constraints file or object
        self.placement = read_constraints_file(placement) if isinstance(placement, (str, Path)) else placement

        self.topology = topology
        self.batch_size = int(batch_size) if batch_size is not None else DEFAULT_BATCH_SIZE
        self.storage_reservation = storage_reservation  # None: TorchRec's default, made per plan (below)
        self.constraints = dict(constraints or {})
        self.debug = bool(debug)
        self.timeout_seconds = timeout_seconds
        self.algo = algo
        self.optimizer = optimizer  # None: the optimizer attached to the module's tables (or exact_sgd)
        self.sharding = tuple(sharding)
        self.default_pooling_factor = float(default_pooling_factor)
        s = spec(algo)
        options: dict[str, Any] = {}
        if model is not None:
            options["model"] = load_model(algo, model) if isinstance(model, (str, Path)) else model
            trained_on = trained_compute_device(getattr(options["model"], "meta", None))
            if trained_on is not None and trained_on != topology.compute_device and not allow_other_hardware:
                raise DreamShardPlannerError(
                    f"DreamShardPlanner: model {str(model) if isinstance(model, (str, Path)) else algo!r} was trained "
                    f"on {trained_on} kernel timings, but the topology's compute device is {topology.compute_device}: "
                    f"it would plan by the wrong hardware. Train one on {topology.compute_device} (`make run` there; "
                    "GPU: tools/gpu_b65536.sh), leave out model= to plan with torchrec_model, or pass "
                    "allow_other_hardware=True", PlannerErrorType.INPUT_VALIDATION)
        if seed is not None:
            options["seed"] = seed
        if "batch_size" in s.options:  # our sharders take the global batch: TorchRec's per-rank one x ranks
            options["batch_size"] = self.batch_size * topology.world_size
        if "torchrec_topology" in s.options:  # TorchRec's perf model rates plans on the user's cluster, not defaults
            options["torchrec_topology"] = topology
        if "fallback" in s.options:  # a learned sharder beyond its training range also plans by TorchRec's planner
            from dreamshard.sharders import FALLBACK, make_sharder

            options["fallback"] = make_sharder(FALLBACK, batch_size=self.batch_size * topology.world_size,
                                               torchrec_topology=topology)
        if "time_limit" in s.options and timeout_seconds is not None:
            options["time_limit"] = TIMEOUT_SEARCH_SHARE * timeout_seconds  # the rest: export and TorchRec's check
        self.options = options
        self.last_task: Task | None = None
        self.last_plan: Plan | None = None
        self.last_hbm: tuple[int, ...] = ()  # TorchRec's storage estimate of the last plan, per rank

    def plan(self, module, sharders) -> Any:
        import time

        from torchrec.distributed.types import ShardingPlan

        from dreamshard.interop.torchrec import table_generators
        from dreamshard.sharders import make_sharder

        start = time.perf_counter()
        self._num_proposals, self._best_plan = 0, None
        sharders = sharders if sharders is not None else _default_sharders()
        if not _embedding_modules(module, sharders):  # no collection with a sharder: nothing to plan, as TorchRec
            return ShardingPlan({})
        task: Task | None = None
        try:
            task, modules = self.task(module, sharders)
            with _torch_threads(1):
                plan = make_sharder(self.algo, **self.options).shard(task)
            self._num_proposals = 1
            validate_plan(task, plan)
            self._check_torchrec_storage(task, plan)
        except PlannerError:
            raise
        except DreamShardError as exc:
            raise DreamShardPlannerError(f"{exc}", self._error_type(exc, task)) from exc
        elapsed = time.perf_counter() - start
        if self.timeout_seconds is not None and elapsed > self.timeout_seconds:
            raise DreamShardPlannerError(f"DreamShardPlanner: planning took {elapsed:.1f} s, over timeout_seconds="
                                         f"{self.timeout_seconds}", PlannerErrorType.OTHER)
        self.last_task, self.last_plan = task, plan
        # every table's sharding, once for all modules
        generators = table_generators(task, plan, {k: t.whole_as for k, t in self._types.items() if t.whole_as},
                                      {k: t.row_as for k, t in self._types.items() if t.row_as})
        sharding_plan = ShardingPlan({m.fqn: self._module_plan(task, plan, generators, m, sharders) for m in modules})
        self._best_plan = self._sharding_options(task, modules, sharding_plan)
        if self.debug:
            self._print_summary(task, plan, elapsed)
        return sharding_plan

    @staticmethod
    def _error_type(exc: Exception, task: Task | None) -> PlannerErrorType:
        """TorchRec's class of a failure: INSUFFICIENT_STORAGE when the tables, each in its smallest form, need
        more than the ranks hold (as TorchRec's planner decides it), else STRICT_CONSTRAINTS for a task with no
        plan, INPUT_VALIDATION for what was given."""
        if task is None or not isinstance(exc, (InfeasibleTaskError, InvalidPlanError)):
            return PlannerErrorType.INPUT_VALIDATION if task is None else PlannerErrorType.OTHER
        smallest = sum(task.shard_bytes(t) for t in task.tables)  # whole: no cut makes a table smaller
        if smallest > sum(task.capacities()):
            return PlannerErrorType.INSUFFICIENT_STORAGE
        return PlannerErrorType.STRICT_CONSTRAINTS

    def _sharding_options(self, task: Task, modules: list[ModuleTables], sharding_plan) -> list:
        """The plan as TorchRec's planner keeps its best plan (`_best_plan`): a ShardingOption per table, in the
        modules' table order, with its shards and what its constraint passes through."""
        from torchrec.distributed.planner.enumerators import get_partition_by_type
        from torchrec.distributed.planner.types import Shard as TorchRecShard
        from torchrec.distributed.planner.types import ShardingOption

        pooling = {t.name: t.pooling_factor for t in task.tables}
        options = []
        for m in modules:
            params = dict(_ebc_of(m.module).named_parameters()) if not _is_sequence(m.module) else \
                dict(m.module.named_parameters())
            configs = {c.name: c for c in _configs_of(m.module)}
            for key, name in m.names:
                ps = sharding_plan.plan[m.fqn][name]
                c = self.constraints.get(name)
                tensor = next((p for n, p in params.items() if n.endswith(f"{name}.weight")), None)
                shards = [TorchRecShard(size=list(md.shard_sizes), offset=list(md.shard_offsets), rank=r)
                          for md, r in zip(ps.sharding_spec.shards, ps.ranks)] if ps.sharding_spec is not None \
                    else [TorchRecShard(size=[configs[name].num_embeddings, configs[name].embedding_dim],
                                        offset=[0, 0], rank=r) for r in ps.ranks or []]
                options.append(ShardingOption(
                    name=name, tensor=tensor, module=(m.fqn, m.module), input_lengths=[pooling[key]],
                    batch_size=self.batch_size, sharding_type=ps.sharding_type,
                    partition_by=get_partition_by_type(ps.sharding_type), compute_kernel=ps.compute_kernel,
                    shards=shards, cache_params=ps.cache_params, enforce_hbm=ps.enforce_hbm,
                    stochastic_rounding=ps.stochastic_rounding, bounds_check_mode=ps.bounds_check_mode,
                    is_pooled=not _is_sequence(m.module), feature_names=list(configs[name].feature_names),
                    num_poolings=list(c.num_poolings) if c is not None and c.num_poolings else None))
        return options

    def _check_torchrec_storage(self, task: Task, plan: Plan) -> None:
        """TorchRec's own storage estimate of the plan, rank by rank, within what its reservation leaves."""
        from dreamshard.interop.torchrec import topology_from, torchrec_perf_estimate

        hbm = torchrec_perf_estimate(task, plan, self.batch_size, topology_from(task, self.topology)).rank_hbm_bytes
        for rank, need in enumerate(hbm):
            if need > task.capacity(rank):
                raise DreamShardError(
                    f"DreamShardPlanner: rank {rank}: TorchRec's storage estimator counts {need} bytes "
                    f"({need / GB:.3f} GB) of shards, over the {task.capacity(rank)} bytes its storage reservation "
                    f"leaves ({task.capacity(rank) / GB:.3f} GB); the plan is not returned")
        self.last_hbm = tuple(hbm)

    def _print_summary(self, task: Task, plan: Plan, elapsed: float) -> None:
        from dreamshard.plan import device_memory_breakdown

        print(f"DreamShardPlanner ({self.algo}): {len(task.tables)} tables on {task.num_devices} ranks in "
              f"{elapsed * 1000:.0f} ms; HBM GB per rank (ours / TorchRec's estimate / usable):")
        for rank, m in enumerate(device_memory_breakdown(task, plan)):
            print(f"  rank {rank}: {m.used / GB:.3f} / {self.last_hbm[rank] / GB:.3f} / {m.capacity / GB:.3f}")

    def collective_plan(self, module, sharders=None, pg=None) -> Any:
        """Plan on rank 0 and broadcast the plan to every rank of `pg` (default: the world)."""
        import torch.distributed as dist
        from torchrec.distributed.collective_utils import invoke_on_rank_and_broadcast_result
        from torchrec.distributed.sharding_plan import get_default_sharders

        if pg is None:
            if not dist.is_initialized():
                raise DreamShardError("collective_plan needs an initialised process group "
                                      "(torch.distributed.init_process_group); on one process use plan()")
            pg = dist.GroupMember.WORLD
        return invoke_on_rank_and_broadcast_result(pg, 0, self.plan, module,
                                                   sharders if sharders is not None else get_default_sharders())

    # -------------------------------------------------------------- reading the module

    def task(self, module, sharders=None) -> tuple[Task, list[ModuleTables]]:
        """The DreamShard task of every EBC table in `module`, and where each table lives: memory as TorchRec
        counts it (the module's optimizer, buffers at batch_size, each rank's HBM less TorchRec's reservation)."""
        from torchrec.modules.embedding_configs import DataType

        sharders = sharders if sharders is not None else _default_sharders()
        found = _embedding_modules(module, sharders)
        if not found:
            raise DreamShardPlannerError("DreamShardPlanner: the module holds no EmbeddingBagCollection or "
                                         "EmbeddingCollection that the sharders shard", PlannerErrorType.OTHER)
        all_names = [c.name for _, m in found for c in _configs_of(m)]
        clash = {n for n in all_names if all_names.count(n) > 1}
        kinds = self._kinds_allowed(found, sharders)
        kernels = self._kernels_allowed(found, sharders)
        offered = {False: self._offered(found, sharders), True: self._sequence_offered(found, sharders)}
        tables, modules, precisions, whole, model_parallel, uncached = [], [], set(), [], [], []
        table_kinds, min_widths, must_cache, cache_factors, never_host = [], [], [], [], []
        self._types: dict[str, TableTypes] = {}
        for fqn, m in found:
            names = []
            sequence = _is_sequence(m)
            for c in _configs_of(m):
                key = f"{fqn}/{c.name}" if c.name in clash else c.name
                if c.data_type not in (DataType.FP32, DataType.FP16):
                    raise DreamShardError(f"DreamShardPlanner: table {c.name!r} ({fqn or 'module'}): data type "
                                          f"{c.data_type} is not planned; fp32 or fp16 weights are")
                constraint = self.constraints.get(c.name)
                if constraint is not None:
                    _check_constraint_fields(c, constraint)
                precision = "fp16" if c.data_type == DataType.FP16 else "fp32"
                precisions.add(precision)
                pooling, features = self._pooling(c)
                tables.append(Table(key, int(c.num_embeddings), int(c.embedding_dim), pooling,
                                    features=features, precision=precision, sequence=sequence))
                names.append((key, c.name))
                types = self._table_types(c, offered[sequence], kinds, kernels, sequence)
                self._types[key] = types
                if types.kinds != kinds:
                    table_kinds.append((key, types.kinds))
                if types.kinds == ("table",) and self.topology.world_size > 1:
                    whole.append(key)  # its constraint allows a whole table only: never cut
                if "data" not in types.kinds:
                    model_parallel.append(key)
                ck = None if constraint is None else constraint.compute_kernels
                if ck is not None and "fused_uvm_caching" not in ck:
                    uncached.append(key)
                if ck is not None and "fused_uvm" not in ck:
                    never_host.append(key)
                kernels_of = set(ck) if ck is not None else set(MODEL_PARALLEL_KERNELS)
                in_host = "fused" not in kernels_of and types.kinds != ("data",)
                if in_host and {"fused_uvm_caching", "fused_uvm"} & kernels_of:
                    must_cache.append(key)  # its kernels keep it in host memory
                params = None if constraint is None else getattr(constraint, "cache_params", None)
                if in_host and "fused_uvm_caching" not in kernels_of:
                    cache_factors.append((key, 0.0))  # fused_uvm alone: wholly in host memory
                elif params is not None and params.load_factor is not None:
                    cache_factors.append((key, float(params.load_factor)))
                if constraint is not None and constraint.min_partition is not None:
                    min_widths.append((key, max(4, int(constraint.min_partition))))
            modules.append(ModuleTables(fqn, m, tuple(names)))
        for name in must_cache:
            want = "fused_uvm" if (name, 0.0) in cache_factors else "fused_uvm_caching"
            if want not in kernels:
                raise DreamShardPlannerError(
                    f"DreamShardPlanner: table {name!r}: its constraint's compute_kernels keep it in host memory "
                    f"({want}), which the sharders do not offer on {self.topology.compute_device}",
                    PlannerErrorType.STRICT_CONSTRAINTS)
        # each table at its own precision (Table.precision); the model's is the widest, for what has none
        memory = MemoryModel("fp32" if "fp32" in precisions else "fp16", self._optimizer_of(found, sharders),
                             self.batch_size)
        task = Task("torchrec-module", tuple(tables), self._devices(module, sharders), memory,
                    sharding=kinds, whole=tuple(whole), model_parallel=tuple(model_parallel), kernels=kernels,
                    uncached=tuple(uncached), table_kinds=tuple(table_kinds), min_widths=tuple(min_widths),
                    must_cache=tuple(must_cache), cache_factors=tuple(cache_factors), never_host=tuple(never_host))
        if self.placement:
            try:
                task = self.placement.apply(task)
            except ValueError as exc:
                raise DreamShardError(f"DreamShardPlanner: placement constraints: {exc}") from None
        return task, modules

    def _optimizer_of(self, found, sharders) -> str:
        """The optimizer whose state is counted: the one attached to the tables (apply_optimizer_in_backward,
        read as TorchRec's storage estimator reads it, or a FusedEmbeddingBagCollection's own), else the EBC
        sharder's fused optimizer, else `optimizer`
        (default exact_sgd); with several attached, the one keeping the most state. An optimizer we do not
        model, or one that contradicts `optimizer`, is an error."""
        attached = {c for _, m in found for p in m.parameters() for c in getattr(p, "_optimizer_classes", [])}
        # a FusedEmbeddingBagCollection carries its optimizer itself
        attached |= {m._optimizer_type for _, m in found if getattr(m, "_optimizer_type", None) is not None}
        names = {_optimizer_name(c) for c in attached}
        if not names:
            for sharder in sharders:
                fused = getattr(sharder, "fused_params", None) or {}
                if "optimizer" in fused:
                    names.add(_fused_optimizer_name(fused["optimizer"]))
        if not names:
            return self.optimizer or "exact_sgd"
        chosen = max(names, key=lambda n: (OPTIMIZER_STATE_BYTES[n][1], OPTIMIZER_STATE_BYTES[n][0]))
        if self.optimizer is not None and self.optimizer != chosen:
            raise DreamShardError(f"DreamShardPlanner: optimizer={self.optimizer!r}, but the module's tables train "
                                  f"with {chosen!r}; drop the argument or make them agree")
        return chosen

    def _offered(self, found, sharders) -> list[str] | None:
        """The sharding types that the sharders of every planned bag collection (EBC, FusedEBC, FP-EBC) offer
        with the fused kernel on this compute device (None: none given, TorchRec's defaults offer them all)."""
        offered: list[str] | None = None
        for sharder, types in self._offers(found, sharders, sequence=False):
            if not {"table_wise", "column_wise", "row_wise"} & set(types):
                device = self.topology.compute_device
                raise DreamShardError(f"DreamShardPlanner: the sharder {type(sharder).__name__} offers "
                                      f"{sharder.sharding_types(device)} on {device}, with the fused kernel "
                                      f"{types or 'none'}; DreamShard's plans need table_wise, column_wise or "
                                      "row_wise with the fused kernel")
            offered = types if offered is None else [t for t in offered if t in types]
        if offered is not None and not {"table_wise", "column_wise", "row_wise"} & set(offered):
            raise DreamShardError("DreamShardPlanner: the bag collections' sharders offer no sharding type in common "
                                  "among table_wise, column_wise and row_wise with the fused kernel")
        return offered

    def _sequence_offered(self, found, sharders) -> list[str] | None:
        """The sharding types the EmbeddingCollections' sharders all offer with the fused kernel (None: none
        given)."""
        offered: list[str] | None = None
        for _, types in self._offers(found, sharders, sequence=True):
            offered = types if offered is None else [t for t in offered if t in types]
        return offered

    @property
    def _one_host(self) -> bool:
        return self.topology.local_world_size >= self.topology.world_size

    @property
    def _row_types(self) -> tuple[str, ...]:
        """TorchRec's sharding types of our "row" kind: table_row_wise is row-wise on one host, "host" across hosts."""
        return ("row_wise", "table_row_wise") if self._one_host else ("row_wise",)

    def _kinds_allowed(self, found, sharders) -> tuple[str, ...]:
        """`sharding` narrowed to what the sharder of every planned module offers: the bag collections' (`_offered`)
        and the EmbeddingCollections'; "data" (data-parallel bag tables) only when every bag collection's sharder
        offers data_parallel with the dense kernel. "table" stays: each table's own types (`_table_types`) say
        whether it may be whole. A restricted sharder is honoured."""
        offered = self._offered(found, sharders)
        kinds = self.sharding
        if self._one_host:  # table_row_wise is the row-wise layout there ("row")
            kinds = tuple(k for k in kinds if k != "host")
        if offered is not None:
            kinds = tuple(k for k in kinds if k in ("table", "data") or (k == "column" and "column_wise" in offered)
                          or (k == "row" and set(self._row_types) & set(offered))
                          or (k == "host" and "table_row_wise" in offered))
        device = self.topology.compute_device
        if not all("data_parallel" in s.sharding_types(device) and "dense" in s.compute_kernels("data_parallel", device)
                   for s in _bag_sharders(found, sharders)):
            kinds = tuple(k for k in kinds if k != "data")
        for _, ec in self._offers(found, sharders, sequence=True):
            if "table_wise" not in ec:
                raise DreamShardError(f"DreamShardPlanner: the EmbeddingCollection sharder offers {ec} with the "
                                      "fused kernel; DreamShard places whole tables table_wise")
            by_kind = {"table": "table_wise", "column": "column_wise", "row": "row_wise", "host": "table_row_wise"}
            kinds = tuple(k for k in kinds if k == "data" or by_kind[k] in ec)  # sequence tables: never replicas
        return kinds

    def _table_types(self, config, offered: list[str] | None, kinds: tuple[str, ...], kernels: tuple[str, ...],
                     sequence: bool) -> TableTypes:
        """The TorchRec sharding types table `config` may take: what its module's sharder offers (`offered`, with
        a fused kernel; data_parallel where `kinds` allow "data"), narrowed by its constraint's sharding_types and
        compute_kernels; our kinds of them, and how a whole table and row-wise blocks are written. None left is an
        error naming the table, before any planning."""
        c = self.constraints.get(config.name)
        asked = None if c is None or c.sharding_types is None else list(c.sharding_types)
        ck = None if c is None or c.compute_kernels is None else list(c.compute_kernels)
        avail = list(offered) if offered is not None else ["table_wise", "column_wise", "row_wise", "table_row_wise"]
        if "data" in kinds and not sequence:
            avail.append("data_parallel")
        types = [t for t in avail if t in KINDS_OF_TYPE and (asked is None or t in asked)]
        if ck is not None:
            model_parallel = any(k in ck for k in MODEL_PARALLEL_KERNELS)
            types = [t for t in types if (t == "data_parallel" and "dense" in ck)
                     or (t != "data_parallel" and model_parallel)]
        kinds_of_type = KINDS_OF_TYPE if self._one_host else ACROSS_HOSTS
        if self.topology.world_size == 1:  # one rank: every layout is the whole table
            ours: tuple[str, ...] = ("table",) if types else ()
        else:
            ours = tuple(k for k in kinds if any(k in kinds_of_type[t] for t in types))
        if not ours:
            raise DreamShardPlannerError(
                f"DreamShardPlanner: table {config.name!r}: its constraint allows sharding types "
                f"{asked or 'any'} with compute kernels {ck or 'any'}, its sharder offers {avail} on "
                f"{self.topology.compute_device}{'' if self._one_host else ' across hosts'}, and `sharding` allows "
                f"{list(kinds)}: none in common that DreamShard plans (table_wise, column_wise, row_wise, "
                "table_row_wise, data_parallel)", PlannerErrorType.STRICT_CONSTRAINTS)
        whole_types = WHOLE_TYPES + (ONE_RANK_TYPES if self.topology.world_size == 1 else ())
        whole_as = next((t for t in whole_types if t in types), None)
        row_as = next((t for t in self._row_types if t in types), None)
        return TableTypes(ours, whole_as, row_as)

    def _kernels_allowed(self, found, sharders) -> tuple[str, ...]:
        """fused, and fused_uvm_caching and fused_uvm, each when the sharder of every planned bag collection offers
        it with table_wise, column_wise and row_wise on this compute device (TorchRec's do on cuda): tables that HBM
        cannot hold are then kept in host memory, cached, or wholly there (dreamshard.caching)."""
        device = self.topology.compute_device
        bag_sharders = _bag_sharders(found, sharders)

        def offered(kernel: str) -> bool:
            return bool(bag_sharders) and all(
                kernel in s.compute_kernels(t, device)
                for s in bag_sharders for t in ("table_wise", "column_wise", "row_wise")
                if t in s.sharding_types(device))

        return ("fused", *(k for k in ("fused_uvm_caching", "fused_uvm") if offered(k)))

    def _offers(self, found, sharders, sequence: bool) -> list[tuple[Any, list[str]]]:
        """(sharder, the sharding types it offers with the fused kernel on this compute device) of every planned
        module's sharder, as DistributedModelParallel picks it (`_sharder_of`): of the EmbeddingCollections'
        (`sequence`) or of the bag collections'. A module whose sharder is not given has none here."""
        device = self.topology.compute_device
        picked = {}
        for _, m in found:
            sharder = _sharder_of(m, sharders)
            if sharder is not None and _is_sequence(m) == sequence:
                picked[id(sharder)] = sharder
        return [(s, [t for t in s.sharding_types(device) if "fused" in s.compute_kernels(t, device)])
                for s in picked.values()]

    def _pooling(self, config) -> tuple[float, int]:
        """(lookups per sample, pooled outputs per sample) of a table: its constraint's pooling_factors (else
        default_pooling_factor) times its num_poolings, summed over its features, as TorchRec's estimators count
        them; outputs: the num_poolings' sum, else one per feature."""
        c = self.constraints.get(config.name)
        features = max(1, len(config.feature_names))
        given = list(c.pooling_factors) if c is not None and c.pooling_factors else None
        if c is None or not c.num_poolings:
            return (float(sum(given)) if given else self.default_pooling_factor), features
        counts = [float(x) for x in c.num_poolings]
        lengths = given or [self.default_pooling_factor] * len(counts)
        where = f"DreamShardPlanner: table {config.name!r}: constraint num_poolings={c.num_poolings}"
        total = sum(counts)
        if len(lengths) != len(counts):
            raise DreamShardPlannerError(f"{where}: {len(counts)} entries for {len(lengths)} pooling_factors; TorchRec "
                                         "pairs them feature by feature", PlannerErrorType.INPUT_VALIDATION)
        if any(not x > 0 for x in counts) or abs(total - round(total)) > 1e-9:
            raise DreamShardPlannerError(f"{where}: expected positive counts of pooled outputs summing to a whole "
                                         "number", PlannerErrorType.INPUT_VALIDATION)
        return float(sum(x * n for x, n in zip(lengths, counts))), int(round(total))

    def _devices(self, module, sharders) -> tuple[Device, ...]:
        """Per rank, the memory TorchRec's storage reservation leaves (`storage_reservation`, TorchRec's default
        HeuristicalStorageReservation(0.15): a share of HBM, the dense model's parameters and the input batches)."""
        from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation

        reservation = self.storage_reservation or HeuristicalStorageReservation(percentage=DEFAULT_RESERVATION)
        try:
            reserved = reservation.reserve(self.topology, self.batch_size, module, sharders, self.constraints)
        except Exception as exc:  # TorchRec raises PlannerError when the reservation leaves no HBM
            kind = exc.error_type if isinstance(exc, PlannerError) else PlannerErrorType.OTHER
            raise DreamShardPlannerError(f"DreamShardPlanner: TorchRec's storage reservation: "
                                         f"{' '.join(str(exc).split())}", kind) from None
        kind = self.topology.compute_device
        devices = []
        for d in reserved.devices:
            cap = d.storage.hbm if kind in ("cuda", "mtia") else d.storage.ddr
            if cap <= 0:
                raise DreamShardError(f"DreamShardPlanner: rank {d.rank} has no {kind} memory left after TorchRec's "
                                      "storage reservation")
            devices.append(Device(int(cap)))
        if self.devices is None and not self._one_host:  # rank r on host r // local_world_size, as TorchRec lays out
            local = self.topology.local_world_size
            devices = [Device(d.memory_bytes, host=f"host{r // local}") for r, d in enumerate(devices)]
        if self.devices is not None:  # kinds, speeds and hosts per rank; the memory stays the topology's
            if len(self.devices) != len(devices):
                raise DreamShardError(f"DreamShardPlanner: {len(self.devices)} devices given for a topology of "
                                      f"{len(devices)} ranks")
            devices = [Device(d.memory_bytes, given.kind, given.speed, given.host)
                       for d, given in zip(devices, self.devices)]
        return tuple(devices)

    # -------------------------------------------------------------- writing the plan

    def _module_plan(self, task: Task, plan: Plan, generators: dict[str, Any], m: ModuleTables, sharders) -> Any:
        from torchrec.distributed.sharding_plan import construct_module_sharding_plan
        from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

        from dreamshard.interop.torchrec import check_module_plan

        sharder = _sharder_of(m.module, sharders)  # a planned module has one (_embedding_modules)
        per_table = {name: generators[key] for key, name in m.names}
        module_plan = construct_module_sharding_plan(
            m.module, per_table, sharder=sharder, local_size=self.topology.local_world_size,
            world_size=self.topology.world_size, device_type=self.topology.compute_device)
        check_module_plan(task, plan, module_plan, dict(m.names))  # TorchRec builds some shardings itself
        for _, name in m.names:
            c = self.constraints.get(name)
            ps = module_plan[name]
            if c is not None and c.sharding_types is not None and ps.sharding_type not in c.sharding_types:
                raise InvalidPlanError(f"DreamShardPlanner: table {name!r}: planned {ps.sharding_type!r}, outside its "
                                       f"constraint's {c.sharding_types} (a bug: the search works within them)")
            if c is not None:  # written into the plan as TorchRec's planner writes them
                for field in WRITTEN_FIELDS:
                    setattr(ps, field, getattr(c, field))
                if c.cache_params is not None:  # the constraint's, at the load factor the plan caches it at
                    factor = ps.cache_params.load_factor if ps.cache_params is not None else c.cache_params.load_factor
                    ps.cache_params = dataclasses.replace(c.cache_params, load_factor=factor)
        if isinstance(m.module, FeatureProcessedEmbeddingBagCollection):
            rows = [name for _, name in m.names if module_plan[name].sharding_type == "row_wise"]
            if rows:  # TorchRec guards row-wise sharding of feature-processed tables
                raise DreamShardError(f"DreamShardPlanner: feature-processed table(s) {rows} ({m.fqn}) planned "
                                      "row-wise, which TorchRec runs for feature-processed modules only when a "
                                      "constraint asks for it; restrict `sharding` to table and column")
        return module_plan


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to `n` while planning (the learned sharders' small networks run fastest on one;
    a training script's own setting comes back after)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _default_sharders() -> list:
    from torchrec.distributed.sharding_plan import get_default_sharders

    return get_default_sharders()


def _optimizer_name(cls) -> str:
    """Our optimizer name (dreamshard.memory) for an optimizer class attached to a table's weight."""
    from dreamshard.interop.torchrec import torchrec_optimizer_classes

    known = {c: name for name, classes in torchrec_optimizer_classes().items() for c in classes}
    if cls not in known:
        raise DreamShardError(f"DreamShardPlanner: optimizer {getattr(cls, '__name__', cls)} is attached to the "
                              f"tables, and its state is not modelled; planned are {sorted(set(known.values()))}")
    return known[cls]


def _fused_optimizer_name(value) -> str:
    """Our optimizer name for a sharder's fused_params['optimizer'] (FBGEMM's EmbOptimType or its value)."""
    name = str(getattr(value, "value", value))
    known = {"sgd": "exact_sgd", "exact_sgd": "exact_sgd", "adam": "adam", "exact_adagrad": "exact_adagrad",
             "exact_row_wise_adagrad": "exact_row_wise_adagrad", "row_wise_adagrad": "exact_row_wise_adagrad"}
    if name not in known:
        raise DreamShardError(f"DreamShardPlanner: the sharder's fused optimizer {name!r} keeps state that is not "
                              f"modelled; planned are {sorted(set(known.values()))}")
    return known[name]


# ParameterConstraints fields DreamShardPlanner writes into each table's ParameterSharding, as TorchRec does
WRITTEN_FIELDS = ("enforce_hbm", "stochastic_rounding", "bounds_check_mode")


def _check_constraint_fields(config, c) -> None:
    """Every ParameterConstraints field is honoured (sharding_types, compute_kernels, pooling_factors, is_weighted,
    the WRITTEN_FIELDS) or, when set to something DreamShard does not plan for, an error naming it."""
    where = f"DreamShardPlanner: table {config.name!r}: constraint"
    if c.min_partition is not None and (isinstance(c.min_partition, bool) or not isinstance(c.min_partition, int)
                                        or c.min_partition < 1):
        raise DreamShardPlannerError(f"{where} min_partition={c.min_partition!r}: expected a positive whole number of "
                                     "columns (the narrowest column slice)", PlannerErrorType.INPUT_VALIDATION)
    if c.batch_sizes is not None:
        raise DreamShardError(f"{where} batch_sizes={c.batch_sizes}: per-feature batch sizes are not planned; "
                              "give the planner's batch_size")
    if c.feature_names is not None and list(c.feature_names) != list(config.feature_names):
        raise DreamShardError(f"{where} feature_names={c.feature_names}: the table's features are "
                              f"{list(config.feature_names)}; planned are all of them")
    params = getattr(c, "cache_params", None)
    if params is not None and params.load_factor is not None and not 0 < params.load_factor <= 1:
        raise DreamShardPlannerError(f"{where} cache_params.load_factor={params.load_factor!r}: expected a share of "
                                     "the table's rows in (0, 1]", PlannerErrorType.INPUT_VALIDATION)
    if params is not None and params.precision is not None and config.data_type.name == "FP16" \
            and params.precision.name not in ("FP16", "FP8", "INT8", "INT4", "INT2"):
        raise DreamShardPlannerError(f"{where} cache_params.precision={params.precision.name}: a cache wider than its "
                                     "fp16 table is not counted; leave it out or make it fp16",
                                     PlannerErrorType.INPUT_VALIDATION)
    for name in ("key_value_params", "output_dtype", "device_group"):
        if getattr(c, name, None) is not None:
            raise DreamShardError(f"{where} {name}: not planned (key-value tables, other output types and device "
                                  "groups are not DreamShard's choices); leave it out")
    if getattr(c, "use_virtual_table", False):
        raise DreamShardError(f"{where} use_virtual_table: virtual tables are not planned")


def _sharder_of(m, sharders):
    """The sharder DistributedModelParallel shards module `m` with: the last one whose module_type is m's type
    (None: none given)."""
    return {s.module_type: s for s in sharders}.get(type(m))


def _bag_sharders(found, sharders) -> list:
    """The sharder of each planned bag collection: the one given for its type (`_sharder_of`; a planned module
    has one, `_embedding_modules`)."""
    return [_sharder_of(m, sharders) for _, m in found if not _is_sequence(m)]


def _is_sequence(m) -> bool:
    from torchrec import EmbeddingCollection

    return isinstance(m, EmbeddingCollection)


def _configs_of(m) -> list:
    """The table configs of a planned module: an EmbeddingCollection's, or the EBC's it holds."""
    return m.embedding_configs() if _is_sequence(m) else _ebc_of(m).embedding_bag_configs()


def _embedding_modules(module, sharders=None) -> list:
    """(fqn, module) of every collection to plan: a FeatureProcessedEmbeddingBagCollection as one unit (its sharder
    shards the EBC inside it, keyed by its own fqn), every other EBC, FusedEmbeddingBagCollection and
    EmbeddingCollection on its own; with `sharders`, only those one of them shards (as TorchRec's planner, a
    collection without a sharder is left unplanned, and DistributedModelParallel leaves it unsharded)."""
    if sharders is not None:
        return [(fqn, m) for fqn, m in _embedding_modules(module) if _sharder_of(m, sharders) is not None]
    from torchrec import EmbeddingBagCollection, EmbeddingCollection
    from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    fp = [(fqn, m) for fqn, m in module.named_modules() if isinstance(m, FeatureProcessedEmbeddingBagCollection)]
    inside = {f"{fqn}.{name}" if fqn else name for fqn, m in fp for name, _ in m.named_modules() if name}
    plain = [(fqn, m) for fqn, m in module.named_modules()
             if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection, FusedEmbeddingBagCollection))
             and fqn not in inside]
    return sorted(fp + plain, key=lambda item: item[0])


def _ebc_of(m):
    """The EmbeddingBagCollection a planned module holds: itself, or a feature-processed one's."""
    return getattr(m, "_embedding_bag_collection", m)
