"""Clusters as they are: devices files (memory, kind, speed, host per device) and placement constraints.

Readers for devices files and for constraints given as tables-file columns or a JSON file (merged; a table
constrained twice in different ways is an error), and what a plan file records of its task so that it can
be rebuilt. Formats and how each part honours them: docs/clusters.md.
"""
from __future__ import annotations

import functools
import json
import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from dreamshard.errors import DataFormatError
from dreamshard.io import check_names, read_csv_cells
from dreamshard.memory import GB
from dreamshard.tables import CONSTRAINT_COLUMNS, missing_number, read_tables_frame
from dreamshard.tasks import MAX_MEMORY_GB, Device, Task

DEVICE_FIELDS = ("memory_gb", "kind", "speed", "host")
CONSTRAINT_KEYS = CONSTRAINT_COLUMNS  # a constraints file's keys are the tables file's constraint columns


# ---------------------------------------------------------------- devices


def read_devices_file(path: str | Path) -> tuple[Device, ...]:
    """The devices of a devices file (module docstring), with errors naming the file, device and field."""
    path = Path(path)
    if not path.exists():
        raise DataFormatError(f"{path}: no such file")
    if path.suffix == ".json":
        try:
            obj = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataFormatError(f"{path}: not valid JSON: {exc}") from None
        if isinstance(obj, dict):
            check_names(list(obj), ["devices"], str(path), "key")
            obj = obj.get("devices")
        if not isinstance(obj, list):
            raise DataFormatError(f"{path}: expected a list of devices, or an object with a 'devices' list")
        records = obj
    elif path.suffix == ".csv":  # cells as written: a kind or host `NA` or `007` stays that name
        header, cells = read_csv_cells(path, "devices file")
        check_names(header, DEVICE_FIELDS, str(path))
        records = [dict(zip(header, row)) for _, row in cells]
    else:
        raise DataFormatError(f"{path}: expected a .csv or .json devices file")
    if not records:
        raise DataFormatError(f"{path}: no devices")
    devices = [_device(rec, f"{path}: device {i}") for i, rec in enumerate(records)]
    hosts = [d.host for d in devices]
    if any(hosts) and not all(hosts):
        missing = next(i for i, h in enumerate(hosts) if not h)
        raise DataFormatError(f"{path}: device {missing}: field 'host' is empty; name the host of every device or none")
    return tuple(devices)


def _device(rec: Any, where: str) -> Device:
    if not isinstance(rec, dict):
        raise DataFormatError(f"{where}: expected an object with {', '.join(DEVICE_FIELDS)}")
    check_names(list(rec), DEVICE_FIELDS, where, "field")
    for name in ("kind", "host"):
        if not _blank(rec.get(name)) and not isinstance(rec[name], str):
            raise DataFormatError(f"{where}: field {name!r}: expected a string (a name), got {rec[name]!r}")
    memory = _number(rec.get("memory_gb"), f"{where}: field 'memory_gb'")
    if not 0 < memory <= MAX_MEMORY_GB:
        raise DataFormatError(f"{where}: field 'memory_gb': expected a number in (0, {MAX_MEMORY_GB:g}], got {memory}")
    speed = 1.0 if _blank(rec.get("speed")) else _number(rec.get("speed"), f"{where}: field 'speed'")
    if not speed > 0:
        raise DataFormatError(f"{where}: field 'speed': expected a positive number (relative throughput), got {speed}")
    kind = "" if _blank(rec.get("kind")) else str(rec["kind"]).strip()
    host = "" if _blank(rec.get("host")) else str(rec["host"]).strip()
    return Device(int(memory * GB), kind, float(speed), host)


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str)
                                                                              and not value.strip())


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or _blank(value):
        raise DataFormatError(f"{where}: expected a number, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise DataFormatError(f"{where}: expected a number, got {value!r}") from None
    if not math.isfinite(f):
        raise DataFormatError(f"{where}: expected a finite number, got {value!r}")
    return f


def uniform_devices(num_devices: int, memory_gb: float) -> tuple[Device, ...]:
    return tuple(Device(int(memory_gb * GB)) for _ in range(num_devices))


def memory_gb(memory_bytes: int) -> float:
    """The shortest number of GB that reads back (int(gb x GB)) to exactly these bytes: 0.01, not 0.0099999997."""
    for digits in range(1, 18):
        gb = float(f"{memory_bytes / GB:.{digits}g}")
        if int(gb * GB) == memory_bytes:
            return gb
    return memory_bytes / GB


def devices_to_json(devices: Sequence[Device]) -> list[dict[str, Any]]:
    """The devices as a devices file's JSON list (plans record the devices they were made for)."""
    out = []
    for d in devices:
        rec: dict[str, Any] = {"memory_gb": memory_gb(d.memory_bytes)}
        if d.kind:
            rec["kind"] = d.kind
        if d.speed != 1.0:
            rec["speed"] = d.speed
        if d.host:
            rec["host"] = d.host
        out.append(rec)
    return out


def devices_from_json(obj: Any, origin: str) -> tuple[Device, ...]:
    if not isinstance(obj, list) or not obj:
        raise DataFormatError(f"{origin}: devices: expected a non-empty list")
    return tuple(_device(rec, f"{origin}: devices[{i}]") for i, rec in enumerate(obj))


# ---------------------------------------------------------------- constraints


@dataclass(frozen=True)
class Constraints:
    pin: dict[str, int] = field(default_factory=dict)
    avoid: dict[str, tuple[int, ...]] = field(default_factory=dict)
    groups: tuple[tuple[str, ...], ...] = ()
    whole: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.pin or self.avoid or self.groups or self.whole)

    def merged(self, other: Constraints, origin: str) -> Constraints:
        """Both sets together; a table pinned or avoiding differently in the two, or in two groups, is an error."""
        for key in ("pin", "avoid"):
            mine, theirs = getattr(self, key), getattr(other, key)
            for t in sorted(set(mine) & set(theirs)):
                if mine[t] != theirs[t]:
                    raise DataFormatError(f"{origin}: table {t!r}: {key} {_show(theirs[t])} conflicts with "
                                          f"{key} {_show(mine[t])} given in the tables file")
        grouped = {t for g in self.groups for t in g}
        groups = list(self.groups)
        for g in other.groups:
            if set(g) in [set(x) for x in groups]:
                continue
            twice = sorted(grouped & set(g))
            if twice:
                raise DataFormatError(f"{origin}: table {twice[0]!r} is in group {list(g)} and in another group "
                                      "given in the tables file; a table is in one group at most")
            groups.append(g)
        return Constraints({**self.pin, **other.pin}, {**self.avoid, **other.avoid}, tuple(groups),
                           tuple(dict.fromkeys(self.whole + other.whole)))

    def apply(self, task: Task) -> Task:
        """The task with these constraints (checked against its tables and devices: ValueError names a bad one)."""
        return replace(task, pins=tuple(self.pin.items()), avoid=tuple(self.avoid.items()), groups=self.groups,
                       whole=self.whole)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.groups:
            out["group"] = [list(g) for g in self.groups]
        if self.pin:
            out["pin"] = dict(self.pin)
        if self.avoid:
            out["avoid"] = {t: list(d) for t, d in self.avoid.items()}
        if self.whole:
            out["whole"] = list(self.whole)
        return out


def constraints_of(task: Task) -> Constraints:
    return Constraints(dict(task.pins), dict(task.avoid), task.groups, task.whole)


def _show(value: Any) -> str:
    return str(list(value)) if isinstance(value, tuple) else str(value)


def constraints_from_json(obj: Any, origin: str) -> Constraints:
    """A constraints file's object (module docstring)."""
    if not isinstance(obj, dict):
        raise DataFormatError(f"{origin}: expected a JSON object with keys among {', '.join(CONSTRAINT_KEYS)}")
    check_names(list(obj), CONSTRAINT_KEYS, origin, "key")
    groups_raw = obj.get("group", [])
    if not isinstance(groups_raw, list) or not all(isinstance(g, list) and all(isinstance(t, str) for t in g)
                                                   for g in groups_raw):
        raise DataFormatError(f"{origin}: group: expected a list of lists of table names, got {groups_raw!r}")
    pin_raw = obj.get("pin", {})
    if not isinstance(pin_raw, dict):
        raise DataFormatError(f"{origin}: pin: expected an object table -> device, got {pin_raw!r}")
    pin = {}
    for t, d in pin_raw.items():
        if isinstance(d, bool) or not isinstance(d, int):
            raise DataFormatError(f"{origin}: pin.{t}: expected a device index (integer), got {d!r}")
        pin[t] = d
    avoid_raw = obj.get("avoid", {})
    if not isinstance(avoid_raw, dict):
        raise DataFormatError(f"{origin}: avoid: expected an object table -> list of devices, got {avoid_raw!r}")
    avoid = {}
    for t, ds in avoid_raw.items():
        if not isinstance(ds, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in ds):
            raise DataFormatError(f"{origin}: avoid.{t}: expected a list of device indices, got {ds!r}")
        avoid[t] = tuple(sorted(set(ds)))
    whole = obj.get("whole", [])
    if not isinstance(whole, list) or not all(isinstance(t, str) for t in whole):
        raise DataFormatError(f"{origin}: whole: expected a list of table names, got {whole!r}")
    nfc = functools.partial(unicodedata.normalize, "NFC")  # table names as the tables file's are read
    return Constraints({nfc(t): d for t, d in pin.items()}, {nfc(t): d for t, d in avoid.items()},
                       tuple(tuple(map(nfc, g)) for g in groups_raw), tuple(map(nfc, whole)))


def read_constraints_file(path: str | Path) -> Constraints:
    path = Path(path)
    if not path.exists():
        raise DataFormatError(f"{path}: no such file")
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{path}: not valid JSON: {exc}") from None
    return constraints_from_json(obj, str(path))


def constraints_from_frame(df: pd.DataFrame, origin: str, places: list[str] | None = None) -> Constraints:
    """Constraint columns of a tables file (module docstring; cells as read_tables_frame reads them: a group label
    is a name, `NA` or `007` included); none of them: no constraints."""
    pin: dict[str, int] = {}
    avoid: dict[str, tuple[int, ...]] = {}
    labels: dict[str, list[str]] = {}
    whole: list[str] = []
    places = places or [f"row {i}" for i in range(1, len(df) + 1)]
    for place, rec in zip(places, df.to_dict("records")):
        name = str(rec["name"])
        where = f"{origin}: table {name!r} ({place})"
        if "group" in rec and not _blank(rec["group"]):  # empty (or a Parquet null): in no group
            labels.setdefault(str(rec["group"]).strip(), []).append(name)
        if "pin" in rec and not missing_number(rec["pin"]):
            value = _number(rec["pin"], f"{where}: column 'pin'")
            if not value.is_integer():
                raise DataFormatError(f"{where}: column 'pin': expected a device index, got {rec['pin']!r}")
            pin[name] = int(value)
        if "avoid" in rec and not missing_number(rec["avoid"]):
            avoid[name] = _device_list(rec["avoid"], f"{where}: column 'avoid'")
        if "whole" in rec and not missing_number(rec["whole"]):
            flag = str(rec["whole"]).strip().lower()
            if flag not in ("true", "false", "1", "0", "1.0", "0.0", "yes", "no"):
                raise DataFormatError(f"{where}: column 'whole': expected true or false, got {rec['whole']!r}")
            if flag in ("true", "1", "1.0", "yes"):
                whole.append(name)
    groups = []
    for label, members in labels.items():
        if len(members) < 2:
            raise DataFormatError(f"{origin}: column 'group': group {label!r} has only table {members[0]!r}; a group "
                                  "needs at least two tables")
        groups.append(tuple(members))
    return Constraints(pin, avoid, tuple(groups), tuple(whole))


def _device_list(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        parts = [str(value)]
    else:
        parts = [p for p in str(value).replace(",", ";").replace(" ", ";").split(";") if p]
    out = []
    for p in parts:
        try:
            f = float(p)
        except ValueError:
            raise DataFormatError(f"{where}: expected device indices separated by ';', got {value!r}") from None
        if not f.is_integer():
            raise DataFormatError(f"{where}: expected device indices separated by ';', got {value!r}")
        out.append(int(f))
    return tuple(sorted(set(out)))


def read_table_constraints(path: str | Path) -> Constraints:
    """The constraint columns of a tables file (CSV or Parquet); it has been read by read_tables_file."""
    df, places = read_tables_frame(path)
    if not set(CONSTRAINT_KEYS) & set(df.columns):
        return Constraints()
    return constraints_from_frame(df, str(path), places)


# ---------------------------------------------------------------- plans record their cluster


def plan_metadata(task: Task) -> dict[str, Any]:
    """What a plan file records of its task besides the tables: devices, memory model, sharding kinds, compute
    kernels (when UVM caching is allowed) and constraints (measure, report and re-planning rebuild the task from
    it)."""
    memories = {d.memory_bytes for d in task.devices}
    meta: dict[str, Any] = {"devices": devices_to_json(task.devices),
                            "weights_precision": task.memory.weights_precision, "optimizer": task.memory.optimizer,
                            "batch_size": task.memory.batch_size, "reservation": task.memory.reservation,
                            "sharding": list(task.sharding)}
    if task.kernels != ("fused",):
        meta["kernels"] = list(task.kernels)
    if len(memories) == 1:
        meta["memory_gb"] = memory_gb(memories.pop())
    constraints = constraints_of(task).to_json()
    if constraints:
        meta["constraints"] = constraints
    return meta


def task_from_plan(name: str, tables: Sequence[Any], meta: dict[str, Any], num_devices: int, origin: str,
                   memory_gb: float | None = None, devices: Sequence[Device] | None = None) -> Task:
    """The task a plan file was made for: its tables, and the devices, memory model, sharding kinds and
    constraints the plan records; `devices` (a devices file) or `memory_gb` (uniform) replace its devices."""
    from dreamshard.memory import MemoryModel

    if devices is None and memory_gb is not None:
        devices = uniform_devices(num_devices, memory_gb)
    if devices is None and "devices" in meta:
        devices = devices_from_json(meta["devices"], origin)
    if devices is None:
        recorded = meta.get("memory_gb")
        if isinstance(recorded, bool) or not isinstance(recorded, (int, float)) or not recorded > 0:
            raise DataFormatError(f"{origin}: no devices or memory_gb recorded in the plan; give --memory-gb or "
                                  "--devices-file")
        devices = uniform_devices(num_devices, float(recorded))
    if len(devices) != num_devices:
        raise DataFormatError(f"{origin}: the plan is for {num_devices} devices, but {len(devices)} are given")
    sharding = meta.get("sharding", ["table", "column", "row"])
    if not isinstance(sharding, list) or not all(isinstance(k, str) for k in sharding):
        raise DataFormatError(f"{origin}: sharding: expected a list of sharding kinds, got {sharding!r}")
    try:
        memory = MemoryModel(meta.get("weights_precision", "fp32"), meta.get("optimizer", "exact_sgd"),
                             meta.get("batch_size", 0), meta.get("reservation", 0.0))
    except ValueError as exc:
        raise DataFormatError(f"{origin}: {exc}") from None
    kernels = meta.get("kernels", ["fused"])
    if not isinstance(kernels, list) or not all(isinstance(k, str) for k in kernels):
        raise DataFormatError(f"{origin}: kernels: expected a list of compute kernels, got {kernels!r}")
    try:
        task = Task(name, tuple(tables), tuple(devices), memory, sharding=tuple(sharding), kernels=tuple(kernels))
    except ValueError as exc:
        raise DataFormatError(f"{origin}: {exc}") from None
    constraints = constraints_from_json(meta.get("constraints", {}), f"{origin}: constraints")
    try:
        return constraints.apply(task)
    except ValueError as exc:
        raise DataFormatError(f"{origin}: constraints: {exc}") from None
