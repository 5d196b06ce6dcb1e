"""What `dreamshard measure` and `dreamshard report` share: the plan file's task rebuilt, and the backend that costs it.

Both read a tables file and a plan file, rebuild the task the plan was made for (the devices, memory model,
sharding kinds and constraints the plan records: dreamshard.cluster.task_from_plan, or the devices given
instead), check the plan against it, and cost it with a backend built from the same options.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dreamshard.cluster import read_devices_file, task_from_plan
from dreamshard.errors import DreamShardError
from dreamshard.plan import Plan, read_plan_json, validate_plan
from dreamshard.tables import read_tables_file
from dreamshard.tasks import Task


def add_plan_measure_arguments(p: argparse.ArgumentParser, regime_help: str) -> None:
    """The options naming a plan and how to cost it."""
    p.add_argument("--tables", required=True, type=Path, help="the tables file the plan was made for")
    p.add_argument("--plan", required=True, type=Path, help="plan JSON (from `dreamshard plan`)")
    p.add_argument("--backend", required=True, choices=["fbgemm", "analytic"], help="fbgemm: real kernels; analytic: a model")
    p.add_argument("--regime", choices=["super_additive", "sub_additive"], help=regime_help)
    p.add_argument("--memory-gb", type=float, help="device memory, GB (default: the devices the plan records)")
    p.add_argument("--devices-file", type=Path, help="devices file (default: the devices the plan records)")
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="fbgemm: where the kernels run")
    p.add_argument("--threads", type=int, default=1, help="fbgemm on cpu: threads")
    p.add_argument("--iterations", type=int, default=10, help="fbgemm: timed iterations (median reported)")
    p.add_argument("--seed", type=int, default=0, help="seed of the lookups generated from the statistics")


def check_regime(args: argparse.Namespace) -> None:
    if args.backend == "analytic" and args.regime is None:
        raise DreamShardError("--backend analytic needs --regime super_additive or sub_additive")


def planned_task(args: argparse.Namespace) -> tuple[Task, Plan]:
    """The task the plan file was made for and the plan, checked against it."""
    tables = read_tables_file(args.tables)
    meta = read_plan_json(args.plan)  # the plan and the settings it was made under
    plan = Plan.from_dict(meta, str(args.plan))
    task = task_from_plan(args.tables.stem, tables, meta, plan.num_devices, str(args.plan), args.memory_gb,
                          read_devices_file(args.devices_file) if args.devices_file is not None else None)
    validate_plan(task, plan)
    return task, plan


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
