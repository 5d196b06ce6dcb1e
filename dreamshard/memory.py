"""Memory model: how many bytes a table (or a column slice of it) takes on a device.

bytes = rows x width x bytes per weight  +  optimizer state, where the state is
  exact_sgd:              nothing
  exact_row_wise_adagrad: one fp32 per row (per shard: each column slice keeps its own)
  exact_adagrad:          one fp32 per weight
  adam:                   two fp32 per weight (first and second moments)
Activations, indices and workspace are not counted: they do not grow with rows.
"""
from __future__ import annotations

from dataclasses import dataclass

BYTES_PER_WEIGHT = {"fp32": 4, "fp16": 2}
# (bytes per row, bytes per weight) of optimizer state
OPTIMIZER_STATE_BYTES = {
    "exact_sgd": (0, 0),
    "exact_row_wise_adagrad": (4, 0),
    "exact_adagrad": (0, 4),
    "adam": (0, 8),
}

GB = 1024**3


@dataclass(frozen=True)
class MemoryModel:
    weights_precision: str = "fp32"
    optimizer: str = "exact_sgd"

    def __post_init__(self) -> None:
        if self.weights_precision not in BYTES_PER_WEIGHT:
            raise ValueError(
                f"weights_precision: expected one of {sorted(BYTES_PER_WEIGHT)}, got {self.weights_precision!r}"
            )
        if self.optimizer not in OPTIMIZER_STATE_BYTES:
            raise ValueError(
                f"optimizer: expected one of {sorted(OPTIMIZER_STATE_BYTES)}, got {self.optimizer!r}"
            )

    def shard_bytes(self, rows: int, width: int) -> int:
        per_row, per_weight = OPTIMIZER_STATE_BYTES[self.optimizer]
        return rows * width * (BYTES_PER_WEIGHT[self.weights_precision] + per_weight) + rows * per_row
