"""What `dreamshard measure` and `dreamshard report` share: the plan file's task rebuilt, and the backend that costs it.

Both read a tables file and a plan file, rebuild the task the plan was made for (the devices, memory model,
sharding kinds and constraints the plan records: dreamshard.data.cluster.task_from_plan, or the devices given
instead), check the plan against it, and cost it with a backend built from the same options.
`dreamshard plan --previous` reads its plan file with the same `read_plan_file` and `previous_shapes`.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dreamshard.data.cluster import read_devices_file, task_from_plan
from dreamshard.errors import DataFormatError, DreamShardError, InvalidPlanError
from dreamshard.limits import MAX_DEVICES, check_limit, check_memory, cost_memory_bytes
from dreamshard.plan import Plan, device_memory_bytes, read_plan_json, validate_plan
from dreamshard.tables import Table, read_tables_file
from dreamshard.tasks import Task

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
EVAL_METRICS = Path("metrics/eval.json")  # where the evaluate stage records the fusion regime it measured
PARAMS = Path("params.yaml")  # the pipeline's parameters: backend.analytic.regime


def check_regime(args: argparse.Namespace) -> None:
    if args.backend == "analytic" and args.regime is None:
        raise DreamShardError("--backend analytic needs --regime super_additive or sub_additive")


def default_regime(args: argparse.Namespace) -> str | None:
    """--backend analytic without --regime: set args.regime to the regime the evaluate stage measured
    (metrics/eval.json in the current directory), else to params.yaml's backend.analytic.regime there, and return
    the line saying which and why; neither there is an error. None when nothing was chosen."""
    if args.backend != "analytic" or args.regime is not None:
        return None
    measured = _measured_regime(EVAL_METRICS)
    if measured is not None and measured[0] in REGIMES:
        args.regime = measured[0]
        return f"regime {args.regime}: measured with {measured[1]} ({EVAL_METRICS}); --regime to choose"
    aside = f"; {EVAL_METRICS} records {measured[0]}, measured with {measured[1]}" if measured is not None else ""
    default = _params_regime(PARAMS)
    if default is None:
        raise DreamShardError(f"--backend analytic needs --regime super_additive or sub_additive: no {EVAL_METRICS} "
                              f"or {PARAMS} here to take it from{aside} (`python -m benchmarks.cpu_kernels` "
                              "measures it on this machine)")
    args.regime = default
    return f"regime {args.regime}: {PARAMS}'s backend.analytic.regime, not measured{aside}; --regime to choose"


def _measured_regime(path: Path) -> tuple[str, str] | None:
    """(regime, the backend and device that measured it) as the evaluate stage records them, if it measured one
    (real kernels: a regime the analytic backend was given is no measurement)."""
    if not path.is_file():
        return None
    try:
        metrics = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{path}: not valid JSON ({exc}); give --regime") from None
    additivity = metrics.get("additivity") if isinstance(metrics, dict) else None
    regime = additivity.get("regime") if isinstance(additivity, dict) else None
    if not isinstance(regime, str) or metrics.get("measured") is not True:
        return None
    return regime, f"{metrics.get('backend', 'an unnamed backend')} on {metrics.get('device', 'an unnamed device')}"


def _params_regime(path: Path) -> str | None:
    """backend.analytic.regime of a params file, if it has one; a value not among REGIMES is an error."""
    import yaml

    if not path.is_file():
        return None
    try:
        params = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{path}: not valid YAML ({' '.join(str(exc).split())}); give --regime") from None
    node: Any = params
    for key in ("backend", "analytic", "regime"):
        node = node.get(key) if isinstance(node, dict) else None
    if node is None:
        return None
    if node not in REGIMES:
        raise DataFormatError(f"{path}: backend.analytic.regime: expected one of {', '.join(REGIMES)}, got {node!r}")
    return str(node)


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
    return {str(k): (v[0], v[1]) for k, v in shapes.items()}


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


def planned_task(args: argparse.Namespace) -> tuple[Task, Plan]:
    """The task the plan file was made for and the plan, checked against it; refused before costing when costing
    it would need more memory than the machine has."""
    tables = read_tables_file(args.tables)
    meta = read_plan_file(args.plan, "--plan")  # the plan and the settings it was made under
    plan = Plan.from_dict(meta, str(args.plan))
    if args.batch_size is None:  # measure at the batch the plan was made to train with
        recorded = meta.get("batch_size") if isinstance(meta, dict) else None
        args.batch_size = recorded if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0 \
            else UNRECORDED_BATCH_SIZE
    if args.batch_size < 1:
        raise DreamShardError(f"--batch-size: expected a positive integer, got {args.batch_size}")
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
    return task, plan


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
