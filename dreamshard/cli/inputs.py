"""What `dreamshard measure` and `dreamshard report` share: the plan file's task rebuilt, and the backend that costs it.

Both read a tables file and a plan file, rebuild the task the plan was made for (the devices, memory model,
sharding kinds and constraints the plan records: dreamshard.data.cluster.task_from_plan, or the devices given
instead), check the plan against it, and cost it with a backend built from the same options.
`dreamshard plan --previous` reads its plan file with the same `read_plan_meta` (warnings, batch_size) and
`previous_shapes`, and checks it with `check_previous_plan`.
"""
from __future__ import annotations

import argparse
import sys
import unicodedata
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dreamshard.data.cluster import read_devices_file, task_from_plan
from dreamshard.errors import DataFormatError, DreamShardError, InvalidPlanError
from dreamshard.limits import MAX_BATCH_SIZE, MAX_DEVICES, check_limit, check_memory, cost_memory_bytes
from dreamshard.plan import (
    PLAN_KEYS,
    SHARD_KEYS,
    Plan,
    Shard,
    check_cover,
    device_memory_bytes,
    read_plan_json,
    unknown_plan_keys,
    validate_plan,
)
from dreamshard.provenance import tool_version
from dreamshard.tables import Table, read_tables_file
from dreamshard.tasks import MAX_MEMORY_GB, Task

UNRECORDED_BATCH_SIZE = 2048  # what plans that record no batch size are measured at


def add_plan_measure_arguments(p: argparse.ArgumentParser, regime_help: str) -> None:
    """The options naming a plan and how to cost it."""
    p.add_argument("--tables", required=True, type=Path, help="the tables file the plan was made for")
    p.add_argument("--plan", required=True, type=Path, help="plan JSON (from `dreamshard plan`)")
    p.add_argument("--backend", required=True, choices=["fbgemm", "analytic"], help="fbgemm: real kernels; analytic: a model")
    p.add_argument("--regime", choices=REGIMES, help=regime_help)
    p.add_argument("--memory-gb", type=float, help="device memory, GB (default: the devices the plan records)")
    p.add_argument("--devices-file", type=Path, help="devices file (default: the devices the plan records)")
    p.add_argument("--batch-size", type=int,
                   help="samples per device the operators run (default: the batch the plan records, the one it was "
                        f"planned to train with; {UNRECORDED_BATCH_SIZE} for a plan that records none)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="fbgemm: where the kernels run")
    p.add_argument("--threads", type=int, default=1, help="fbgemm on cpu: threads")
    p.add_argument("--iterations", type=int, default=10, help="fbgemm: timed iterations (median reported)")
    p.add_argument("--seed", type=int, default=0, help="seed of the lookups generated from the statistics")


REGIMES = ("super_additive", "sub_additive")
# the regime the analytic backend models when none is chosen or recorded: the one this project measured with the
# real kernels (fbgemm on CPU: metrics/eval.json's additivity), and the one params.yaml gives the pipeline
DEFAULT_REGIME = "super_additive"


def check_regime(args: argparse.Namespace) -> None:
    if args.backend == "analytic" and args.regime is None:
        raise DreamShardError("--backend analytic needs --regime super_additive or sub_additive")


def default_regime(args: argparse.Namespace, meta: Any) -> str | None:
    """--backend analytic without --regime: set args.regime to the regime of the estimate the plan file records
    (`dreamshard plan` costs every plan it writes), else to DEFAULT_REGIME, and return the line saying which: the
    same wherever the command runs. None when nothing was chosen."""
    if args.backend != "analytic" or args.regime is not None:
        return None
    recorded = meta.get("estimate") if isinstance(meta, dict) else None
    regime = recorded.get("regime") if isinstance(recorded, dict) else None
    if regime in REGIMES:
        args.regime = regime
        return f"regime {regime}: the one {args.plan}'s estimate used; --regime to choose"
    args.regime = DEFAULT_REGIME
    return (f"regime {DEFAULT_REGIME}: the default ({args.plan} records no estimate); --regime to choose "
            "(`python -m benchmarks.cpu_kernels` measures yours)")


def read_plan_meta(path: Path, option: str) -> tuple[Any, Plan]:
    """The plan file at `path`, given as `option`: its JSON and its plan, the plan's batch_size checked. Keys no
    plan has, and a plan written by another version of the tool, are a warning on stderr that names them."""
    meta = read_plan_file(path, option)
    plan = Plan.from_dict(meta, f"{option} {path}")
    unknown = unknown_plan_keys(meta)
    if unknown:
        warn(f"{option} {path}: unknown key(s) {_names(unknown)} ignored; a plan file has "
             f"{', '.join(PLAN_KEYS)}, and its shards {', '.join(SHARD_KEYS)}")
    made_by = meta.get("made_by")
    written = made_by.get("version") if isinstance(made_by, dict) else None
    mine = tool_version()
    if isinstance(written, str) and written != mine and "unknown" not in (written + mine):
        warn(f"{option} {path}: written by dreamshard {written}, read by {mine}; if it is misread, re-plan with "
             "this version")
    batch = meta.get("batch_size")
    if "batch_size" in meta and (isinstance(batch, bool) or not isinstance(batch, int)
                                 or not 1 <= batch <= MAX_BATCH_SIZE):
        raise DataFormatError(f"{option} {path}: batch_size: expected an integer in [1, {MAX_BATCH_SIZE}] (the "
                              f"samples per device it was planned for), got {batch!r}")
    return meta, plan


def warn(message: str) -> None:
    """A warning: one line on stderr, the command goes on."""
    print(f"dreamshard: warning: {message}", file=sys.stderr)


def check_previous_plan(previous: Plan, meta: Any, origin: str) -> None:
    """A --previous plan is a plan of the tables it records (table_shapes): every shard of one of them, each
    placed exactly once (plans written before table_shapes: shards are checked against the tables they meet)."""
    shapes = previous_shapes(meta, origin)
    if shapes is None:
        return
    placed: dict[str, list[Shard]] = defaultdict(list)
    for s in previous.shards:
        if s.table not in shapes:
            raise DataFormatError(f"{origin}: a shard of table {s.table!r}, which the plan's table_shapes does not "
                                  "record; not a plan `dreamshard plan` wrote")
        placed[s.table].append(s)
    for name, (rows, dim) in shapes.items():
        if name not in placed:
            raise DataFormatError(f"{origin}: table {name!r} (table_shapes) has no shard; not a whole plan")
        try:
            check_cover(Table(name, rows, dim, 0.0), placed[name], previous.num_devices)
        except (InvalidPlanError, ValueError) as exc:
            raise DataFormatError(f"{origin}: {exc}") from None


def read_plan_file(path: Path, option: str) -> Any:
    """The parsed plan JSON at `path`; a binary file (a `--format torchrec` plan, a checkpoint) is an error
    saying what `option` expects, instead of a JSON decoder's complaint about byte 0x80."""
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise DataFormatError(f"{option} {path}: a binary file (a --format torchrec plan?), but {option} expects a "
                              "plan JSON; write one with `dreamshard plan --format json` (the default)") from None
    except (FileNotFoundError, IsADirectoryError):
        pass  # read_plan_json says so
    return read_plan_json(path)


def previous_shapes(meta: Any, origin: str) -> dict[str, tuple[int, int]] | None:
    """The (rows, dim) of each table a plan file records (plans written before they did: None)."""
    shapes = meta.get("table_shapes") if isinstance(meta, dict) else None
    if shapes is None:
        return None
    if not isinstance(shapes, dict) or not all(
            isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
            for v in shapes.values()):
        raise DataFormatError(f"{origin}: table_shapes: expected an object table -> [rows, dim], got {shapes!r}")
    out: dict[str, tuple[int, int]] = {}
    for k, v in shapes.items():
        name = unicodedata.normalize("NFC", str(k))
        if name in out:
            raise DataFormatError(f"{origin}: table_shapes: {k!r} and another key are the same name in two Unicode "
                                  "spellings (NFC and NFD)")
        out[name] = (v[0], v[1])
    return out


def _names(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check_same_tables(tables: Sequence[Table], meta: Any, args: argparse.Namespace) -> None:
    """The tables file's tables are those the plan records (table_shapes), each with the same rows and dim."""
    shapes = previous_shapes(meta, str(args.plan))
    if shapes is None:
        return
    redo = f"re-plan with `dreamshard plan` (--previous {args.plan} to move little)"
    for t in tables:
        if t.name in shapes and shapes[t.name] != (t.rows, t.dim):
            rows, dim = shapes[t.name]
            raise DataFormatError(f"{args.tables}: table {t.name!r} has {t.rows} rows x dim {t.dim}, but the plan "
                                  f"{args.plan} was made for {rows} rows x dim {dim}; {redo}")
    added = [t.name for t in tables if t.name not in shapes]
    removed = sorted(set(shapes) - {t.name for t in tables})
    if added or removed:
        which = "; ".join(f"{what} {_names(names)}" for what, names in (("not in the plan:", added),
                                                                       ("planned but not in the file:", removed))
                          if names)
        raise DataFormatError(f"{args.tables}: other tables than the plan {args.plan} was made for ({which}); {redo}")


def planned_task(args: argparse.Namespace) -> tuple[Task, Plan, str | None]:
    """The task the plan file was made for and the plan, checked against it, and the line saying which regime the
    analytic backend models (default_regime; None when given); refused before costing when costing it would need
    more memory than the machine has."""
    if args.devices_file is not None and args.memory_gb is not None:
        raise DreamShardError("--devices-file replaces --memory-gb; give one or the other")
    if args.memory_gb is not None and not 0 < args.memory_gb <= MAX_MEMORY_GB:
        raise DreamShardError(f"--memory-gb: expected a number in (0, {MAX_MEMORY_GB:g}], got {args.memory_gb}")
    tables = read_tables_file(args.tables)
    meta, plan = read_plan_meta(args.plan, "--plan")  # the plan and the settings it was made under
    regime_line = default_regime(args, meta)
    if args.batch_size is None:  # measure at the batch the plan was made to train with
        args.batch_size = meta.get("batch_size", UNRECORDED_BATCH_SIZE)
    if not 1 <= args.batch_size <= MAX_BATCH_SIZE:
        raise DreamShardError(f"--batch-size: expected an integer in [1, {MAX_BATCH_SIZE}], got {args.batch_size}")
    check_limit(plan.num_devices, MAX_DEVICES, f"{args.plan}: num_devices")
    check_same_tables(tables, meta, args)
    task = task_from_plan(args.tables.stem, tables, meta, plan.num_devices, str(args.plan), args.memory_gb,
                          read_devices_file(args.devices_file) if args.devices_file is not None else None)
    try:
        validate_plan(task, plan)
    except InvalidPlanError as exc:
        raise InvalidPlanError(f"{args.plan}: not a plan of the tables in {args.tables} on these devices: {exc}; "
                               "re-plan with `dreamshard plan`") from None
    check_memory(costing_bytes(task, plan, args), f"costing {args.plan} ({plan.num_devices} devices, "
                                                  f"{len(task.tables)} tables)")
    return task, plan, regime_line


def costing_bytes(task: Task, plan: Plan, args: argparse.Namespace) -> int:
    """What costing `plan` would allocate (dreamshard.limits.cost_memory_bytes): fbgemm holds one device's
    weights and optimizer state at a time."""
    by_name = {t.name: t for t in task.tables}
    lookups = [0.0] * plan.num_devices
    for s in plan.shards:
        t = by_name[s.table]
        lookups[s.device] += t.pooling_factor * s.num_rows(t.rows) / t.rows
    weights = max(device_memory_bytes(task, plan)) if args.backend == "fbgemm" else 0
    return cost_memory_bytes(plan.num_devices, len(task.tables), args.batch_size, lookups, weights)


def measuring_backend(args: argparse.Namespace, topology: Any = None) -> Any:
    """The backend the options name, its thread count set: this command is the program."""
    from dreamshard.data.lookups import GeneratedLookups
    from dreamshard.hardware import make_backend  # imports torch: only when measuring
    from dreamshard.hardware.fbgemm import pin_threads

    check_regime(args)
    options: dict[str, Any] = {"batch_size": args.batch_size}
    if args.backend == "fbgemm":
        options.update(device=args.device, threads=args.threads, iterations=args.iterations)
    else:
        options.update(regime=args.regime)
    backend = make_backend(args.backend, GeneratedLookups(seed=args.seed), topology=topology, **options)
    pin_threads(backend)
    return backend
