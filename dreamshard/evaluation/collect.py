"""Cost collection: which plans to measure, and measuring them into rows that survive a crash.

Plans come from a mix of sharders (random and the greedy heuristics), from
perturbed heuristic plans (a few tables moved to random devices with room), so the
data covers balanced and unbalanced devices alike, and from plans with cuts (`cut_tables`:
the costliest tables of the busiest device cut into column slices spread over other
devices, or into row-wise blocks), so that the cost network sees the column-wise and
row-wise plans that TorchRec's planner and `dreamshard_cut` make. Rows are written chunk by chunk to
a journal folder; a rerun skips every plan whose rows are already there. The chunks
(`pending_chunks`) can be measured anywhere (`measure_chunk` writes nothing) and
journaled by the caller as they finish, in any order: the merged rows
(`CostJournal.read`) follow the plans' order, not the order of measurement.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from dreamshard.hardware.base import CostBackend, Reading, measure_rounds, median_cost
from dreamshard.io import write_parquet
from dreamshard.placement import Rules
from dreamshard.plan import Plan, Shard, device_memory_bytes, row_wise_shards, validate_plan
from dreamshard.sharders import HEURISTICS, SHARDERS, make_sharder
from dreamshard.sharders.pieces import column_widths
from dreamshard.tasks import Task


@dataclass(frozen=True)
class PlanToMeasure:
    plan_id: str  # content hash: same task, plan and backend settings -> same id
    task: Task
    source: str  # the sharder that made it, "+perturbed" when tables were moved
    plan: Plan


def perturb(task: Task, plan: Plan, rng: np.random.Generator, max_moves: int) -> Plan:
    """Move up to `max_moves` random whole tables to random devices that have room and that the task's rules let
    them take (placement.Rules: a pinned or grouped table stays). A table the plan holds in pieces (a heuristic cuts
    a table no device holds whole) stays as it is."""
    rules = Rules.of_task(task)
    shards_of, dims = Counter(s.table for s in plan.shards), {t.name: t.dim for t in task.tables}
    assignment = {s.table: s.device for s in plan.shards if shards_of[s.table] == 1 and s.width == dims[s.table]
                  and not s.is_row_range and not s.replica and s.cache is None}
    used = device_memory_bytes(task, plan)
    for _ in range(int(rng.integers(1, max_moves + 1))):
        i = int(rng.integers(len(task.tables)))
        t = task.tables[i]
        if t.name not in assignment:
            continue
        size = int(rules.sizes[i])
        src = assignment[t.name]
        room = [d for d in rules.with_room(i, used) if d != src] if rules.movable(i) else []
        if room:
            dst = int(rng.choice(room))
            assignment[t.name] = dst
            used[src] -= size
            used[dst] += size
    return Plan(plan.num_devices, tuple(replace(s, device=assignment[s.table]) if s.table in assignment else s
                                        for s in plan.shards))


def cut_tables(task: Task, plan: Plan, rng: np.random.Generator, max_tables: int = 2) -> Plan:
    """`plan` with 1..max_tables of the tables of its busiest device (by summed dim x pooling) cut: into 2 or 4
    column slices (at least 4 columns wide; the first slice stays, the others go to distinct random devices with
    room), or, one time in three where the task allows row cuts, into TorchRec's row-wise blocks (block i on
    device i). A table that cannot be cut so (too narrow, no room) stays as it was."""
    if task.num_devices < 2:
        return plan
    tables = {t.name: t for t in task.tables}
    load = np.zeros(task.num_devices)
    for s in plan.shards:
        load[s.device] += s.width * tables[s.table].pooling_factor
    busiest = int(np.argmax(load))
    uncut, rules, index = task.never_cut(), Rules.of_task(task), {t.name: i for i, t in enumerate(task.tables)}
    whole = [s for s in plan.device_shards(busiest)
             if s.table not in uncut and s.width == tables[s.table].dim and not s.is_row_range]
    whole.sort(key=lambda s: -s.width * tables[s.table].pooling_factor)
    used = device_memory_bytes(task, plan)
    shards = list(plan.shards)
    for s in whole[:int(rng.integers(1, max_tables + 1))]:
        t = tables[s.table]
        row_wise = ("row" in task.sharding and index[t.name] not in rules.banned and t.rows >= task.num_devices
                    and rng.random() < 1 / 3)
        if row_wise:
            new = row_wise_shards(t, task.num_devices)
        elif "column" in task.sharding and t.dim >= 8:
            k = int(rng.choice([k for k in (2, 4) if k <= min(t.dim // 4, task.num_devices)]))
            others = [d for d in rules.may_use(index[t.name]) if d != s.device]
            rng.shuffle(others)
            devices = [s.device] + others[:k - 1]
            if len(devices) < k:
                continue
            starts = np.cumsum([0] + column_widths(t.dim, k))
            new = [Shard(t.name, d, int(a), int(b)) for d, a, b in zip(devices, starts[:-1], starts[1:])]
        else:
            continue
        used = _replaced(task, rules, used, shards, s, new)
    out = Plan(plan.num_devices, tuple(shards))
    validate_plan(task, out)
    return out


def _replaced(task: Task, rules: Rules, used: list[int], shards: list[Shard], whole: Shard,
              pieces: list[Shard]) -> list[int]:
    """The devices' bytes with `whole` replaced by `pieces` in `shards` (in place) where every device holds them
    (`rules`); `used` and `shards` unchanged where not."""
    t = next(t for t in task.tables if t.name == whole.table)
    free = used.copy()
    free[whole.device] -= task.shard_bytes(t)
    for piece in pieces:
        free[piece.device] += task.shard_bytes(t, piece.num_rows(t.rows), piece.width)
    if not rules.holds(free):
        return used
    shards.remove(whole)
    shards += pieces
    return free


def row_wise_tables(task: Task, plan: Plan, rng: np.random.Generator) -> Plan:
    """`plan` with a random share (a quarter to all) of the tables it holds whole cut into TorchRec's row-wise
    blocks (block i on device i), as TorchRec's full planner cuts most tables. A table whose blocks do not fit
    stays as it was."""
    if task.num_devices < 2 or "row" not in task.sharding:
        return plan
    tables = {t.name: t for t in task.tables}
    uncut, rules, index = task.never_cut(), Rules.of_task(task), {t.name: i for i, t in enumerate(task.tables)}
    eligible = [s for s in plan.shards if s.table not in uncut and index[s.table] not in rules.banned
                and not s.is_row_range
                and s.width == tables[s.table].dim and tables[s.table].rows >= task.num_devices]
    count = int(round(rng.uniform(0.25, 1.0) * len(eligible)))
    chosen = [eligible[i] for i in sorted(rng.choice(len(eligible), size=count, replace=False))] if count else []
    used = device_memory_bytes(task, plan)
    shards = list(plan.shards)
    for s in chosen:
        used = _replaced(task, rules, used, shards, s, row_wise_shards(tables[s.table], task.num_devices))
    out = Plan(plan.num_devices, tuple(shards))
    validate_plan(task, out)
    return out


def plan_id(task: Task, plan: Plan, fingerprint: str) -> str:
    """The plan's id in the journal: its task, its shards (every field of Shard.key(); a row range, a replica and
    a cache only where a shard has one, so ids of plans without them are those the journal has always had), and
    the backend's fingerprint."""
    shards = sorted((s.table, s.device, s.col_start, s.col_end, *((s.row_start, s.row_end) if s.is_row_range else ()),
                     *(("replica",) if s.replica else ()), *(("cache", s.cache) if s.cache is not None else ()))
                    for s in plan.shards)
    text = json.dumps([task.name, [(t.name, t.dim) for t in task.tables], shards, fingerprint])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def plans_to_measure(tasks: Sequence[Task], num_plans: int, perturb_fraction: float, seed: int,
                     fingerprint: str, cut_fraction: float = 0.0, row_fraction: float = 0.0) -> list[PlanToMeasure]:
    """`num_plans` plans cycling over the tasks, a share of them perturbed, a share (`row_fraction`) with many
    tables cut into row-wise blocks (`row_wise_tables`; source "+rows") and a share of the others (`cut_fraction`)
    with a few tables cut (`cut_tables`; source "+cut"). The heuristic advances once per
    pass over the tasks (HEURISTICS' order), so with no more plans than tasks every plan is `random`'s, as at
    paper scale (100 plans, 100 training tasks). Heuristics mixed within a pass were measured there and
    dropped: policies trained from them planned no better (results/paper-today/collect_mix/)."""
    if not tasks:
        raise ValueError("no tasks to collect costs for")
    rng = np.random.default_rng(seed)
    out = []
    for k in range(num_plans):
        task = tasks[k % len(tasks)]
        name = HEURISTICS[(k // len(tasks)) % len(HEURISTICS)]
        plan = make_sharder(name, **SHARDERS[name].taken_from({"seed": seed + k})).shard(task)
        if rng.random() < perturb_fraction:
            plan = perturb(task, plan, rng, max(1, len(task.tables) // 4))
            name += "+perturbed"
        if row_fraction and rng.random() < row_fraction:
            plan = row_wise_tables(task, plan, rng)
            name += "+rows"
        elif cut_fraction and rng.random() < cut_fraction:
            plan = cut_tables(task, plan, rng)
            name += "+cut"
        out.append(PlanToMeasure(plan_id(task, plan, fingerprint), task, name, plan))
    return out


def measure_rows(backend: CostBackend, item: PlanToMeasure, extra: dict,
                 readings: Sequence[Reading]) -> tuple[dict, list[dict]]:
    """One plan row and one row per device of `item` from its `readings` (what `measure_chunk` takes in turns).

    A device's fwd and bwd are the medians of its readings on the reference device; the rows keep every reading
    (cost_ms_rounds; fwd_ms_rounds and bwd_ms_rounds, at the devices' speeds).
    """
    if not readings:
        raise ValueError(f"plan {item.plan_id}: no measurements to make rows of")
    each = [r.cost for r in readings]
    cost = median_cost(readings)
    common = {"plan_id": item.plan_id, "task_id": item.task.name, "family": item.task.family,
              "backend": cost.backend, "device_name": cost.device_name, "measured": cost.measured,
              "comm": cost.comm, **extra}
    plan_row = {**common, "source": item.source, "num_devices": item.plan.num_devices,
                "shards": json.dumps(item.plan.to_dict()["shards"]), "cost_ms": cost.cost_ms,
                "rounds": len(readings), "cost_ms_rounds": [c.cost_ms for c in each]}
    device_rows = []
    table_rows = {t.name: t.rows for t in item.task.tables}
    for d, dc in enumerate(cost.devices):
        shards = item.plan.device_shards(d)
        rows = [s.rows(table_rows[s.table]) for s in shards]
        device_rows.append({**common, "device": d, "tables": [s.table for s in shards],
                            "col_starts": [s.col_start for s in shards], "col_ends": [s.col_end for s in shards],
                            "row_starts": [r[0] for r in rows], "row_ends": [r[1] for r in rows],
                            "fwd_ms": dc.fwd_ms, "bwd_ms": dc.bwd_ms,
                            "fwd_comm_ms": dc.fwd_comm_ms, "bwd_comm_ms": dc.bwd_comm_ms,
                            "fwd_ms_rounds": [c.devices[d].fwd_ms for c in each],
                            "bwd_ms_rounds": [c.devices[d].bwd_ms for c in each]})
    return plan_row, device_rows


class CostJournal:
    """Rows measured so far, one Parquet pair per chunk, written atomically."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def _parts(self, kind: str) -> list[Path]:
        return sorted(self.folder.glob(f"{kind}-*.parquet"))

    def done_ids(self) -> set[str]:
        return {pid for p in self._parts("plans") for pid in pd.read_parquet(p, columns=["plan_id"])["plan_id"]}

    def write_chunk(self, plan_rows: list[dict], device_rows: list[dict]) -> None:
        name = hashlib.sha1("".join(r["plan_id"] for r in plan_rows).encode()).hexdigest()[:16]
        # the devices part first: a plans part present means its devices are complete
        write_parquet(pa.Table.from_pylist(device_rows), self.folder / f"devices-{name}.parquet")
        write_parquet(pa.Table.from_pylist(plan_rows), self.folder / f"plans-{name}.parquet")

    def read(self, kind: str, plan_ids: Iterable[str]) -> pd.DataFrame:
        """All journal rows of `kind` for `plan_ids`, in that order of plans."""
        order = {pid: i for i, pid in enumerate(plan_ids)}
        keys = ["plan_id"] + (["device"] if kind == "devices" else [])
        frames = [pd.read_parquet(p) for p in self._parts(kind)]
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({k: [] for k in keys})
        df = df[df["plan_id"].isin(order)].drop_duplicates(subset=keys)
        key = df["plan_id"].map(order)
        sort_cols = ["_order"] + keys[1:]
        return df.assign(_order=key).sort_values(sort_cols).drop(columns="_order").reset_index(drop=True)


def pending_chunks(items: Sequence[PlanToMeasure], done: set[str], chunk_size: int) -> list[list[PlanToMeasure]]:
    """The items not yet in the journal, a repeated plan once, cut in order into chunks of `chunk_size`.

    Deterministic: the same items, journal and chunk size give the same chunks, whoever
    measures them afterwards (so the journal's chunk files are named alike too).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size: expected an integer >= 1, got {chunk_size!r}")
    todo = list({it.plan_id: it for it in items if it.plan_id not in done}.values())
    return [todo[start:start + chunk_size] for start in range(0, len(todo), chunk_size)]


def measure_chunk(backend: CostBackend, chunk: Sequence[PlanToMeasure], extra: dict, rounds: int = 1,
                  on_plan: Callable[[], None] | None = None) -> tuple[list[dict], list[dict]]:
    """The plan rows and device rows of one chunk, in the chunk's order; writes nothing.

    Each plan is measured `rounds` times in turns (measure_rounds), so that a slow spell of the machine hits
    the chunk's plans alike; a device's costs are the medians of its readings (measure_rows). What a
    distributed worker runs: the caller journals the rows (CostJournal.write_chunk).
    """
    measured = measure_rounds(backend, [it.task for it in chunk], [it.plan for it in chunk], rounds, list,
                              on_plan=on_plan)
    plan_rows, device_rows = [], []
    for item, readings in zip(chunk, measured, strict=True):
        p, ds = measure_rows(backend, item, extra, readings)
        plan_rows.append(p)
        device_rows += ds
    return plan_rows, device_rows


def collect(backend: CostBackend, items: Sequence[PlanToMeasure], journal: CostJournal, chunk_size: int,
            extra: dict, rounds: int = 1, on_plan: Callable[[], None] | None = None) -> None:
    """Measure every item not yet in the journal, chunk by chunk, journaling each chunk at once."""
    for chunk in pending_chunks(items, journal.done_ids(), chunk_size):
        journal.write_chunk(*measure_chunk(backend, chunk, extra, rounds, on_plan))

