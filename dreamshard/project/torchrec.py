"""TorchRec, for the benchmarks that plan TorchRec models: the drop-in planner (dreamshard.planner) and what
the ShardingPlan export knows of a plan, TorchRec's perf estimate among it, and the export itself with the
module it is for (dreamshard.interop.torchrec).
Importing this module imports TorchRec."""
from __future__ import annotations

from dreamshard.interop.torchrec import (
    meta_ebc,
    plan_caches,
    quiet_torchrec,
    stock_enumeration,
    table_layout,
    to_torchrec_plan,
    topology_from,
    torchrec_perf_estimate,
)
from dreamshard.planner import DreamShardPlanner

__all__ = ["DreamShardPlanner", "meta_ebc", "plan_caches", "quiet_torchrec", "stock_enumeration", "table_layout",
           "to_torchrec_plan", "topology_from", "torchrec_perf_estimate"]
