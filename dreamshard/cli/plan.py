"""`dreamshard plan`: a tables file planned onto devices, written as a plan file; re-planning with --previous."""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from dreamshard.cli.inputs import DEFAULT_REGIME, REGIMES, check_previous_plan, previous_shapes, read_plan_meta
from dreamshard.data.cluster import (
    CONSTRAINT_KEYS,
    Constraints,
    constraints_from_frame,
    plan_metadata,
    read_constraints_file,
    read_devices_file,
    uniform_devices,
)
from dreamshard.errors import DreamShardError
from dreamshard.io import check_output_file, is_stdout, output_argument
from dreamshard.limits import (
    MAX_BATCH_SIZE,
    MAX_DEVICES,
    MAX_SAMPLED_TABLES,
    MAX_SAMPLES,
    MAX_TABLE_DEVICES,
    MAX_TABLES,
    MAX_TIME_LIMIT,
    available_memory_bytes,
    check_limit,
    check_search_scale,
    cost_memory_bytes,
)
from dreamshard.memory import (
    BYTES_PER_WEIGHT,
    DEFAULT_BATCH_SIZE,
    DEFAULT_RESERVATION,
    GB,
    OPTIMIZER_STATE_BYTES,
    MemoryModel,
)
from dreamshard.plan import Plan, Shard, device_memory_breakdown, validate_plan
from dreamshard.provenance import provenance
from dreamshard.sharders import (
    DEFAULT_HEURISTIC,
    DEFAULT_LEARNED,
    FALLBACK,
    SHARDERS,
    default_algo,
    load_model,
    make_sharder,
    spec,
    trained_compute_device,
)
from dreamshard.sharders.replan_changes import changed_tables, describe_changes
from dreamshard.tables import read_tables_frame, tables_from_frame
from dreamshard.tasks import ALL_SHARDING_KINDS, MAX_MEMORY_GB, SHARDING_KINDS, Device, Task


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `plan` subcommand to `sub` (the `add_subparsers` of the dreamshard command)."""
    p = sub.add_parser("plan", help="plan a tables file onto N devices and write plan.json")
    p.add_argument("--tables", required=True, type=Path, help="CSV or Parquet: name, rows, dim, pooling_factor[, bin_0..bin_16]")
    p.add_argument("--devices", type=int, help="number of devices, all alike (with --memory-gb)")
    p.add_argument("--memory-gb", type=float, help="memory capacity of each device, GB (with --devices)")
    p.add_argument("--devices-file", type=Path,
                   help="CSV or JSON, one row per device: memory_gb[, kind, speed, host] (instead of --devices and "
                        "--memory-gb)")
    p.add_argument("--constraints", type=Path,
                   help="JSON: group, pin, avoid, whole (besides those columns in the tables file)")
    p.add_argument("--algo", choices=sorted(SHARDERS),
                   help=f"sharder; default: {DEFAULT_LEARNED} with --model (a dreamshard checkpoint), else "
                        f"{DEFAULT_HEURISTIC}")
    p.add_argument("-o", "--output", required=True, type=output_argument,
                   help="plan JSON to write (- : standard output, the summary then on stderr); with --format "
                        "torchrec, a file")
    p.add_argument("--seed", type=int, help="seed of randomised sharders (random, dreamshard, autoshard)")
    p.add_argument("--model", type=Path, help="checkpoint of a learned sharder (dreamshard, autoshard, neuroshard)")
    p.add_argument("--compute-device", choices=("cpu", "cuda"),
                   help="the devices the plan is for: a --model trained on other kernels' timings is refused")
    p.add_argument("--force", action="store_true", help="with --compute-device: plan with a --model of other "
                   "hardware all the same")
    p.add_argument("--samples", type=int,
                   help="dreamshard, autoshard: also sample this many plans, keep the one the cost network rates best")
    p.add_argument("--no-fallback", action="store_true",
                   help="dreamshard_cut, neuroshard: plan tables beyond the model's training range by the model alone "
                        "(default: where they lie beyond it in what the model does not fold (pooling, rows), also "
                        "by TorchRec's planner (torchrec_full), keeping the plan TorchRec's perf model rates cheaper; "
                        "the plan file's made_by.fallback says which; docs/learning.md)")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="torchrec, torchrec_full, torchrec_model: stop searching after this long and keep the best "
                        "plan found (TorchRec's timeout_seconds; our search's moves); needed past the task sizes "
                        "they take over 10 minutes for (docs/cli.md)")
    p.add_argument("--sharding", default=",".join(SHARDING_KINDS), type=sharding_kinds,
                   help="the ways tables may be cut, comma-separated: table (whole tables, always), column "
                        "(column slices), row (TorchRec's row-wise blocks), data (small tables data-parallel, "
                        "a copy on every device, by the traffic at --batch-size), host (row-wise blocks over one "
                        "host's devices, TorchRec's table_row_wise: devices files naming hosts; torchrec_model "
                        "plans them); default: table,column,row")
    p.add_argument("--uvm-caching", action="store_true",
                   help="when the tables need more than the devices hold, keep the largest in host memory with a "
                        "cache in device memory (TorchRec's fused_uvm_caching), its size from the access-count bins")
    p.add_argument("--weights-precision", default="fp32", choices=sorted(BYTES_PER_WEIGHT))
    p.add_argument("--optimizer", default="exact_sgd", choices=sorted(OPTIMIZER_STATE_BYTES),
                   help="the training optimizer: its state is counted beside the weights (default exact_sgd: none)")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                   help=f"samples per device and step (default {DEFAULT_BATCH_SIZE}, TorchRec's): the input and output "
                        "buffers TorchRec allocates at it are counted; with --previous, also the backend's batch size")
    p.add_argument("--reservation", type=float, default=DEFAULT_RESERVATION,
                   help=f"share of each device's memory kept free for the dense model and activations (default "
                        f"{DEFAULT_RESERVATION:g}, TorchRec's planner's)")
    p.add_argument("--format", default="json", choices=["json", "torchrec"],
                   help="json: DreamShard plan JSON; torchrec: a TorchRec ShardingPlan (torch.save; needs torchrec) "
                        "for the EBC at module 'ebc', see docs/torchrec.md")
    p.add_argument("--placement", choices=["cuda", "cpu"],
                   help="with --format torchrec: the ranks' devices (default cuda; cpu to try the plan on CPU ranks "
                        "with gloo, without GPUs)")
    p.add_argument("--previous", type=Path,
                   help="re-plan: a plan JSON made before the tables (or devices: only added) changed; shards stay "
                        "in place unless moving them is worth it (docs/replan.md)")
    p.add_argument("--max-moved-gb", type=float,
                   help="with --previous (required there): move at most this many GB of the previous plan's shards")
    p.add_argument("--backend", choices=["analytic", "fbgemm"],
                   help="with --previous (required there): the cost that decides what is worth moving")
    p.add_argument("--regime", choices=REGIMES,
                   help="what fusing tables does to their cost, for the estimated cost `plan` prints and records "
                        f"(default {DEFAULT_REGIME}); with --previous --backend analytic (required there), also the "
                        "cost that decides what is worth moving")
    p.add_argument("--allow-new-tables", action="store_true",
                   help="with --previous: the tables changed on purpose (added, removed, resized); without it a "
                        "previous plan of other tables is an error")
    p.set_defaults(func=cmd_plan)
    return p


def sharding_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in ALL_SHARDING_KINDS]
    if bad or "table" not in kinds or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(f"expected distinct kinds among {', '.join(ALL_SHARDING_KINDS)} including "
                                         f"'table', got {text!r}")
    return kinds


def sharder_options(args: argparse.Namespace, num_devices: int) -> dict:
    """The options of `--algo` from the command line; one it does not take is an error."""
    s = spec(args.algo)
    given = {"seed": args.seed, "samples": args.samples, "model": args.model, "time_limit": args.time_limit}
    options = {}
    for name, value in given.items():
        if value is None:
            continue
        if name not in s.options:
            raise DreamShardError(f"--{name.replace('_', '-')}: sharder {args.algo!r} takes no {name.replace('_', ' ')}")
        if name == "samples":
            check_limit(value, MAX_SAMPLES, "--samples")
        if name == "time_limit" and not 0 < value <= MAX_TIME_LIMIT:
            raise DreamShardError(f"--time-limit: expected seconds in (0, {MAX_TIME_LIMIT:g}], got {value:g}")
        if name == "model" and value.is_dir():
            raise DreamShardError(f"--model {value}: is a directory; expected a checkpoint file that training wrote "
                                  f"for {args.algo}, e.g. models/{spec(args.algo).trained_as}.pt")
        options[name] = load_model(args.algo, value) if name == "model" else value
        if name == "model":
            check_model_hardware(args, options[name])
    if "batch_size" in s.options:  # TorchRec's planner rates its candidates at the batch the memory is counted at:
        options["batch_size"] = args.batch_size * num_devices  # per device here; our sharders take the global one
    if "fallback" in s.options and not args.no_fallback:  # beyond the model's training range (sharders/fallback.py)
        options["fallback"] = make_sharder(FALLBACK, batch_size=args.batch_size * num_devices)
    elif args.no_fallback and "fallback" not in s.options:
        raise DreamShardError(f"--no-fallback: sharder {args.algo!r} has no fallback (dreamshard_cut and neuroshard do)")
    return options


def check_model_hardware(args: argparse.Namespace, model) -> None:
    """--compute-device against the hardware whose kernel timings trained the model (its checkpoint's record)."""
    trained_on = trained_compute_device(getattr(model, "meta", None))
    if args.compute_device is None or trained_on in (None, args.compute_device) or args.force:
        return
    raise DreamShardError(f"--model {args.model}: trained on {trained_on} kernel timings, but --compute-device is "
                          f"{args.compute_device}: it would plan by the wrong hardware; train one there (`make run` on "
                          "that machine), plan without --model, or add --force")


def devices_of(args: argparse.Namespace) -> tuple[Device, ...]:
    """The devices from --devices-file, or --devices N of --memory-gb M each."""
    if args.devices_file is not None:
        if args.devices is not None or args.memory_gb is not None:
            raise DreamShardError("--devices-file replaces --devices and --memory-gb; give one or the other")
        devices = read_devices_file(args.devices_file)
        check_limit(len(devices), MAX_DEVICES, f"{args.devices_file}: devices")
        return devices
    if args.devices is None or args.memory_gb is None:
        raise DreamShardError("give --devices N and --memory-gb M (devices alike), or --devices-file FILE")
    if args.devices < 1:
        raise DreamShardError(f"--devices: expected a positive integer, got {args.devices}")
    check_limit(args.devices, MAX_DEVICES, "--devices")
    if not 0 < args.memory_gb <= MAX_MEMORY_GB:
        raise DreamShardError(f"--memory-gb: expected a number in (0, {MAX_MEMORY_GB:g}], got {args.memory_gb}")
    return uniform_devices(args.devices, args.memory_gb)


def task_of(args: argparse.Namespace) -> Task:
    """The task `plan` plans: the tables file, the devices, the constraints of the tables file and --constraints."""
    devices = devices_of(args)
    check_table_count(args.tables, len(devices))
    df, places = read_tables_frame(args.tables)  # read once: the tables and their constraint columns
    tables = tables_from_frame(df, str(args.tables), places)
    constraints = constraints_from_frame(df, str(args.tables), places) if set(CONSTRAINT_KEYS) & set(df.columns) \
        else Constraints()
    if args.constraints is not None:
        constraints = constraints.merged(read_constraints_file(args.constraints), str(args.constraints))
    if not 1 <= args.batch_size <= MAX_BATCH_SIZE:
        raise DreamShardError(f"--batch-size: expected an integer in [1, {MAX_BATCH_SIZE}], got {args.batch_size}")
    if not 0 <= args.reservation < 1:
        raise DreamShardError(f"--reservation: expected a share in [0, 1), got {args.reservation}")
    memory = MemoryModel(args.weights_precision, args.optimizer, args.batch_size, args.reservation)
    task = Task(args.tables.stem, tuple(tables), devices, memory, sharding=args.sharding,
                kernels=("fused", "fused_uvm_caching") if args.uvm_caching else ("fused",))
    try:
        return constraints.apply(task)
    except ValueError as exc:
        raise DreamShardError(f"{args.constraints or args.tables}: {exc}") from None


def check_table_count(path: Path, num_devices: int) -> None:
    """Refuse, before reading it, a tables file of more than MAX_TABLES tables, or of more tables x devices than
    MAX_TABLE_DEVICES: a CSV's lines are counted (up to the limit), a Parquet file's rows read from its metadata."""
    if not path.is_file():
        return  # not there, or no regular file: reading it says what is wrong
    most = min(MAX_TABLES, MAX_TABLE_DEVICES // num_devices)
    if path.suffix == ".csv":
        lines, last = 0, b"\n"
        with open(path, "rb") as f:
            while lines <= most + 1 and (chunk := f.read(1 << 20)):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
        count = lines + (last != b"\n") - 1  # a last line without a newline; the header
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            count = pq.ParquetFile(path).metadata.num_rows
        except Exception:  # unreadable: reading it says so
            return
    else:
        return
    if count > MAX_TABLES:  # counted no further than the limit
        raise DreamShardError(f"{path}: more than {MAX_TABLES} tables, the most this tool accepts (dreamshard.limits)")
    if count > most:
        raise DreamShardError(f"{path}: more than {most} tables on {num_devices} devices; tables x devices may be at "
                              f"most {MAX_TABLE_DEVICES} (dreamshard.limits): plan fewer tables or devices")


def check_samples(samples: int | None, num_tables: int) -> None:
    """--samples x tables at most MAX_SAMPLED_TABLES: each sample places every table, so the limit bounds time."""
    if samples and samples * num_tables > MAX_SAMPLED_TABLES:
        raise DreamShardError(f"--samples: {samples} samples x {num_tables} tables = {samples * num_tables} placements "
                              f"is more than {MAX_SAMPLED_TABLES}, the most this tool accepts (dreamshard.limits); give "
                              f"at most {MAX_SAMPLED_TABLES // num_tables}")


def describe_devices(task: Task) -> str:
    kinds = Counter((d.memory_bytes, d.kind, d.speed) for d in task.devices)
    parts = [f"{n} x {mem / GB:g} GB{f' {kind}' if kind else ''}{f' speed {speed:g}' if speed != 1.0 else ''}"
             for (mem, kind, speed), n in kinds.items()]
    return f"{task.num_devices} devices ({', '.join(parts)})" if len(kinds) > 1 else \
        f"{task.num_devices} devices of {parts[0].split(' x ', 1)[1]}"


REPLAN_FLAGS = ("max_moved_gb", "backend")


def check_replan_args(args: argparse.Namespace) -> None:
    """--previous and its flags: each flag only with --previous, --max-moved-gb and --backend required there."""
    given = [f"--{name.replace('_', '-')}" for name in REPLAN_FLAGS if getattr(args, name) is not None]
    if args.previous is None:
        if args.allow_new_tables:
            given.append("--allow-new-tables")
        if given:
            raise DreamShardError(f"{', '.join(given)}: only with --previous PLAN (re-planning)")
        return
    if args.max_moved_gb is None:
        raise DreamShardError("--previous needs --max-moved-gb X: how many GB of the previous plan's shards may move")
    if not 0 <= args.max_moved_gb < float("inf"):
        raise DreamShardError(f"--max-moved-gb: expected a finite number >= 0, got {args.max_moved_gb}")
    if args.backend is None:
        raise DreamShardError("--previous needs --backend analytic|fbgemm: the cost that decides what is worth moving")
    if args.backend == "analytic" and args.regime is None:
        raise DreamShardError("--backend analytic needs --regime super_additive or sub_additive")
    if args.backend != "analytic" and args.regime is not None:
        raise DreamShardError("--regime: with --previous, only with --backend analytic (the fbgemm backend measures)")


def replan_of(args: argparse.Namespace, task: Task, sharder: Any) -> tuple[Plan, dict[str, Any], str]:
    """Re-plan from --previous: the plan, the metadata the plan file records and the line to print."""
    from dreamshard.data.lookups import GeneratedLookups
    from dreamshard.hardware import make_backend  # imports torch: only when re-planning
    from dreamshard.sharders.replan import replan

    meta, previous = read_plan_meta(args.previous, "--previous")
    check_previous_plan(previous, meta, f"--previous {args.previous}")
    if previous.num_devices > task.num_devices:
        raise DreamShardError(f"--previous {args.previous}: the plan is for {previous.num_devices} devices, but "
                              f"{task.num_devices} are given; re-planning may add devices, not remove them")
    changes = table_changes(task, previous, meta, args)
    options: dict[str, Any] = {"batch_size": args.batch_size}
    if args.backend == "analytic":
        options["regime"] = args.regime
    backend = make_backend(args.backend, GeneratedLookups(seed=0), **options)
    if args.backend == "fbgemm":
        from dreamshard.hardware.fbgemm import pin_threads

        pin_threads(backend)  # this command is the program: it sets the measurement thread count
    result = replan(task, previous, sharder, args.max_moved_gb * GB, backend,
                    previous_shapes=previous_shapes(meta, str(args.previous)))
    kind = "measured" if backend.measured else "modelled"
    record = {"previous": str(args.previous), "max_moved_gb": args.max_moved_gb,
              "moved_gb": result.moved_bytes / GB, "full_moved_gb": result.full_moved_bytes / GB,
              "cost_ms": result.cost_ms, "full_cost_ms": result.full_cost_ms, "kept_cost_ms": result.kept_cost_ms,
              "backend": backend.name, "measured": backend.measured, **changes}
    line = (f"moved {human_bytes(result.moved_bytes)} of {human_bytes(args.max_moved_gb * GB)} allowed; cost "
            f"{result.cost_ms:.3f} ms (full re-plan {result.full_cost_ms:.3f} ms moving "
            f"{human_bytes(result.full_moved_bytes)}; keeping everything {result.kept_cost_ms:.3f} ms), "
            f"{backend.name} {kind}")
    if any(changes.values()):
        line += f"\ntables since the previous plan: {describe_changes(changes, everyone=True)}"
    return result.plan, record, line


BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float) -> str:
    """`n` bytes as people read them: whole bytes below 1 KiB, else three significant digits of the largest binary
    unit below it (GB in this tool's options is 1024^3 bytes: --max-moved-gb 0.5 is 512 MiB)."""
    if n < 1024:
        return f"{n:.0f} B"
    for unit in BYTE_UNITS:
        n /= 1024
        if n < 1024 or unit == BYTE_UNITS[-1]:
            break
    return f"{n:.3g} {unit}" if n < 1000 else f"{n:.0f} {unit}"


def table_changes(task: Task, previous: Plan, meta: Any, args: argparse.Namespace) -> dict[str, list[str]]:
    """The tables added, removed and resized since --previous; any is an error without --allow-new-tables."""
    changes = changed_tables(task, previous, previous_shapes(meta, str(args.previous)))
    if any(changes.values()) and not args.allow_new_tables:
        raise DreamShardError(f"--previous {args.previous}: made for other tables than {args.tables} "
                              f"({describe_changes(changes)}); give --allow-new-tables if these changes are intended")
    return changes


ESTIMATE_MAX_BYTES = 2**30  # plan's estimate costs plans whose costing takes at most this (limits.cost_memory_bytes)


def estimate(task: Task, plan: Plan, regime: str) -> tuple[dict[str, Any] | None, str]:
    """The plan's cost as the analytic backend models it at the plan's batch (what `dreamshard measure --backend
    analytic` prints for it), as the plan file records it, and the line saying it; None for a plan too large to cost
    here in a moment."""
    from dreamshard.hardware.analytic import AnalyticBackend, AnalyticConfig

    batch = max(task.memory.batch_size, 1)
    needed = cost_memory_bytes(task.num_devices, len(task.tables), batch)
    if needed > min(ESTIMATE_MAX_BYTES, available_memory_bytes()):
        return None, (f"estimated cost: not computed for {task.num_devices} devices x {len(task.tables)} tables "
                      f"(costing takes about {needed / 2**30:.1f} GiB); `dreamshard measure` costs it")
    backend = AnalyticBackend(AnalyticConfig(regime=regime, batch_size=batch))
    on: list[list[Shard]] = [[] for _ in range(plan.num_devices)]
    for s in plan.shards:
        on[s.device].append(s)
    cost = backend.plan_cost_from(task, plan, [backend.compute_cost(task, shards) for shards in on])
    record = {"backend": "analytic", "regime": regime, "batch_size": batch, "measured": False,
              "cost_ms": cost.cost_ms, "device_ms": [d.total_ms for d in cost.devices]}
    return record, (f"estimated cost: {cost.cost_ms:.3f} ms per step, the slowest device's (analytic model, {regime} "
                    f"regime, batch {batch}: not measured; `dreamshard measure --backend fbgemm` measures)")


def plan_inputs(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """The files `plan` reads, by option: none may be its output."""
    return [("--tables", args.tables), ("--devices-file", args.devices_file), ("--constraints", args.constraints),
            ("--previous", args.previous), ("--model", args.model)]


def cmd_plan(args: argparse.Namespace) -> None:
    if args.algo is None:
        args.algo = default_algo(args.model is not None)
    if args.placement is not None and args.format != "torchrec":
        raise DreamShardError("--placement: only with --format torchrec (where the plan places its ranks)")
    check_replan_args(args)
    check_output_file(args.output, "-o", plan_inputs(args), stdout=args.format == "json")
    say = sys.stderr if is_stdout(args.output) else sys.stdout  # `-o -`: stdout holds the plan, the summary goes aside
    task = task_of(args)
    tables = list(task.tables)
    check_samples(args.samples, len(tables))
    check_search_scale(args.algo, len(tables), task.num_devices, args.time_limit is not None)
    options = sharder_options(args, task.num_devices)
    sharder = make_sharder(args.algo, **options)
    replanned = replan_of(args, task, sharder) if args.previous is not None else None
    plan = sharder.shard(task) if replanned is None else replanned[0]
    validate_plan(task, plan)
    cost, cost_line = estimate(task, plan, args.regime or DEFAULT_REGIME)
    if args.format == "torchrec":
        from dreamshard.interop.torchrec import save_torchrec_plan  # imports torchrec: only for this format

        save_torchrec_plan(task, plan, args.output, device_type=args.placement or "cuda")
    else:
        shapes = {t.name: [t.rows, t.dim] for t in tables}  # what a later re-plan (--previous) tells changes by
        made_by = provenance(args.algo, args.model, options.get("model"), task, sharder)
        plan.save_json(args.output, option="-o", algorithm=args.algo, tables_file=str(args.tables),
                       **plan_metadata(task), table_shapes=shapes, made_by=made_by,
                       **({} if cost is None else {"estimate": cost}),
                       **({} if replanned is None else {"replan": replanned[1]}))
    memory = device_memory_breakdown(task, plan)
    print(f"{args.algo}: {len(tables)} tables on {describe_devices(task)} -> {args.output}", file=say)
    if replanned is not None:
        print(replanned[2], file=say)
    print(cost_line, file=say)
    lacking = [t.name for t in tables if t.bins is None]
    estimator = getattr(sharder, "bins", None)  # learned sharders: the BinEstimator of tables without bins
    if lacking and estimator is not None:
        print(f"access-count bins ESTIMATED for {len(lacking)} of {len(tables)} tables (no bin_* in the tables "
              f"file): Zipf exponent {estimator.zipf_exponent:.3f} fitted on {estimator.fitted_on} (mean L1 error "
              f"{estimator.l1_error:.3f}); measure them with `dreamshard profile` for better plans", file=say)
    by_name = {t.name: t for t in tables}
    print(f"memory (GB) as TorchRec allocates it: {task.memory.optimizer} state, buffers at batch "
          f"{task.memory.batch_size} per device, {task.memory.reservation:.0%} of each device reserved", file=say)
    print(f"{'device':>6} {'shards':>6} {'dim_sum':>8} {'weights':>9} {'optimizer':>9} {'buffers':>9} {'headroom':>9} "
          f"{'usable':>9}  kinds", file=say)
    on: list[list[Shard]] = [[] for _ in range(plan.num_devices)]
    for s in plan.shards:
        on[s.device].append(s)
    for d, shards in enumerate(on):
        dim_sum = sum(s.width for s in shards if not s.replica)  # what the all-to-all sends
        kinds = Counter(s.kind(by_name[s.table].rows, by_name[s.table].dim) for s in shards)
        cached = sum(1 for s in shards if s.cache is not None)
        if cached:
            kinds["cached"] = cached
        m = memory[d]
        print(f"{d:>6} {len(shards):>6} {dim_sum:>8} {m.weights / GB:>9.4f} {m.optimizer / GB:>9.4f} "
              f"{m.buffers / GB:>9.4f} {m.headroom / GB:>9.4f} {m.capacity / GB:>9.4f}  "
              + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())), file=say)
    print("dim_sum: the columns of the device's shards, what its forward all-to-all sends per sample (replicas send "
          "none); kinds: how many shards of each kind (table: whole tables, column, row, row+column: cut pieces, "
          "data: data-parallel replicas, cached: UVM-cached); docs/cli.md", file=say)
