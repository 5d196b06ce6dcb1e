"""Plans: which device holds each table (or column slice of a table), validation, JSON I/O."""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dreamshard.errors import DataFormatError, InvalidPlanError
from dreamshard.io import write_text
from dreamshard.tasks import Task


@dataclass(frozen=True)
class Shard:
    """Columns [col_start, col_end) of `table` live on `device`."""

    table: str
    device: int
    col_start: int
    col_end: int


@dataclass(frozen=True)
class Plan:
    num_devices: int
    shards: tuple[Shard, ...]

    @classmethod
    def from_assignment(cls, task: Task, devices: Sequence[int]) -> Plan:
        """Whole tables: task.tables[i] on devices[i]."""
        if len(devices) != len(task.tables):
            raise ValueError(f"assignment has {len(devices)} entries for {len(task.tables)} tables")
        return cls(task.num_devices,
                   tuple(Shard(t.name, int(d), 0, t.dim) for t, d in zip(task.tables, devices)))

    def device_shards(self, device: int) -> list[Shard]:
        return [s for s in self.shards if s.device == device]

    def to_dict(self, **extra: Any) -> dict:
        return {"num_devices": self.num_devices, "shards": [asdict(s) for s in self.shards], **extra}

    def save_json(self, path: str | Path, **extra: Any) -> None:
        write_text(json.dumps(self.to_dict(**extra), indent=2) + "\n", path)

    @classmethod
    def load_json(cls, path: str | Path) -> Plan:
        return cls.from_dict(read_plan_json(path), str(path))

    @classmethod
    def from_dict(cls, obj: Any, origin: str = "plan") -> Plan:
        if not isinstance(obj, dict):
            raise DataFormatError(f"{origin}: expected a JSON object with num_devices and shards")
        n = obj.get("num_devices")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise DataFormatError(f"{origin}: num_devices: expected a positive integer, got {n!r}")
        raw = obj.get("shards")
        if not isinstance(raw, list):
            raise DataFormatError(f"{origin}: shards: expected a list, got {type(raw).__name__}")
        shards = []
        for i, s in enumerate(raw):
            if not isinstance(s, dict):
                raise DataFormatError(f"{origin}: shards[{i}]: expected an object")
            for key, typ in (("table", str), ("device", int), ("col_start", int), ("col_end", int)):
                if not isinstance(s.get(key), typ) or isinstance(s.get(key), bool):
                    raise DataFormatError(f"{origin}: shards[{i}].{key}: expected {typ.__name__}, got {s.get(key)!r}")
            shards.append(Shard(s["table"], s["device"], s["col_start"], s["col_end"]))
        return cls(n, tuple(shards))


def read_plan_json(path: str | Path) -> Any:
    """The parsed plan file (shards and any metadata beside them), with clear errors."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DataFormatError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{path}: not valid JSON: {exc}") from None


def device_memory_bytes(task: Task, plan: Plan) -> list[int]:
    rows = {t.name: t.rows for t in task.tables}
    used = [0] * plan.num_devices
    for s in plan.shards:
        used[s.device] += task.memory.shard_bytes(rows[s.table], s.col_end - s.col_start)
    return used


def validate_plan(task: Task, plan: Plan) -> None:
    """Raise InvalidPlanError unless every table's columns are placed exactly once within memory."""
    if plan.num_devices != task.num_devices:
        raise InvalidPlanError(f"plan is for {plan.num_devices} devices, task {task.name!r} has {task.num_devices}")
    dims = {t.name: t.dim for t in task.tables}
    slices: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for s in plan.shards:
        if s.table not in dims:
            raise InvalidPlanError(f"shard of unknown table {s.table!r}")
        if not 0 <= s.device < plan.num_devices:
            raise InvalidPlanError(f"table {s.table!r} on device {s.device}, expected 0..{plan.num_devices - 1}")
        width = s.col_end - s.col_start
        if s.col_start < 0 or s.col_end > dims[s.table]:
            raise InvalidPlanError(
                f"table {s.table!r}: columns [{s.col_start}, {s.col_end}) outside its dim {dims[s.table]}"
            )
        if width <= 0 or width % 4 or s.col_start % 4:
            raise InvalidPlanError(
                f"table {s.table!r}: columns [{s.col_start}, {s.col_end}) must be a non-empty range on multiples of 4"
            )
        slices[s.table].append((s.col_start, s.col_end))
    for name, dim in dims.items():
        covered = 0
        for start, end in sorted(slices.get(name, [])):
            if start != covered:
                what = "placed more than once" if start < covered else "not placed"
                raise InvalidPlanError(f"table {name!r}: columns from {min(start, covered)} {what}")
            covered = end
        if covered != dim:
            what = "not placed" if covered < dim else "beyond its dim"
            raise InvalidPlanError(f"table {name!r}: columns {min(covered, dim)}..{max(covered, dim)} {what} (dim {dim})")
    for d, (used, dev) in enumerate(zip(device_memory_bytes(task, plan), task.devices)):
        if used > dev.memory_bytes:
            raise InvalidPlanError(f"device {d}: {used} bytes placed, capacity {dev.memory_bytes}")
