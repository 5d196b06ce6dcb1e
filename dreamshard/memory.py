"""Memory model: the bytes TorchRec allocates for a shard of a table on a device.

A shard of `rows` x `width` weights takes
  weights:    rows x width x bytes per weight (fp32 4, fp16 2)
  optimizer:  exact_sgd nothing; exact_row_wise_adagrad one fp32 per row (each column slice keeps its own);
              exact_adagrad one fp32 per weight; adam two fp32 per weight (first and second moments)
  buffers:    at `batch_size` samples per device, TorchRec's storage estimator's input and output buffers
              (`io_bytes`): 0 when batch_size is 0, as for the pipeline's synthetic tasks.
`reservation` is the share of each device's memory kept free for what is not an embedding
(TorchRec's planner reserves 15% by default): a device holds shards up to (1 - reservation) of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

BYTES_PER_WEIGHT = {"fp32": 4, "fp16": 2}
# (bytes per row, bytes per weight) of optimizer state
OPTIMIZER_STATE_BYTES = {
    "exact_sgd": (0, 0),
    "exact_row_wise_adagrad": (4, 0),
    "exact_adagrad": (0, 4),
    "adam": (0, 8),
}
INPUT_BYTES = 8  # TorchRec counts each looked-up index as int64 (FBGEMM's TBE converts int32 ids to int64)
DEFAULT_RESERVATION = 0.15  # TorchRec's planner default (HeuristicalStorageReservation's percentage)
DEFAULT_BATCH_SIZE = 512  # samples per device and step wherever none is given: TorchRec's planner's default (BATCH_SIZE)

GB = 1024**3


@dataclass(frozen=True)
class MemoryBreakdown:
    """One device's bytes by what they hold, and what is left of its usable memory."""

    weights: int
    optimizer: int
    buffers: int
    capacity: int  # usable: the device's memory less the reservation

    @property
    def used(self) -> int:
        return self.weights + self.optimizer + self.buffers

    @property
    def headroom(self) -> int:
        return self.capacity - self.used


@dataclass(frozen=True)
class MemoryModel:
    weights_precision: str = "fp32"
    optimizer: str = "exact_sgd"
    batch_size: int = 0  # samples per device whose input/output buffers are counted (0: none)
    reservation: float = 0.0  # share of each device's memory not available to shards

    def __post_init__(self) -> None:
        if self.weights_precision not in BYTES_PER_WEIGHT:
            raise ValueError(
                f"weights_precision: expected one of {sorted(BYTES_PER_WEIGHT)}, got {self.weights_precision!r}"
            )
        if self.optimizer not in OPTIMIZER_STATE_BYTES:
            raise ValueError(
                f"optimizer: expected one of {sorted(OPTIMIZER_STATE_BYTES)}, got {self.optimizer!r}"
            )
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 0:
            raise ValueError(f"batch_size: expected an integer >= 0, got {self.batch_size!r}")
        if not (isinstance(self.reservation, (int, float)) and 0 <= self.reservation < 1):
            raise ValueError(f"reservation: expected a share in [0, 1), got {self.reservation!r}")

    def bytes_per_weight(self, precision: str | None = None) -> int:
        """Bytes of one weight: `precision` (a table's own) or the model's weights_precision."""
        p = precision or self.weights_precision
        if p not in BYTES_PER_WEIGHT:
            raise ValueError(f"precision: expected one of {sorted(BYTES_PER_WEIGHT)}, got {p!r}")
        return BYTES_PER_WEIGHT[p]

    def weight_bytes(self, rows: int, width: int, precision: str | None = None) -> int:
        return rows * width * self.bytes_per_weight(precision)

    def optimizer_bytes(self, rows: int, width: int) -> int:
        per_row, per_weight = OPTIMIZER_STATE_BYTES[self.optimizer]
        return rows * width * per_weight + rows * per_row

    def shard_bytes(self, rows: int, width: int, precision: str | None = None) -> int:
        """Weights and optimizer state of a rows x width shard (what moves when the shard moves)."""
        return self.weight_bytes(rows, width, precision) + self.optimizer_bytes(rows, width)

    def io_bytes(self, pooling_factor: float, features: int, width: int, num_devices: int, row_block: bool,
                 precision: str | None = None, sequence: bool = False) -> int:
        """Input and output buffers of one shard at `batch_size` samples per device, as TorchRec's storage
        estimator counts them (pipeline type NONE): every shard receives the ids of all `num_devices` devices'
        samples (a row block: only its share, the batch's ids once) and returns `width` values in the weights'
        precision: pooled, one per sample and feature of every device (at most one per looked-up id); for a
        `sequence` table (an EmbeddingCollection's) one per id it received."""
        if self.batch_size == 0:
            return 0
        lookups = pooling_factor * self.batch_size
        received = lookups * (1 if row_block else num_devices)
        inputs = math.ceil(received * INPUT_BYTES)
        outputs = received if sequence else min(float(features), pooling_factor) * self.batch_size * num_devices
        return inputs + math.ceil(outputs * width * self.bytes_per_weight(precision))

    def usable_bytes(self, memory_bytes: int) -> int:
        """What a device of `memory_bytes` holds for shards, after the reservation."""
        return int(memory_bytes * (1.0 - self.reservation))
