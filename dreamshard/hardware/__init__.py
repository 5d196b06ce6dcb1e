"""Cost backends: real FBGEMM kernels (`fbgemm`) or a deterministic model (`analytic`).

The package imports nothing at load (its names resolve on first use): `allocator` must be importable before
torch is, to set the allocator's environment.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dreamshard.data.lookups import LookupSource
    from dreamshard.hardware.base import ComputeCost, CostBackend, DeviceCost, PlanCost
    from dreamshard.hardware.topology import Topology

BACKENDS = ("fbgemm", "analytic")
_EXPORTS = {"ComputeCost": "dreamshard.hardware.base", "CostBackend": "dreamshard.hardware.base",
            "DeviceCost": "dreamshard.hardware.base", "PlanCost": "dreamshard.hardware.base",
            "Topology": "dreamshard.hardware.topology"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dreamshard.hardware' has no attribute {name!r}")


def make_backend(name: str, lookups: LookupSource, topology: Topology | None = None, **options: Any) -> CostBackend:
    """Build a backend by name; `options` are its config fields (batch_size, iterations, ...)."""
    from dreamshard.hardware.topology import Topology

    topology = topology or Topology()
    if name == "fbgemm":
        from dreamshard.hardware.fbgemm import FbgemmBackend, FbgemmConfig  # imports the kernels: slow

        return FbgemmBackend(lookups, FbgemmConfig(topology=topology, **options))
    if name == "analytic":
        from dreamshard.hardware.analytic import AnalyticBackend, AnalyticConfig

        return AnalyticBackend(AnalyticConfig(topology=topology, **options))
    raise ValueError(f"unknown cost backend {name!r}; expected one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "ComputeCost", "CostBackend", "DeviceCost", "PlanCost", "Topology", "make_backend"]
