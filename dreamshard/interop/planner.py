"""`DreamShardPlanner`: a TorchRec `ShardingPlanner` that plans with any DreamShard sharder.

A training script swaps TorchRec's planner for it and changes nothing else:

    planner = DreamShardPlanner(topology, batch_size=512, constraints=constraints, algo="neuroshard",
                                model="models/neuroshard.pt")
    plan = planner.collective_plan(model, sharders, pg)   # or planner.plan(model, sharders) on one process
    model = DistributedModelParallel(model, plan=plan, sharders=sharders, ...)

What it reads:
- tables: every `EmbeddingBagCollection` in the module (`named_modules`), each table's
  name, rows (`num_embeddings`), dim and data type (fp32 or fp16);
- pooling factors: TorchRec's `ParameterConstraints(pooling_factors=[...])` of the table
  (the sum over its features: each feature's ids look up the same table); a table without
  one gets `default_pooling_factor` (1.0, TorchRec's own default);
- per-rank memory: the `Topology`: HBM on cuda (and mtia), DDR on cpu, rank by rank;
- per-rank kind, speed and host: `devices` (a devices file, dreamshard.cluster, or Device
  records, one per rank; their memory is ignored: the topology's counts);
- placement constraints by table name: `placement` (pin, avoid, group, whole: a constraints
  file or a dreamshard.cluster.Constraints), honoured by every DreamShard sharder;
- the optimizer the memory is counted for: `optimizer` (dreamshard.memory; the fused
  kernel keeps its state beside the weights).

It plans one task holding every table of every EBC with `algo` (a name from
dreamshard.sharders; a learned sharder needs `model`, a checkpoint path or a loaded
model), within `sharding` kinds (table, column, row), and returns a `ShardingPlan`
with one module plan per EBC fqn: table-wise, column-wise and row-wise shardings as
planned (dreamshard.interop.torchrec), compute kernel `fused`, placed on
`{compute_device}:{rank % local_world_size}`. A constraint TorchRec states and the
plan cannot honour (a compute kernel other than `fused`, a table restricted to sharding
types the plan does not use) is an error naming the table, never ignored.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreamshard.cluster import Constraints
from dreamshard.errors import DreamShardError
from dreamshard.interop.torchrec import require_torchrec
from dreamshard.memory import MemoryModel
from dreamshard.plan import Plan, validate_plan
from dreamshard.tables import Table
from dreamshard.tasks import SHARDING_KINDS, Device, Task

DEFAULT_POOLING_FACTOR = 1.0  # TorchRec's planner assumes 1.0 when no constraint gives one


@dataclass(frozen=True)
class ModuleTables:
    """The tables of one EmbeddingBagCollection: its fqn, the module, and (task name, TorchRec name) pairs."""

    fqn: str
    module: Any
    names: tuple[tuple[str, str], ...]


require_torchrec()  # this module is TorchRec's planner interface: importing it needs TorchRec

from torchrec.distributed.types import ShardingPlanner  # noqa: E402


class DreamShardPlanner(ShardingPlanner):
    """A TorchRec ShardingPlanner backed by a DreamShard sharder (see the module docstring)."""

    def __init__(self, topology, batch_size: int | None = None, constraints: dict | None = None,
                 algo: str = "size_lookup_greedy", model: Any = None, optimizer: str = "exact_sgd",
                 sharding: Sequence[str] = SHARDING_KINDS, seed: int | None = None,
                 default_pooling_factor: float = DEFAULT_POOLING_FACTOR,
                 devices: Sequence[Device] | str | Path | None = None,
                 placement: Constraints | str | Path | None = None) -> None:
        from dreamshard.cluster import read_constraints_file, read_devices_file
        from dreamshard.sharders import load_model, spec

        # per rank: kind, speed and host (a devices file, or Device records); memory as the topology says
        self.devices = read_devices_file(devices) if isinstance(devices, (str, Path)) else (
            None if devices is None else tuple(devices))
        # DreamShard's placement constraints by table name (pin, avoid, group, whole): a constraints file or object
        self.placement = read_constraints_file(placement) if isinstance(placement, (str, Path)) else placement

        self.topology = topology
        self.batch_size = batch_size
        self.constraints = dict(constraints or {})
        self.algo = algo
        self.optimizer = optimizer
        self.sharding = tuple(sharding)
        self.default_pooling_factor = float(default_pooling_factor)
        s = spec(algo)
        options: dict[str, Any] = {}
        if model is not None:
            options["model"] = load_model(algo, model) if isinstance(model, (str, Path)) else model
        if seed is not None:
            options["seed"] = seed
        if batch_size is not None and "batch_size" in s.options:
            options["batch_size"] = int(batch_size)
        self.options = options
        self.last_task: Task | None = None
        self.last_plan: Plan | None = None

    def plan(self, module, sharders) -> Any:
        from torchrec.distributed.types import ShardingPlan

        from dreamshard.interop.torchrec import table_generators
        from dreamshard.sharders import make_sharder

        task, modules = self.task(module)
        plan = make_sharder(self.algo, **self.options).shard(task)
        validate_plan(task, plan)
        self.last_task, self.last_plan = task, plan
        generators = table_generators(task, plan)  # every table's TorchRec sharding, once for all modules
        return ShardingPlan({m.fqn: self._module_plan(task, plan, generators, m, sharders) for m in modules})

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

    def task(self, module) -> tuple[Task, list[ModuleTables]]:
        """The DreamShard task of every EBC table in `module`, and where each table lives."""
        from torchrec import EmbeddingBagCollection
        from torchrec.modules.embedding_configs import DataType

        found = [(fqn, m) for fqn, m in module.named_modules() if isinstance(m, EmbeddingBagCollection)]
        if not found:
            raise DreamShardError("DreamShardPlanner: the module holds no EmbeddingBagCollection to plan")
        all_names = [c.name for _, m in found for c in m.embedding_bag_configs()]
        clash = {n for n in all_names if all_names.count(n) > 1}
        tables, modules, precisions = [], [], set()
        for fqn, m in found:
            names = []
            for c in m.embedding_bag_configs():
                key = f"{fqn}/{c.name}" if c.name in clash else c.name
                if c.data_type not in (DataType.FP32, DataType.FP16):
                    raise DreamShardError(f"DreamShardPlanner: table {c.name!r} ({fqn or 'module'}): data type "
                                          f"{c.data_type} is not planned; fp32 or fp16 weights are")
                precisions.add("fp16" if c.data_type == DataType.FP16 else "fp32")
                tables.append(Table(key, int(c.num_embeddings), int(c.embedding_dim), self._pooling(c)))
                names.append((key, c.name))
            modules.append(ModuleTables(fqn, m, tuple(names)))
        if len(precisions) > 1:
            raise DreamShardError("DreamShardPlanner: tables mix fp32 and fp16 weights; plan them separately")
        task = Task("torchrec-module", tuple(tables), self._devices(), MemoryModel(precisions.pop(), self.optimizer),
                    sharding=self.sharding)
        if self.placement:
            try:
                task = self.placement.apply(task)
            except ValueError as exc:
                raise DreamShardError(f"DreamShardPlanner: placement constraints: {exc}") from None
        return task, modules

    def _pooling(self, config) -> float:
        c = self.constraints.get(config.name)
        if c is not None and c.compute_kernels is not None and "fused" not in c.compute_kernels:
            raise DreamShardError(f"DreamShardPlanner: table {config.name!r}: constraint compute_kernels "
                                  f"{c.compute_kernels} exclude 'fused', the kernel DreamShard plans for")
        if c is None or not c.pooling_factors:
            return self.default_pooling_factor
        return float(sum(c.pooling_factors))

    def _devices(self) -> tuple[Device, ...]:
        kind = self.topology.compute_device
        devices = []
        for d in self.topology.devices:
            cap = d.storage.hbm if kind in ("cuda", "mtia") else d.storage.ddr
            if cap <= 0:
                raise DreamShardError(f"DreamShardPlanner: rank {d.rank} has no {kind} memory in the topology")
            devices.append(Device(int(cap)))
        if self.devices is not None:  # kinds, speeds and hosts per rank; the memory stays the topology's
            if len(self.devices) != len(devices):
                raise DreamShardError(f"DreamShardPlanner: {len(self.devices)} devices given for a topology of "
                                      f"{len(devices)} ranks")
            devices = [Device(d.memory_bytes, given.kind, given.speed, given.host)
                       for d, given in zip(devices, self.devices)]
        return tuple(devices)

    # -------------------------------------------------------------- writing the plan

    def _module_plan(self, task: Task, plan: Plan, generators: dict[str, Any], m: ModuleTables, sharders) -> Any:
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.sharding_plan import construct_module_sharding_plan

        from dreamshard.interop.torchrec import check_module_plan

        sharder = next((s for s in sharders if isinstance(s, EmbeddingBagCollectionSharder)),
                       EmbeddingBagCollectionSharder())
        per_table = {name: generators[key] for key, name in m.names}
        module_plan = construct_module_sharding_plan(
            m.module, per_table, sharder=sharder, local_size=self.topology.local_world_size,
            world_size=self.topology.world_size, device_type=self.topology.compute_device)
        check_module_plan(task, plan, module_plan, dict(m.names))  # TorchRec builds some shardings itself
        for _, name in m.names:
            c = self.constraints.get(name)
            kind = module_plan[name].sharding_type
            if c is not None and c.sharding_types is not None and kind not in c.sharding_types:
                raise DreamShardError(f"DreamShardPlanner: table {name!r}: planned {kind!r}, but its constraint "
                                      f"allows only {c.sharding_types}; restrict `sharding` instead")
        return module_plan

