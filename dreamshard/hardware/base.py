"""The one interface every cost backend implements, and the numbers it returns.

A plan's cost is its slowest device: max over devices of
fwd + bwd (the fused operator's compute) + fwd_comm + bwd_comm (the all-to-all), in ms.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from dreamshard.plan import Plan, Shard
from dreamshard.tasks import Task


@dataclass(frozen=True)
class ComputeCost:
    """One device's fused operator on its own: forward, and backward with the optimizer update."""

    fwd_ms: float
    bwd_ms: float

    @property
    def total_ms(self) -> float:
        return self.fwd_ms + self.bwd_ms


@dataclass(frozen=True)
class DeviceCost:
    fwd_ms: float
    bwd_ms: float
    fwd_comm_ms: float
    bwd_comm_ms: float

    @property
    def total_ms(self) -> float:
        return self.fwd_ms + self.bwd_ms + self.fwd_comm_ms + self.bwd_comm_ms


@dataclass(frozen=True)
class PlanCost:
    devices: tuple[DeviceCost, ...]
    backend: str  # "fbgemm" | "analytic"
    device_name: str  # the physical device the compute ran on (or "model" for analytic)
    measured: bool  # True only when real kernels ran
    comm: str  # how communication was obtained: "model" | "nccl"

    @property
    def cost_ms(self) -> float:
        return max(d.total_ms for d in self.devices)


class CostBackend(Protocol):
    name: str
    measured: bool

    def device_name(self) -> str:
        """The physical device (CPU model or GPU name) costs come from."""

    def versions(self) -> dict[str, str]:
        """Software versions that produced the costs."""

    def compute_cost(self, task: Task, shards: Sequence[Shard]) -> ComputeCost:
        """Cost of one device holding `shards` of `task`'s tables, on its own."""

    def plan_cost(self, task: Task, plan: Plan) -> PlanCost:
        """Per-device compute and communication of a whole plan."""

    def plan_cost_from(self, task: Task, plan: Plan, compute: Sequence[ComputeCost]) -> PlanCost:
        """The plan's cost given each device's compute_cost (a reference device's): what plan_cost adds to them
        (device speeds, the all-to-all). Lets a caller measure a device shard set once for several plans."""

    def communication_cost(self, fwd_ms: Sequence[float] | np.ndarray,
                           dim_sums: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(fwd_comm_ms, bwd_comm_ms) per device, given each device's forward compute and dim sum."""


def turns(count: int, rounds: int) -> list[tuple[int, int]]:
    """(round, item) in the order that measures `count` items `rounds` times in turns: items 0, 1, 2, then 1, 2, 0,
    then 2, 0, 1, ...; a slow spell of the machine then hits every item alike, not one item's every round."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds: expected an integer >= 1, got {rounds!r}")
    order = []
    for r in range(rounds):
        shift = r % count if count else 0
        order += [(r, i) for i in [*range(shift, count), *range(shift)]]
    return order
