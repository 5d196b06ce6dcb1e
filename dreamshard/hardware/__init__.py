"""Cost backends: real FBGEMM kernels (`fbgemm`) or a deterministic model (`analytic`)."""
from __future__ import annotations

from typing import Any

from dreamshard.data.lookups import LookupSource
from dreamshard.hardware.base import ComputeCost, CostBackend, DeviceCost, PlanCost
from dreamshard.hardware.comm import Topology

BACKENDS = ("fbgemm", "analytic")


def make_backend(name: str, lookups: LookupSource, topology: Topology | None = None, **options: Any) -> CostBackend:
    """Build a backend by name; `options` are its config fields (batch_size, iterations, ...)."""
    topology = topology or Topology()
    if name == "fbgemm":
        from dreamshard.hardware.fbgemm import FbgemmBackend, FbgemmConfig  # imports the kernels: slow

        return FbgemmBackend(lookups, FbgemmConfig(topology=topology, **options))
    if name == "analytic":
        from dreamshard.hardware.analytic import AnalyticBackend, AnalyticConfig

        return AnalyticBackend(AnalyticConfig(topology=topology, **options))
    raise ValueError(f"unknown cost backend {name!r}; expected one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "ComputeCost", "CostBackend", "DeviceCost", "PlanCost", "Topology", "make_backend"]
