"""TorchRec's planner as a baseline sharder (`torchrec`, `torchrec_full`).

TorchRec's `EmbeddingShardingPlanner` plans the task's EmbeddingBagCollection (built on the meta device) for
one rank per device, under DreamShard's memory model so that it plans by the same rule as every sharder;
constraints it cannot express are refused. TorchRec is imported only when a plan is made. Setup and
sharding types: docs/torchrec.md.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dreamshard.errors import DreamShardError, InfeasibleTaskError
from dreamshard.interop.torchrec import COLUMN_WISE, TABLE_WISE
from dreamshard.plan import Plan, Shard
from dreamshard.tasks import Task

# TorchRec's sharding types (with the fused kernel) for each of our sharding kinds (Task.sharding)
# (data-parallel: none, TorchRec's peer plans model-parallel tables here; host: table_row_wise across hosts)
TYPES_OF_KIND = {"table": (TABLE_WISE,), "column": (COLUMN_WISE, "table_column_wise"),
                 "row": ("row_wise", "table_row_wise"), "data": (), "host": ("table_row_wise",)}
GRID = "grid_shard"  # rows and columns: offered when both kinds are allowed
# TorchRec's kinds that cut a table into row blocks within one host. On a task spanning several hosts,
# table_row_wise is offered where the task allows "host" (our plans hold it and comm.host_exchange_ms prices it);
# grid_shard is not offered there: no plan of ours holds row blocks of column slices across hosts yet
HOST_WISE = ("table_row_wise", GRID)


@dataclass(frozen=True)
class TorchRecSharder:
    name: str = "torchrec"
    full_search: bool = False
    # the global batch (backend.batch_size), given to TorchRec per rank; None: the task's memory model's batch per
    # device (TorchRec's 512 by default)
    batch_size: int | None = None
    sharding_types: tuple[str, ...] | None = None  # full search only: restrict to these (None: all)
    # seconds: TorchRec's own timeout_seconds, after which its planner rates no more proposals and keeps the best
    # found (whole seconds, at least 1; None: every proposal)
    time_limit: float | None = None
    # the cluster our comm model prices (hardware.topology.Topology), told to TorchRec (None: one host of all devices,
    # TorchRec's default links); hbm_gbps: the devices' memory bandwidth (None: TorchRec's default)
    links: Any = None
    hbm_gbps: float | None = None
    # each table's narrowest column slice (Task.min_width) as TorchRec's min_partition (full search only)
    min_partition: bool = False
    # TorchRec's perf model with compute fitted to our measurements (interop.calibration.PerfCalibration)
    calibration: Any = None
    # TorchRec's own Topology (a user's, e.g. DreamShardPlanner's): its hosts and bandwidths instead of `links`
    torchrec_topology: Any = None

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"sharder {self.name!r}: batch_size must be >= 1, got {self.batch_size}")
        if self.time_limit is not None and not self.time_limit > 0:
            raise ValueError(f"sharder {self.name!r}: time_limit must be > 0 seconds, got {self.time_limit}")
        if self.sharding_types is not None and not self.full_search:
            raise ValueError(f"sharder {self.name!r}: sharding_types needs full_search=True")

    def shard(self, task: Task) -> Plan:
        return from_torchrec_plan(task, self.torchrec_plan(task))

    def rating_ms(self, task: Task, plan: Plan) -> float:
        """`plan` as the perf model this planner plans by rates it on this sharder's cluster (ms; a model's
        estimate): TorchRec's, with `calibration`'s compute where given."""
        from dreamshard.interop import torchrec as tx

        return tx.torchrec_perf_estimate(task, plan, tx.torchrec_batch(task, self.batch_size), self._topology(task),
                                         self.calibration).cost_ms

    def _topology(self, task: Task, to_plan: bool = False):
        """The task's TorchRec topology on this sharder's cluster: `torchrec_topology`'s hosts and links where given
        (a new object `to_plan` on, the one ratings keep otherwise), else `links` and `hbm_gbps`."""
        from dreamshard.interop import torchrec as tx

        if self.torchrec_topology is None:
            return tx.topology(task, self.links, self.hbm_gbps)
        return (tx.topology_like if to_plan else tx.topology_from)(task, self.torchrec_topology)

    def types_for(self, task: Task) -> list[str]:
        """TorchRec's sharding types this sharder offers TorchRec for the task: table-wise only, or every type
        the task's sharding kinds allow (Task.sharding), narrowed to `sharding_types` when given."""
        if not self.full_search:
            return [TABLE_WISE]
        allowed = list(dict.fromkeys(x for kind in task.sharding for x in TYPES_OF_KIND[kind]))
        if "column" in task.sharding and "row" in task.sharding:
            allowed.append(GRID)
        if self.sharding_types is not None:
            allowed = [x for x in allowed if x in self.sharding_types]
        # HOST_WISE's comment
        if (self.links is not None or self.torchrec_topology is not None) and self.spans_hosts(task):
            kept = ("table_row_wise",) if "host" in task.sharding else ()
            allowed = [x for x in allowed if x not in HOST_WISE or x in kept]
        if not allowed:
            raise DreamShardError(f"sharder {self.name!r}: none of sharding_types {list(self.sharding_types or [])} "
                                  f"is allowed by the task's sharding kinds {', '.join(task.sharding)}")
        return allowed

    def spans_hosts(self, task: Task) -> bool:
        from dreamshard.interop.torchrec import peer_local_size

        if self.torchrec_topology is not None:
            return self.torchrec_topology.local_world_size < task.num_devices
        return peer_local_size(task, self.links) < task.num_devices

    def torchrec_plan(self, task: Task):
        """TorchRec's ShardingPlan for the task's EBC (module path "" : the EBC itself)."""
        from dreamshard.interop import torchrec as tx

        tx.require_torchrec()
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner
        from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
        from torchrec.distributed.planner.types import PlannerError

        types = self.types_for(task)
        refused = [f"{kind} ({', '.join(names)})" for kind, names in (
            ("pin", [t for t, _ in task.pins]), ("avoid", [t for t, _ in task.avoid]),
            ("group", [str(list(g)) for g in task.groups])) if names]
        if refused:
            raise DreamShardError(f"sharder {self.name!r}: TorchRec's planner has no constraint that places a table "
                                  f"on or off a given rank, so it cannot honour {'; '.join(refused)}; plan with one "
                                  "of DreamShard's sharders, which honour them all")
        whole = set(task.whole)
        per_table = {t.name: [TABLE_WISE] if t.name in whole else types for t in task.tables}
        if whole and TABLE_WISE not in types:
            raise DreamShardError(f"sharder {self.name!r}: tables {sorted(whole)} must stay whole, but table_wise is "
                                  "not among the sharding types offered")
        with tx.quiet_torchrec(), tx.planner_copies():
            topo = self._topology(task, to_plan=True)
            constraints = tx.table_constraints(task, per_table, min_partition=self.min_partition)
            batch = tx.torchrec_batch(task, self.batch_size)
            planner = EmbeddingShardingPlanner(
                topology=topo,
                batch_size=batch,
                enumerator=tx.enumerator(task, topo, constraints, batch, calibration=self.calibration),
                storage_reservation=FixedPercentageStorageReservation(0.0),
                constraints=constraints,
                debug=False,
                stats=[],
                timeout_seconds=None if self.time_limit is None else max(1, math.ceil(self.time_limit)),
            )
            try:
                return planner.plan(tx.meta_ebc(task), [EmbeddingBagCollectionSharder()])
            except PlannerError as exc:
                raise InfeasibleTaskError(f"task {task.name!r}: TorchRec's planner found no plan: {_one_line(exc)}") from exc
            except RuntimeError as exc:  # e.g. no sharding type left for a table after the constraints
                raise DreamShardError(f"task {task.name!r}: TorchRec's planner failed: {_one_line(exc)}") from exc


def from_torchrec_plan(task: Task, sharding_plan, module_path: str = "") -> Plan:
    """Our Plan from TorchRec's ShardingPlan of the task's EBC at `module_path`."""
    from dreamshard.interop.torchrec import torchrec_table_shards

    module_plan = sharding_plan.get_plan_for_module(module_path)
    if module_plan is None:
        raise DreamShardError(f"task {task.name!r}: TorchRec's plan has no module {module_path!r} "
                              f"(modules: {sorted(sharding_plan.plan)})")
    missing = [t.name for t in task.tables if t.name not in module_plan]
    if missing:
        raise DreamShardError(f"task {task.name!r}: TorchRec's plan does not place table(s) {', '.join(missing)}")
    shards = []
    for t in task.tables:
        for rank, r0, r1, c0, c1 in torchrec_table_shards(t.name, module_plan[t.name], t.rows, t.dim):
            rows = (0, None) if (r0, r1) == (0, t.rows) else (r0, r1)
            shards.append(Shard(t.name, rank, c0, c1, *rows))
    return Plan(task.num_devices, tuple(shards))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())  # TorchRec's messages span many indented lines


def make(name: str, full_search: bool, batch_size: int | None = None,
         sharding_types: Sequence[str] | None = None, time_limit: float | None = None, links: Any = None,
         hbm_gbps: float | None = None, min_partition: bool = False, calibration: Any = None,
         torchrec_topology: Any = None) -> TorchRecSharder:
    return TorchRecSharder(name, full_search, None if batch_size is None else int(batch_size),
                           tuple(sharding_types) if sharding_types is not None else None, time_limit, links,
                           None if hbm_gbps is None else float(hbm_gbps), bool(min_partition), calibration,
                           torchrec_topology)
