"""What a plan costs, for the benchmarks, experiments and tools that measure: the cost backends (FBGEMM's
kernels, the analytic model) and their measuring loop, the allocator setting, UVM caching's hit rate
(dreamshard.hardware, dreamshard.caching). The params' backend: dreamshard.project.backend."""
from __future__ import annotations

from dreamshard.caching import hit_rate
from dreamshard.hardware.allocator import huge_pages_enabled
from dreamshard.hardware.analytic import AnalyticBackend, AnalyticConfig
from dreamshard.hardware.base import CostBackend, measure_rounds, median_cost, turns
from dreamshard.hardware.fbgemm import (
    FbgemmBackend,
    FbgemmConfig,
    cpu_model_name,
    fbgemm_version,
    pin_threads,
    sharding_kind,
)

__all__ = [
    "AnalyticBackend", "AnalyticConfig", "CostBackend", "FbgemmBackend", "FbgemmConfig", "cpu_model_name",
    "fbgemm_version", "hit_rate", "huge_pages_enabled", "measure_rounds", "median_cost", "pin_threads",
    "sharding_kind", "turns",
]
