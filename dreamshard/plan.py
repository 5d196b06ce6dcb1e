"""Plans: which device holds each table, or each piece of a table, validation, JSON I/O.

A shard is the block rows [row_start, row_end) x columns [col_start, col_end) of a table
on one device. Whole tables, column slices (table-wise, column-wise sharding), row ranges
(row-wise) and row ranges of column slices are all shards; a valid plan covers every cell
of every table exactly once, within each device's memory. A data-parallel table is the one
exception: a `replica` shard of the whole table on every device, each looking up its device's
share of the batch (TorchRec's data_parallel). In plan JSON `row_start` and `row_end` are
written only for a row range, and `replica` only when true, so plans written before either
existed load unchanged.
"""
from __future__ import annotations

import json
import math
import unicodedata
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreamshard.errors import DataFormatError, InvalidPlanError
from dreamshard.io import write_text
from dreamshard.memory import MemoryBreakdown
from dreamshard.tables import Table
from dreamshard.tasks import Task


def row_blocks(rows: int, num_devices: int) -> list[tuple[int, int]]:
    """TorchRec's row-wise layout: block i = rows [i b, (i+1) b) with b = ceil(rows / N), empty blocks left out."""
    block = math.ceil(rows / num_devices)
    return [(start, min(start + block, rows)) for start in range(0, rows, block)]


def host_blocks(rows: int, per_host: int, host: int) -> list[tuple[int, tuple[int, int]]]:
    """TorchRec's table_row_wise layout on `host`: (device, rows) of row_blocks(rows, per_host), block i on the
    host's i-th device (hosts are consecutive blocks of `per_host` devices)."""
    return [(host * per_host + i, block) for i, block in enumerate(row_blocks(rows, per_host))]


def host_of_blocks(task: Task, table: Table, placed: Sequence[Shard]) -> int | None:
    """The host whose devices hold `placed` in TorchRec's table_row_wise layout (host_blocks), None when they do
    not, or when the task's devices do not name several hosts (Task.per_host)."""
    per_host = task.per_host()
    if per_host is None or not placed or any(s.replica or s.width != table.dim for s in placed):
        return None
    got = sorted((s.device, s.rows(table.rows)) for s in placed)
    host = got[0][0] // per_host
    return host if got == host_blocks(table.rows, per_host, host) else None


ShardKey = tuple[str, int, int, int, int, int, bool, float]  # Shard.key()


# TorchRec's lookup groups: on a device, one operator per sharding kind (data: the replicas' dense kernel)
LOOKUP_KINDS = ("table", "column", "row", "data")


def lookup_kind(num_rows: int, width: int, table_rows: int, table_dim: int, replica: bool = False) -> str:
    """The LOOKUP_KINDS group that runs `num_rows` x `width` of a `table_rows` x `table_dim` table: data (a
    replica), row (some of its rows, whatever its columns), column (all rows, some columns), table (all of it)."""
    if replica:
        return "data"
    if num_rows < table_rows:
        return "row"
    return "column" if width < table_dim else "table"


@dataclass(frozen=True)
class Shard:
    """Columns [col_start, col_end) of rows [row_start, row_end) of `table` live on `device`;
    row_end None: every row from row_start (0) on, i.e. all rows of the table."""

    table: str
    device: int
    col_start: int
    col_end: int
    row_start: int = 0
    row_end: int | None = None
    replica: bool = False  # a data-parallel copy of the whole table (one on every device)
    cache: float | None = None  # UVM caching: the share of its rows cached in HBM (dreamshard.caching); None: in HBM

    @property
    def width(self) -> int:
        return self.col_end - self.col_start

    @property
    def is_row_range(self) -> bool:
        return self.row_end is not None or self.row_start != 0

    def rows(self, table_rows: int) -> tuple[int, int]:
        """[start, end) of the rows this shard holds, for a table of `table_rows` rows."""
        return self.row_start, table_rows if self.row_end is None else self.row_end

    def load_factor(self, table: Table) -> float | None:
        """The share of rows UVM caching keeps in HBM: the shard's own, else its table's (a task whose tables are
        cached); None: all in HBM."""
        return table.cache_load_factor if self.cache is None else self.cache

    def num_rows(self, table_rows: int) -> int:
        start, end = self.rows(table_rows)
        return end - start

    def kind(self, table_rows: int, table_dim: int) -> str:
        """table | column | row | row+column | data: how this shard cuts its table (data: a replica)."""
        if self.replica:
            return "data"
        start, end = self.rows(table_rows)
        rows_cut = (start, end) != (0, table_rows)
        cols_cut = (self.col_start, self.col_end) != (0, table_dim)
        return {(False, False): "table", (False, True): "column", (True, False): "row"}.get((rows_cut, cols_cut),
                                                                                           "row+column")

    def key(self, device: bool = True) -> ShardKey:
        """The shard's identity, every field: table, device (unless not `device`), columns, rows (row_end -1: all),
        replica, cache load factor (-1: in device memory, 0: wholly in host memory)."""
        return (self.table, self.device if device else -1, self.col_start, self.col_end, self.row_start,
                -1 if self.row_end is None else self.row_end, self.replica, -1.0 if self.cache is None else self.cache)

    def label(self) -> str:
        rows = f"{self.row_start}:{'' if self.row_end is None else self.row_end}, " if self.is_row_range else ""
        cached = f", cached {self.cache:g}" if self.cache is not None else ""
        return f"{self.table}[{rows}{self.col_start}:{self.col_end}{', replica' if self.replica else ''}{cached}]"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"table": self.table, "device": self.device, "col_start": self.col_start,
                               "col_end": self.col_end}
        if self.is_row_range:
            out["row_start"] = self.row_start
            out["row_end"] = self.row_end
        if self.replica:
            out["replica"] = True
        if self.cache is not None:
            out["cache_load_factor"] = self.cache
        return out


def row_wise_shards(table: Table, num_devices: int) -> list[Shard]:
    """`table` in TorchRec's row-wise layout: block i (row_blocks) of all its columns on device i."""
    return [Shard(table.name, d, 0, table.dim, r0, r1) for d, (r0, r1) in enumerate(row_blocks(table.rows, num_devices))]


PlanKey = tuple[ShardKey, ...]  # Plan.key(): its shards' keys, sorted


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

    def key(self) -> PlanKey:
        """The plan's identity: its shards sorted, equal for plans listing the same shards in another order."""
        return tuple(sorted(s.key() for s in self.shards))

    def to_dict(self, **extra: Any) -> dict:
        return {"num_devices": self.num_devices, "shards": [s.to_dict() for s in self.shards], **extra}

    def save_json(self, path: str | Path, option: str = "", **extra: Any) -> None:
        """Write the plan and `extra` metadata as JSON (atomically; `-`: to standard output): indented, a shard a
        line (json's C encoder: a million shards in about a second, where indenting each takes ten)."""
        if "num_devices" in extra or "shards" in extra:
            raise ValueError("plan metadata cannot be named num_devices or shards")
        prefix = f'{{\n  "num_devices": {self.num_devices}'
        head = json.dumps({"num_devices": self.num_devices, **extra}, indent=2)
        assert head.startswith(prefix)
        shards = ",\n".join("    " + json.dumps(s.to_dict()) for s in self.shards)
        text = prefix + (',\n  "shards": [\n' + shards + "\n  ]" if shards else ',\n  "shards": []') + head[len(prefix):]
        write_text(text + "\n", path, option, stdout=True)

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
            if ("row_start" in s) != ("row_end" in s):
                raise DataFormatError(f"{origin}: shards[{i}]: row_start and row_end go together (a row range), "
                                      "or neither (all rows)")
            for key in ("row_start", "row_end"):
                if key in s and (not isinstance(s[key], int) or isinstance(s[key], bool)):
                    raise DataFormatError(f"{origin}: shards[{i}].{key}: expected int, got {s[key]!r}")
            if not isinstance(s.get("replica", False), bool):
                raise DataFormatError(f"{origin}: shards[{i}].replica: expected true or false, got {s['replica']!r}")
            cache = s.get("cache_load_factor")
            if cache is not None and (isinstance(cache, bool) or not isinstance(cache, (int, float))
                                      or not 0 <= cache <= 1):
                raise DataFormatError(f"{origin}: shards[{i}].cache_load_factor: expected a share in [0, 1] (0: "
                                      f"wholly in host memory), got {cache!r}")
            if not 0 <= s["device"] < n:
                raise DataFormatError(f"{origin}: shards[{i}]: table {s['table']!r}: device {s['device']} out of "
                                      f"range 0..{n - 1} (the plan's num_devices is {n})")
            shards.append(Shard(unicodedata.normalize("NFC", s["table"]), s["device"], s["col_start"], s["col_end"],
                                s.get("row_start", 0), s.get("row_end"), s.get("replica", False),
                                None if cache is None else float(cache)))
        return cls(n, tuple(shards))


# what a plan file holds: the plan, and what `dreamshard plan` records beside it (the task, provenance, estimate)
PLAN_KEYS = ("num_devices", "shards", "algorithm", "tables_file", "devices", "weights_precision", "optimizer",
             "batch_size", "reservation", "sharding", "kernels", "memory_gb", "constraints", "table_shapes", "made_by",
             "estimate", "replan")
SHARD_KEYS = ("table", "device", "col_start", "col_end", "row_start", "row_end", "replica", "cache_load_factor")


def unknown_plan_keys(obj: Any) -> list[str]:
    """The keys of a plan file no plan has (a misspelling, another version's): `colour`, `shards[3].note`."""
    if not isinstance(obj, dict):
        return []
    unknown = [str(k) for k in obj if k not in PLAN_KEYS]
    shards = obj.get("shards")
    for i, s in enumerate(shards if isinstance(shards, list) else []):
        if isinstance(s, dict):
            unknown += [f"shards[{i}].{k}" for k in s if k not in SHARD_KEYS]
    return unknown


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
    """Bytes each device holds (Task.shard_bytes): weights, optimizer state and buffers of its shards."""
    tables = {t.name: t for t in task.tables}
    used = [0] * plan.num_devices
    for s in plan.shards:
        t = tables[s.table]
        used[s.device] += task.shard_bytes(t, s.num_rows(t.rows), s.width, s.replica, s.cache)
    return used


def device_memory_breakdown(task: Task, plan: Plan) -> list[MemoryBreakdown]:
    """Each device's bytes by kind (weights, optimizer state, buffers) and its usable capacity."""
    tables = {t.name: t for t in task.tables}
    parts = [[0, 0, 0] for _ in range(plan.num_devices)]
    for s in plan.shards:
        t = tables[s.table]
        rows = s.num_rows(t.rows)
        total = task.shard_bytes(t, rows, s.width, s.replica, s.cache)
        w, o = task.hbm_weight_optimizer_bytes(t, rows, s.width, s.cache)
        parts[s.device][0] += w
        parts[s.device][1] += o
        parts[s.device][2] += total - w - o
    return [MemoryBreakdown(w, o, b, task.capacity(d)) for d, (w, o, b) in enumerate(parts)]


def check_shard_block(s: Shard, t: Table) -> None:
    """Raise InvalidPlanError unless the shard's rows and columns are a non-empty block of table `t`:
    columns on multiples of 4 (FBGEMM's row alignment) within its dim, rows within its rows."""
    if s.col_start < 0 or s.col_end > t.dim:
        raise InvalidPlanError(f"table {s.table!r}: columns [{s.col_start}, {s.col_end}) outside its dim {t.dim}")
    if s.width <= 0 or s.width % 4 or s.col_start % 4:
        raise InvalidPlanError(
            f"table {s.table!r}: columns [{s.col_start}, {s.col_end}) must be a non-empty range on multiples of 4"
        )
    start, end = s.rows(t.rows)
    if start < 0 or end > t.rows or end <= start:
        raise InvalidPlanError(f"table {s.table!r}: rows [{start}, {end}) must be a non-empty range within its "
                               f"{t.rows} rows")


def validate_plan(task: Task, plan: Plan) -> None:
    """Raise InvalidPlanError unless every cell of every table is placed exactly once, within memory,
    and the task's constraints hold: pinned tables on their device, no shard on a device its table
    avoids, grouped tables together on one device, pinned, grouped and `whole` tables uncut.

    Columns are cut on multiples of 4 (FBGEMM's row alignment), rows anywhere. A data-parallel table (the
    task's sharding allows "data") is a whole `replica` on every device and nothing else; it may not be
    pinned, grouped or avoid devices.
    """
    if plan.num_devices != task.num_devices:
        raise InvalidPlanError(f"plan is for {plan.num_devices} devices, task {task.name!r} has {task.num_devices}")
    tables = {t.name: t for t in task.tables}
    blocks: dict[str, list[Shard]] = defaultdict(list)
    for s in plan.shards:
        t = tables.get(s.table)
        if t is None:
            raise InvalidPlanError(f"shard of unknown table {s.table!r}")
        if not 0 <= s.device < plan.num_devices:
            raise InvalidPlanError(f"table {s.table!r} on device {s.device}, expected 0..{plan.num_devices - 1}")
        check_shard_block(s, t)
        blocks[s.table].append(s)
    must_cache = set(task.must_cache)
    for name, t in tables.items():
        placed = blocks.get(name, [])
        if len(placed) == 1 and placed[0].kind(t.rows, t.dim) == "table" and placed[0].load_factor(t) is None \
                and name not in must_cache \
                and (task.num_devices == 1 or "table" in task.kinds_of(name)):
            continue  # a whole table in device memory, as its kinds allow: what the checks below would find
        _check_cache(task, t, placed)
        if any(s.replica for s in placed):
            _check_replicas(task, t, placed)
            _check_kinds(task, t, placed)
            continue
        _check_tiles(t, placed)
        _check_kinds(task, t, placed)
    for name, device in task.pins:
        off = [s for s in blocks[name] if s.device != device]
        if off:
            raise InvalidPlanError(f"table {name!r} is pinned to device {device}, but {off[0].label()} is on "
                                   f"device {off[0].device}")
    for name, devices in task.avoid:
        bad = [s for s in blocks[name] if s.device in devices]
        if bad:
            raise InvalidPlanError(f"table {name!r} avoids devices {list(devices)}, but {bad[0].label()} is on "
                                   f"device {bad[0].device}")
    for name in task.never_cut():
        if len(blocks[name]) != 1:
            raise InvalidPlanError(f"table {name!r} must stay whole (pinned, grouped or whole), but is cut into "
                                   f"{len(blocks[name])} shards: {', '.join(s.label() for s in blocks[name])}")
    for group in task.groups:
        on = {name: blocks[name][0].device for name in group}
        if len(set(on.values())) > 1:
            raise InvalidPlanError(f"group {list(group)} must share one device, but is on "
                                   + ", ".join(f"{n!r}: device {d}" for n, d in on.items()))
    for d, used in enumerate(device_memory_bytes(task, plan)):
        if used > task.capacity(d):
            raise InvalidPlanError(f"device {d}: {used} bytes placed, capacity {task.capacity(d)}"
                                   + (f" ({task.devices[d].memory_bytes} less the {task.memory.reservation:g} "
                                      "reservation)" if task.memory.reservation else ""))


def check_cover(t: Table, placed: Sequence[Shard], num_devices: int) -> None:
    """Raise InvalidPlanError unless `placed` place every cell of table `t` exactly once on devices
    0..num_devices-1, or are a whole replica on each device (a data-parallel table): what a plan must be of each
    table, whatever its task."""
    for s in placed:
        if not 0 <= s.device < num_devices:
            raise InvalidPlanError(f"table {t.name!r}: device {s.device} out of range 0..{num_devices - 1}")
        check_shard_block(s, t)
    if any(s.replica for s in placed):
        _check_whole_replicas(t, placed, num_devices)
    else:
        _check_tiles(t, placed)


def _check_tiles(t: Table, placed: Sequence[Shard]) -> None:
    """No two shards overlap, and together they cover the table."""
    for i, a in enumerate(placed):
        for b in placed[i + 1:]:
            (ra0, ra1), (rb0, rb1) = a.rows(t.rows), b.rows(t.rows)
            if ra0 < rb1 and rb0 < ra1 and a.col_start < b.col_end and b.col_start < a.col_end:
                raise InvalidPlanError(f"table {t.name!r}: {a.label()} and {b.label()} overlap: cells placed more "
                                       "than once")
    covered = sum(s.num_rows(t.rows) * s.width for s in placed)  # no overlaps: the area placed
    if covered != t.rows * t.dim:
        r0, r1, c0, c1 = _first_gap(t.rows, t.dim, [(*s.rows(t.rows), s.col_start, s.col_end) for s in placed])
        raise InvalidPlanError(f"table {t.name!r}: rows [{r0}, {r1}) x columns [{c0}, {c1}) not placed "
                               f"({t.rows} rows x dim {t.dim})")


def _check_whole_replicas(t: Table, placed: Sequence[Shard], num_devices: int) -> None:
    cut = [s for s in placed if not s.replica or s.is_row_range or (s.col_start, s.col_end) != (0, t.dim)]
    if cut:
        raise InvalidPlanError(f"table {t.name!r} is data-parallel, so every shard of it is a whole replica, but "
                               f"{cut[0].label()} is not")
    devices = sorted(s.device for s in placed)
    if devices != list(range(num_devices)):
        raise InvalidPlanError(f"table {t.name!r} is data-parallel: one replica on each of the {num_devices} "
                               f"devices, got replicas on devices {devices}")


def _check_cache(task: Task, t: Table, placed: list[Shard]) -> None:
    """UVM caching: allowed by the task's kernels, one load factor for every shard of a table, never a replica."""
    factors = {s.load_factor(t) for s in placed}
    if factors <= {None}:  # in device memory (or not placed at all: the coverage check says so)
        return
    host = 0.0 in factors  # wholly in host memory: TorchRec's fused_uvm
    kernel = "fused_uvm" if host else "fused_uvm_caching"
    if kernel not in task.kernels:
        raise InvalidPlanError(f"table {t.name!r} is {'in host memory' if host else 'UVM-cached'}, but task "
                               f"{task.name!r} allows kernels {', '.join(task.kernels)} only")
    if host and t.name in task.never_host:
        raise InvalidPlanError(f"table {t.name!r} is wholly in host memory (fused_uvm), which its kernels leave out")
    if not host and t.name in task.uncached:
        raise InvalidPlanError(f"table {t.name!r} is UVM-cached, which its kernels leave out")
    if len(factors) > 1:
        raise InvalidPlanError(f"table {t.name!r}: its shards are cached with load factors "
                               f"{sorted(factors, key=lambda f: -1 if f is None else f)}; one kernel and cache a table")
    if any(s.replica for s in placed):
        raise InvalidPlanError(f"table {t.name!r} is data-parallel and UVM-cached; replicas use the dense kernel")


def _check_kinds(task: Task, t: Table, placed: list[Shard]) -> None:
    """The table's own limits (Task.table_kinds, min_widths, must_cache, cache_factors): its shards' kinds, the
    width of its column slices, and its cache."""
    if not placed:
        return  # the coverage check says so
    kinds = {s.kind(t.rows, t.dim) for s in placed}
    kind = "data" if "data" in kinds else "row" if kinds & {"row", "row+column"} else \
        "column" if "column" in kinds else "table"
    needed = [kind, "column"] if "row+column" in kinds else [kind]
    allowed = task.kinds_of(t.name)
    if kind == "row" and "row" not in allowed and "host" in allowed and host_of_blocks(task, t, placed) is not None:
        needed = ["host"]  # TorchRec's table_row_wise: row-wise over one host's devices
    if task.num_devices == 1 and kind == "table":
        allowed = ("table",)  # one device: the table whole is every layout
    refused = [k for k in needed if k not in allowed]
    if refused:
        raise InvalidPlanError(f"table {t.name!r} is planned {'+'.join(needed)}, but it allows "
                               f"{', '.join(allowed)} only")
    if kinds & {"column", "row+column"}:
        narrow = min(placed, key=lambda s: s.width)
        if narrow.width < task.min_width(t.name):
            raise InvalidPlanError(f"table {t.name!r}: column slice {narrow.label()} is {narrow.width} columns "
                                   f"wide, narrower than its min_width {task.min_width(t.name)}")
    factor = placed[0].load_factor(t)
    if t.name in task.must_cache and factor is None:
        raise InvalidPlanError(f"table {t.name!r} must be UVM-cached (its kernels allow no other), but is in "
                               "device memory")
    given = task.cache_factor(t.name)
    if given is not None and factor is not None and abs(factor - given) > 1e-12:
        raise InvalidPlanError(f"table {t.name!r} is cached at load factor {factor:g}, but its constraint gives "
                               f"{given:g}")


def _check_replicas(task: Task, t: Table, placed: list[Shard]) -> None:
    """A data-parallel table: allowed by the task, a whole replica on every device and nothing else."""
    if "data" not in task.sharding:
        raise InvalidPlanError(f"table {t.name!r} is data-parallel (replicas), but task {task.name!r} allows "
                               f"sharding kinds {', '.join(task.sharding)} only")
    _check_whole_replicas(t, placed, task.num_devices)
    fixed = task.pinned_device().keys() | task.avoided().keys() | set(task.group_of())
    if t.name in fixed:
        raise InvalidPlanError(f"table {t.name!r} is data-parallel (on every device), but its constraints pin it, "
                               "group it or keep it off devices")


def _first_gap(rows: int, dim: int, blocks: list[tuple[int, int, int, int]]) -> tuple[int, int, int, int]:
    """The first cell of the grid the blocks' edges make that no block covers (blocks do not cover all)."""
    row_edges = sorted({0, rows, *(b[0] for b in blocks), *(b[1] for b in blocks)})
    col_edges = sorted({0, dim, *(b[2] for b in blocks), *(b[3] for b in blocks)})
    for r0, r1 in zip(row_edges, row_edges[1:]):
        for c0, c1 in zip(col_edges, col_edges[1:]):
            if not any(b[0] <= r0 and r1 <= b[1] and b[2] <= c0 and c1 <= b[3] for b in blocks):
                return r0, r1, c0, c1
    raise AssertionError("no gap found in an incomplete cover")
