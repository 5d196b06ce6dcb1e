"""Tasks (tables + devices + memory model + placement constraints) and their Parquet files; sampling them is
dreamshard.data.sampling.

Devices may differ in memory, kind, relative speed and host; constraints (pins, avoid, groups, whole) are
checked by plan.validate_plan and honoured by every sharder of ours. Devices and constraints: docs/clusters.md.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dreamshard.errors import DataFormatError
from dreamshard.memory import GB, MemoryModel
from dreamshard.tables import BIN_COLUMNS, Table

MAX_MEMORY_GB = 1e6  # keeps byte counts far inside int64

# the compute kernels a task may allow (Task.kernels; what they do: dreamshard.caching): "fused" (weights in HBM)
# always; UVM caching, and tables wholly in host memory, when asked for
UVM_KERNEL = "fused_uvm_caching"
HOST_KERNEL = "fused_uvm"  # TorchRec's kernel for a table wholly in host memory: load factor 0, no cache
KERNELS = ("fused", UVM_KERNEL, HOST_KERNEL)


def cached_weight_bytes(weight_bytes_of_table: int, rows: int, width: int, table: Table, load_factor: float) -> int:
    """HBM bytes of the weights of a rows x width shard of a cached `table`, as TorchRec's storage estimator counts
    them: the table's weights times the load factor (rounded), the shard's share of it (rounded up)."""
    return math.ceil(round(weight_bytes_of_table * load_factor) * rows * width / (table.rows * table.dim))


def cache_state_bytes(rows: int, load_factor: float) -> int:
    """FBGEMM's cache bookkeeping of a shard of `rows` rows, as TorchRec counts it: 4 bytes a row, 16 a slot;
    none without a cache (load factor 0: fused_uvm)."""
    return 0 if load_factor == 0 else math.ceil(rows * (4 + load_factor * 16))


SHARDING_KINDS = ("table", "column", "row")  # whole tables, column slices, row ranges (TorchRec's layouts)
# and "data": data-parallel, a copy of a small table on every device (sharders/replicas.py); "host": row-wise blocks
# over the devices of one host (TorchRec's table_row_wise), on devices that name several hosts; asked for, never defaults
ALL_SHARDING_KINDS = (*SHARDING_KINDS, "data", "host")
MIN_WIDTH = 4  # the narrowest column slice: FBGEMM aligns rows to 4 columns


@dataclass(frozen=True)
class Device:
    memory_bytes: int
    kind: str = ""  # e.g. "h100", "a100": free text, "" when not said
    speed: float = 1.0  # relative throughput: compute costs on this device are reference costs / speed
    host: str = ""  # devices of one host share its fast links; "" for all: consecutive devices per host (Topology)

    def __post_init__(self) -> None:
        if isinstance(self.memory_bytes, bool) or not isinstance(self.memory_bytes, int) or self.memory_bytes <= 0:
            raise ValueError(f"device memory must be a positive number of bytes, got {self.memory_bytes!r}")
        if not (isinstance(self.speed, (int, float)) and 0 < self.speed < float("inf")):
            raise ValueError(f"device speed must be a positive finite number, got {self.speed!r}")


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
    # (table name, devices): devices no shard of the table may be on
    avoid: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # tables that must share one device (never cut); a table is in one group at most
    groups: tuple[tuple[str, ...], ...] = ()
    # tables never cut into column slices or row ranges
    whole: tuple[str, ...] = ()
    # tables never data-parallel, when the sharding allows "data" (their TorchRec constraints leave it out)
    model_parallel: tuple[str, ...] = ()
    # the compute kernels sharders may choose (KERNELS): "fused" always; "fused_uvm_caching" to
    # keep tables that HBM cannot hold in host memory, cached
    kernels: tuple[str, ...] = ("fused",)
    # tables never UVM-cached, when the kernels allow it (their TorchRec constraints leave the kernel out)
    uncached: tuple[str, ...] = ()
    # bytes each device holds before any shard is placed (the data-parallel replicas planned beside the rest); ()
    # for none
    held: tuple[int, ...] = ()
    # per-table limits, as TorchRec's ParameterConstraints give them (docs/torchrec.md):
    # (table, kinds): the kinds that table allows, within `sharding` ("table": whole on one device); a table
    # without "table" is cut row-wise or data-parallel
    table_kinds: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # (table, columns): the narrowest column slice of that table (TorchRec's min_partition); MIN_WIDTH otherwise
    min_widths: tuple[tuple[str, int], ...] = ()
    # tables that must be UVM-cached (their compute kernels allow no other); needs "fused_uvm_caching" in kernels
    must_cache: tuple[str, ...] = ()
    # (table, load factor): the load factor a table is cached at when it is (TorchRec's cache_params.load_factor;
    # 0: wholly in host memory, TorchRec's fused_uvm)
    cache_factors: tuple[tuple[str, float], ...] = ()
    # tables never kept wholly in host memory (fused_uvm), when the kernels allow it
    never_host: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.tables:
            raise ValueError(f"task {self.name!r}: no tables")
        if not self.devices:
            raise ValueError(f"task {self.name!r}: no devices")
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"task {self.name!r}: table names must be unique")
        unknown = [k for k in self.sharding if k not in ALL_SHARDING_KINDS]
        if unknown or "table" not in self.sharding:
            raise ValueError(f"task {self.name!r}: sharding kinds must include 'table' and be among "
                             f"{', '.join(ALL_SHARDING_KINDS)}; got {', '.join(self.sharding) or 'none'}")
        if "fused" not in self.kernels or any(k not in KERNELS for k in self.kernels):
            raise ValueError(f"task {self.name!r}: kernels must include 'fused' and be among {', '.join(KERNELS)}; "
                             f"got {', '.join(self.kernels) or 'none'}")
        if self.held and (len(self.held) != len(self.devices) or any(h < 0 for h in self.held)):
            raise ValueError(f"task {self.name!r}: held: expected {len(self.devices)} byte counts >= 0, "
                             f"got {self.held}")
        for table, device in self.pins:
            if table not in names:
                raise ValueError(f"task {self.name!r}: pin of unknown table {table!r}")
            if not 0 <= device < len(self.devices):
                raise ValueError(f"task {self.name!r}: table {table!r} pinned to device {device}, "
                                 f"expected 0..{len(self.devices) - 1}")
        pinned = [t for t, _ in self.pins]
        if len(set(pinned)) != len(pinned):
            raise ValueError(f"task {self.name!r}: a table is pinned twice")
        known = set(names)
        for table, devices in self.avoid:
            if table not in known:
                raise ValueError(f"task {self.name!r}: avoid of unknown table {table!r}")
            bad = [d for d in devices if not 0 <= d < len(self.devices)]
            if bad:
                raise ValueError(f"task {self.name!r}: table {table!r} avoids device {bad[0]}, expected "
                                 f"0..{len(self.devices) - 1}")
        if len({t for t, _ in self.avoid}) != len(self.avoid):
            raise ValueError(f"task {self.name!r}: a table has two avoid lists")
        grouped: list[str] = [t for g in self.groups for t in g]
        for g in self.groups:
            if len(g) < 2:
                raise ValueError(f"task {self.name!r}: group {list(g)} needs at least two tables")
        limited = [t for t, _ in self.table_kinds] + [t for t, _ in self.min_widths] + list(self.must_cache) \
            + [t for t, _ in self.cache_factors] + list(self.never_host)
        for t in grouped + list(self.whole) + list(self.model_parallel) + list(self.uncached) + limited:
            if t not in known:
                raise ValueError(f"task {self.name!r}: constraint on unknown table {t!r}")
        for t, kinds in self.table_kinds:
            if not kinds or any(k not in ALL_SHARDING_KINDS for k in kinds):
                raise ValueError(f"task {self.name!r}: table {t!r}: kinds must be among "
                                 f"{', '.join(ALL_SHARDING_KINDS)}; got {', '.join(kinds) or 'none'}")
        for t, width in self.min_widths:
            if isinstance(width, bool) or not isinstance(width, int) or width < MIN_WIDTH:
                raise ValueError(f"task {self.name!r}: table {t!r}: narrowest column slice must be an integer >= "
                                 f"{MIN_WIDTH}, got {width!r}")
        for t, factor in self.cache_factors:
            if not 0 <= factor <= 1:
                raise ValueError(f"task {self.name!r}: table {t!r}: cache load factor must be in [0, 1], got {factor!r}")
        if self.must_cache and not {"fused_uvm_caching", "fused_uvm"} & set(self.kernels):
            raise ValueError(f"task {self.name!r}: table {self.must_cache[0]!r} must be UVM-cached, but the kernels "
                             f"are {', '.join(self.kernels)}")
        clash = set(self.must_cache) & set(self.uncached)
        if clash:
            raise ValueError(f"task {self.name!r}: table {sorted(clash)[0]!r} must be cached and never be")
        if len(set(grouped)) != len(grouped):
            twice = next(t for t in grouped if grouped.count(t) > 1)
            raise ValueError(f"task {self.name!r}: table {twice!r} is in two groups; merge them into one")

    def pinned_device(self) -> dict[str, int]:
        """table name -> the device it must be on."""
        return dict(self.pins)

    def avoided(self) -> dict[str, tuple[int, ...]]:
        """table name -> the devices it must not be on."""
        return dict(self.avoid)

    def group_of(self) -> dict[str, int]:
        """table name -> index of its group in `groups`, for grouped tables."""
        return {t: i for i, g in enumerate(self.groups) for t in g}

    def never_cut(self) -> set[str]:
        """Tables that stay whole: pinned, grouped or `whole`."""
        return {t for t, _ in self.pins} | {t for g in self.groups for t in g} | set(self.whole)

    @functools.cached_property
    def _limits(self) -> tuple[dict[str, tuple[str, ...]], dict[str, int], frozenset[str], dict[str, float]]:
        return dict(self.table_kinds), dict(self.min_widths), frozenset(self.never_cut()), dict(self.cache_factors)

    def kinds_of(self, table: str) -> tuple[str, ...]:
        """The kinds `table` may take: the task's sharding, narrowed by its own (table_kinds)."""
        own = self._limits[0].get(table)
        return self.sharding if own is None else tuple(k for k in self.sharding if k in own)

    def allows(self, table: str, kind: str) -> bool:
        """May `table` take `kind` (table, column, row, data, host) by the task's sharding, its own kinds and its
        constraints (pinned, grouped or whole tables are never cut; model_parallel ones never replicated)?"""
        if kind not in self.kinds_of(table):
            return False
        if kind in ("column", "row", "host"):
            return table not in self._limits[2]
        return kind != "data" or table not in self.model_parallel

    def cache_factor(self, table: str) -> float | None:
        """The load factor `table` is cached at when it is, by its constraint (cache_factors); None: chosen."""
        return self._limits[3].get(table)

    def min_width(self, table: str) -> int:
        """The narrowest column slice `table` may be cut into (min_widths; MIN_WIDTH by default)."""
        return self._limits[1].get(table, MIN_WIDTH)

    def max_slices(self, table: Table) -> int:
        """The most column slices `table` may be cut into: multiples of 4 columns, each at least min_width wide
        (1: none)."""
        if not self.allows(table.name, "column"):
            return 1
        return max(1, (table.dim // 4) // -(-self.min_width(table.name) // 4))

    @property
    def constrained(self) -> bool:
        """Has placement constraints besides the pins of row-wise blocks (pins, avoid, groups, whole)?"""
        return bool(self.pins or self.avoid or self.groups or self.whole or self.table_kinds or self.min_widths
                    or self.must_cache or self.cache_factors or self.never_host)

    def allowed_devices(self, table: str) -> list[int]:
        """Devices a shard of `table` may be on, by its pin and avoid list (groups aside)."""
        pin = self.pinned_device().get(table)
        if pin is not None:
            return [pin]
        banned = set(self.avoided().get(table, ()))
        return [d for d in range(len(self.devices)) if d not in banned]

    def speeds(self) -> tuple[float, ...]:
        return tuple(d.speed for d in self.devices)

    @property
    def heterogeneous(self) -> bool:
        """Do devices differ in speed, kind or memory?"""
        return len({(d.memory_bytes, d.kind, d.speed) for d in self.devices}) > 1

    def host_ids(self) -> tuple[int, ...] | None:
        """Host index of each device when the devices name their hosts (first appearance order), else None:
        the communication topology then groups consecutive devices."""
        if not any(d.host for d in self.devices):
            return None
        if not all(d.host for d in self.devices):
            raise ValueError(f"task {self.name!r}: some devices name a host and some do not; name all or none")
        order: dict[str, int] = {}
        return tuple(order.setdefault(d.host, len(order)) for d in self.devices)

    def per_host(self) -> int | None:
        """Devices per host when the devices name two hosts or more, each one consecutive block of devices, all
        blocks of one size (TorchRec's layout of ranks, where table_row_wise blocks live); else None."""
        hosts = self.host_ids()
        if hosts is None or len(set(hosts)) < 2:
            return None
        size = len(hosts) // len(set(hosts))
        return size if list(hosts) == [d // size for d in range(len(hosts))] else None

    def derived(self, tables: Sequence[Table], origin: dict[str, str], pins: Sequence[tuple[str, int]] = ()) -> Task:
        """This task over `tables` derived from its own (pieces, shards): origin maps each new table name to the
        table it came from (names absent map to themselves). Constraints follow: a piece avoids what its table
        avoids; pins, groups and `whole` map to the new names (such tables are never cut, so one each); `pins`
        adds pins (e.g. row-wise blocks)."""
        source = {t.name: origin.get(t.name, t.name) for t in tables}
        derived_of: dict[str, list[str]] = {}
        for new, old in source.items():
            derived_of.setdefault(old, []).append(new)
        new_pins = [(n, d) for t, d in self.pins for n in derived_of.get(t, [])] + list(pins)
        new_avoid = [(n, ds) for t, ds in self.avoid for n in derived_of.get(t, [])]
        new_groups = [tuple(n for t in g for n in derived_of.get(t, [])) for g in self.groups]
        new_whole = [n for t in self.whole for n in derived_of.get(t, [])]
        new_model_parallel = [n for t in self.model_parallel for n in derived_of.get(t, [])]
        new_uncached = [n for t in self.uncached for n in derived_of.get(t, [])]
        kinds = dict(self.table_kinds)
        # a piece is placed whole, or cut into narrower column slices where its table may be: never into row ranges
        # (rows of a column slice are no layout TorchRec runs) nor replicated
        new_kinds = [(n, ks) for t, ks in kinds.items() for n in derived_of.get(t, []) if n == t]
        new_kinds += [(n, ("table", "column") if "column" in self.kinds_of(t) else ("table",))
                      for n, t in source.items() if n != t]
        new_widths = [(n, w) for t, w in self.min_widths for n in derived_of.get(t, [])]
        new_cache = [n for t in self.must_cache for n in derived_of.get(t, [])]
        new_factors = [(n, f) for t, f in self.cache_factors for n in derived_of.get(t, [])]
        new_host = [n for t in self.never_host for n in derived_of.get(t, [])]
        return replace(self, tables=tuple(tables), pins=tuple(new_pins), avoid=tuple(new_avoid),
                       groups=tuple(g for g in new_groups if len(g) > 1), whole=tuple(new_whole),
                       model_parallel=tuple(new_model_parallel), uncached=tuple(new_uncached),
                       table_kinds=tuple(new_kinds), min_widths=tuple(new_widths), must_cache=tuple(new_cache),
                       cache_factors=tuple(new_factors), never_host=tuple(new_host))

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def shard_bytes(self, table: Table, rows: int | None = None, width: int | None = None,
                    replica: bool = False, cache: float | None = None) -> int:
        """Bytes a shard of `table` (rows x width of it; the whole table by default) takes on its device:
        weights, optimizer state and, at the memory model's batch size, its input and output buffers. A
        data-parallel `replica` buffers its own device's samples only, as TorchRec counts it. A UVM-cached shard
        (`cache`, else the table's cache_load_factor) holds that share of its weights and state, and the cache's
        bookkeeping (cache_state_bytes)."""
        rows = table.rows if rows is None else rows
        width = table.dim if width is None else width
        block = table.block_of_pooling is not None or rows < table.rows
        pooling = table.pooling_factor if table.block_of_pooling is None else table.block_of_pooling
        weights, optimizer = self.hbm_weight_optimizer_bytes(table, rows, width, cache)
        factor = table.cache_load_factor if cache is None else cache
        state = 0 if factor is None else cache_state_bytes(rows, factor)
        return weights + optimizer + state + self.memory.io_bytes(
            pooling, table.features, width, 1 if replica else self.num_devices, row_block=block,
            precision=table.precision, sequence=table.sequence)

    def hbm_weight_optimizer_bytes(self, table: Table, rows: int, width: int,
                                   cache: float | None = None) -> tuple[int, int]:
        """(weights, optimizer state) in device memory of a rows x width shard of `table`: all of them, or for a
        UVM-cached shard (`cache`, else the table's cache_load_factor) the cached share, as TorchRec counts it."""
        weights = self.memory.weight_bytes(rows, width, table.precision)
        optimizer = self.memory.optimizer_bytes(rows, width)
        factor = table.cache_load_factor if cache is None else cache
        if factor is None:
            return weights, optimizer
        table_weights = self.memory.weight_bytes(table.rows, table.dim, table.precision)
        cached = cached_weight_bytes(table_weights, rows, width, table, factor)
        return cached, math.ceil(cached * optimizer / weights) if weights else 0

    def table_bytes(self, i: int) -> int:
        return self.shard_bytes(self.tables[i])

    def capacity(self, d: int) -> int:
        """Bytes device `d` holds for shards: its memory less the memory model's reservation (and `held`)."""
        return self.memory.usable_bytes(self.devices[d].memory_bytes) - (self.held[d] if self.held else 0)

    def capacities(self) -> list[int]:
        return [self.capacity(d) for d in range(len(self.devices))]

    @classmethod
    def uniform(cls, name: str, tables: Sequence[Table], num_devices: int, memory_gb: float,
                memory: MemoryModel | None = None, family: str = "", per_host: int = 0,
                sharding: Sequence[str] = SHARDING_KINDS) -> Task:
        """`num_devices` devices of `memory_gb` each; `per_host` > 0: named by host, that many a host (host_name)."""
        if num_devices < 1:
            raise ValueError(f"task {name!r}: need at least one device, got {num_devices}")
        if not 0 < memory_gb <= MAX_MEMORY_GB:
            raise ValueError(f"task {name!r}: device memory must be in (0, {MAX_MEMORY_GB:g}] GB, got {memory_gb}")
        try:
            hosts = host_names(num_devices, per_host)
        except ValueError as exc:
            raise ValueError(f"task {name!r}: {exc}") from None
        devices = tuple(Device(int(memory_gb * GB), host=h) for h in hosts)
        return cls(name, tuple(tables), devices, memory or MemoryModel(), family, sharding=tuple(sharding))


def host_name(device: int, per_host: int) -> str:
    """The host of `device` among hosts of `per_host` consecutive devices ("" when 0: no host named)."""
    return f"host{device // per_host}" if per_host else ""


def host_names(num_devices: int, per_host: int) -> tuple[str, ...]:
    """Each device's `host_name`; a ValueError naming `devices_per_host` unless it is 0 or divides num_devices."""
    if isinstance(per_host, bool) or not isinstance(per_host, int) or per_host < 0 \
            or (per_host and num_devices % per_host):
        raise ValueError(f"devices_per_host: expected 0 or a divisor of num_devices {num_devices}, got {per_host!r}")
    return tuple(host_name(d, per_host) for d in range(num_devices))


def table_pool(tasks: Sequence[Task]) -> list[Table]:
    """The distinct tables of `tasks` (by name), in order of first appearance."""
    return list({t.name: t for task in tasks for t in task.tables}.values())


def table_dims(tasks: Sequence[Task]) -> list[int]:
    """The dims the tables of `tasks` take, sorted: for the training tasks, the dims collect_devices and
    NeuroShard's augmentation draw tables at. Read off the tasks rather than the families in params.yaml, so that
    a family with no training tasks (a test family added) changes neither stage."""
    return sorted({t.dim for task in tasks for t in task.tables})


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
        pa.field("devices_per_host", pa.int32(), nullable=False),  # 0: the devices name no host
        pa.field("sharding", pa.list_(pa.string()), nullable=False),  # Task.sharding
    ]
)
# columns a task file written before they existed lacks: read as devices naming no host and SHARDING_KINDS
OPTIONAL_TASK_COLUMNS = {"devices_per_host": 0, "sharding": list(SHARDING_KINDS)}


def tasks_to_arrow(tasks: Sequence[Task], split: str, name_to_id: dict[str, int]) -> pa.Table:
    rows = []
    for t in tasks:
        first = t.devices[0].host
        per_host = sum(d.host == first for d in t.devices) if first else 0
        if t.constrained or any((d.kind, d.speed, d.host) != ("", 1.0, host_name(i, per_host))
                                for i, d in enumerate(t.devices)):
            raise ValueError(f"task {t.name!r}: task files hold uniform, unconstrained tasks (devices named by "
                             "host as Task.uniform names them, or none)")
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
                "devices_per_host": per_host,
                "sharding": list(t.sharding),
            }
        )
    return pa.Table.from_pylist(rows, schema=TASKS_SCHEMA)


def read_tasks(tasks_path: str | Path, tables_path: str | Path) -> list[Task]:
    """Rebuild tasks from a tasks file and the tables statistics they refer to."""
    stats = pd.read_parquet(tables_path).set_index("table_id")
    df = pq.read_table(tasks_path).to_pandas()
    missing = [f.name for f in TASKS_SCHEMA if f.name not in df.columns and f.name not in OPTIONAL_TASK_COLUMNS]
    if missing:
        raise DataFormatError(f"{tasks_path}: missing column(s) {', '.join(missing)}")
    tasks = []
    for rec in df.to_dict("records"):
        unknown = [int(i) for i in rec["table_ids"] if int(i) not in stats.index]
        if unknown:
            raise DataFormatError(f"{tasks_path}: task {rec['task_id']}: table_ids {unknown[:5]} not in {tables_path}")
        tables = [stats_table(stats.loc[int(i)], int(d)) for i, d in zip(rec["table_ids"], rec["dims"])]
        try:
            hosts = host_names(int(rec["num_devices"]), int(rec.get("devices_per_host", 0)))
        except ValueError as exc:
            raise DataFormatError(f"{tasks_path}: task {rec['task_id']}: {exc}") from None
        devices = tuple(Device(int(rec["device_memory_bytes"]), host=h) for h in hosts)
        sharding = tuple(str(k) for k in rec.get("sharding", OPTIONAL_TASK_COLUMNS["sharding"]))
        try:
            tasks.append(Task(rec["task_id"], tuple(tables), devices,
                              MemoryModel(rec["weights_precision"], rec["optimizer"]), rec["family"],
                              sharding=sharding))
        except ValueError as exc:
            raise DataFormatError(f"{tasks_path}: {exc}") from exc
    return tasks
