"""The cluster's links the all-to-all model prices (dreamshard.hardware.comm): devices per host, bandwidths and
latency. Its own module, below hardware.base and comm: a backend has a topology, and comm prices a backend's
costs."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    devices_per_host: int = 8
    intra_host_gbps: float = 150.0  # GB/s per device, e.g. NVLink
    inter_host_gbps: float = 12.5  # GB/s per device, e.g. 100 Gb/s network
    latency_us: float = 10.0  # per collective
    output_bytes: int = 4  # bytes per pooled-output element (fp32)
    index_bytes: int = 8  # bytes per id the input dist sends (int64)
    length_bytes: int = 4  # bytes per length (one per feature and sample; int32)

    def __post_init__(self) -> None:
        if self.devices_per_host < 1 or self.intra_host_gbps <= 0 or self.inter_host_gbps <= 0:
            raise ValueError("topology: devices_per_host >= 1 and positive bandwidths required")
        if self.latency_us < 0 or min(self.output_bytes, self.index_bytes, self.length_bytes) < 1:
            raise ValueError("topology: latency_us >= 0 and output_bytes, index_bytes, length_bytes >= 1 required")
