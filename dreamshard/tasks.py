"""Tasks (tables + devices + memory model) and their Parquet files; sampling them is dreamshard.data.sampling."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dreamshard.errors import DataFormatError
from dreamshard.memory import GB, MemoryModel
from dreamshard.tables import BIN_COLUMNS, Table

MAX_MEMORY_GB = 1e6  # keeps byte counts far inside int64

SHARDING_KINDS = ("table", "column", "row")  # whole tables, column slices, row ranges (TorchRec's layouts)


@dataclass(frozen=True)
class Device:
    memory_bytes: int


@dataclass(frozen=True)
class Task:
    name: str
    tables: tuple[Table, ...]
    devices: tuple[Device, ...]
    memory: MemoryModel = field(default_factory=MemoryModel)
    family: str = ""
    # the ways sharders may cut tables: "table" (whole tables) always; "column" slices; "row" ranges
    sharding: tuple[str, ...] = SHARDING_KINDS
    # (table name, device): tables that must be placed on that device (e.g. TorchRec's row-wise blocks)
    pins: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.tables:
            raise ValueError(f"task {self.name!r}: no tables")
        if not self.devices:
            raise ValueError(f"task {self.name!r}: no devices")
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"task {self.name!r}: table names must be unique")
        unknown = [k for k in self.sharding if k not in SHARDING_KINDS]
        if unknown or "table" not in self.sharding:
            raise ValueError(f"task {self.name!r}: sharding kinds must include 'table' and be among "
                             f"{', '.join(SHARDING_KINDS)}; got {', '.join(self.sharding) or 'none'}")
        for table, device in self.pins:
            if table not in names:
                raise ValueError(f"task {self.name!r}: pin of unknown table {table!r}")
            if not 0 <= device < len(self.devices):
                raise ValueError(f"task {self.name!r}: table {table!r} pinned to device {device}, "
                                 f"expected 0..{len(self.devices) - 1}")
        pinned = [t for t, _ in self.pins]
        if len(set(pinned)) != len(pinned):
            raise ValueError(f"task {self.name!r}: a table is pinned twice")

    def pinned_device(self) -> dict[str, int]:
        """table name -> the device it must be on."""
        return dict(self.pins)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def table_bytes(self, i: int) -> int:
        t = self.tables[i]
        return self.memory.shard_bytes(t.rows, t.dim)

    @classmethod
    def uniform(cls, name: str, tables: Sequence[Table], num_devices: int, memory_gb: float,
                memory: MemoryModel | None = None, family: str = "") -> Task:
        if num_devices < 1:
            raise ValueError(f"task {name!r}: need at least one device, got {num_devices}")
        if not 0 < memory_gb <= MAX_MEMORY_GB:
            raise ValueError(f"task {name!r}: device memory must be in (0, {MAX_MEMORY_GB:g}] GB, got {memory_gb}")
        devices = tuple(Device(int(memory_gb * GB)) for _ in range(num_devices))
        return cls(name, tuple(tables), devices, memory or MemoryModel(), family)


def stats_table(row, dim: int) -> Table:
    """A `Table` from a row of data/tables.parquet, at dimension `dim`."""
    return Table(
        name=str(row["name"]),
        rows=int(row["rows"]),
        dim=int(dim),
        pooling_factor=float(row["pooling_factor"]),
        bins=tuple(float(row[c]) for c in BIN_COLUMNS),
    )


# ---------------------------------------------------------------- task files

TASKS_SCHEMA = pa.schema(
    [
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("family", pa.string(), nullable=False),
        pa.field("num_devices", pa.int32(), nullable=False),
        pa.field("device_memory_bytes", pa.int64(), nullable=False),
        pa.field("weights_precision", pa.string(), nullable=False),
        pa.field("optimizer", pa.string(), nullable=False),
        pa.field("table_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("table_names", pa.list_(pa.string()), nullable=False),
        pa.field("dims", pa.list_(pa.int32()), nullable=False),
    ]
)


def tasks_to_arrow(tasks: Sequence[Task], split: str, name_to_id: dict[str, int]) -> pa.Table:
    rows = []
    for t in tasks:
        memories = {d.memory_bytes for d in t.devices}
        if len(memories) != 1:
            raise ValueError(f"task {t.name!r}: task files hold devices of one memory size")
        rows.append(
            {
                "task_id": t.name,
                "split": split,
                "family": t.family,
                "num_devices": t.num_devices,
                "device_memory_bytes": memories.pop(),
                "weights_precision": t.memory.weights_precision,
                "optimizer": t.memory.optimizer,
                "table_ids": [name_to_id[tb.name] for tb in t.tables],
                "table_names": [tb.name for tb in t.tables],
                "dims": [tb.dim for tb in t.tables],
            }
        )
    return pa.Table.from_pylist(rows, schema=TASKS_SCHEMA)


def read_tasks(tasks_path: str | Path, tables_path: str | Path) -> list[Task]:
    """Rebuild tasks from a tasks file and the tables statistics they refer to."""
    stats = pd.read_parquet(tables_path).set_index("table_id")
    df = pq.read_table(tasks_path).to_pandas()
    missing = [f.name for f in TASKS_SCHEMA if f.name not in df.columns]
    if missing:
        raise DataFormatError(f"{tasks_path}: missing column(s) {', '.join(missing)}")
    tasks = []
    for rec in df.to_dict("records"):
        unknown = [int(i) for i in rec["table_ids"] if int(i) not in stats.index]
        if unknown:
            raise DataFormatError(f"{tasks_path}: task {rec['task_id']}: table_ids {unknown[:5]} not in {tables_path}")
        tables = [stats_table(stats.loc[int(i)], int(d)) for i, d in zip(rec["table_ids"], rec["dims"])]
        devices = tuple(Device(int(rec["device_memory_bytes"])) for _ in range(int(rec["num_devices"])))
        tasks.append(Task(rec["task_id"], tuple(tables), devices,
                          MemoryModel(rec["weights_precision"], rec["optimizer"]), rec["family"]))
    return tasks
