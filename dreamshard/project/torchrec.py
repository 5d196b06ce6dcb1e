"""TorchRec, for the benchmarks that plan TorchRec models: the drop-in planner (dreamshard.planner) and what
the ShardingPlan export knows of a plan, TorchRec's perf estimate among it (dreamshard.interop.torchrec).
Importing this module imports TorchRec."""
from __future__ import annotations

from dreamshard.interop.torchrec import plan_caches, quiet_torchrec, table_layout, torchrec_perf_estimate
from dreamshard.planner import DreamShardPlanner

__all__ = ["DreamShardPlanner", "plan_caches", "quiet_torchrec", "table_layout", "torchrec_perf_estimate"]
