"""The `dreamshard` command."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dreamshard.errors import DreamShardError
from dreamshard.memory import BYTES_PER_WEIGHT, GB, OPTIMIZER_STATE_BYTES, MemoryModel
from dreamshard.plan import device_memory_bytes, validate_plan
from dreamshard.sharders import SHARDERS, make_sharder
from dreamshard.tables import read_tables_file
from dreamshard.tasks import Task


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dreamshard", description="Place embedding tables on devices.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("plan", help="plan a tables file onto N devices and write plan.json")
    p.add_argument("--tables", required=True, type=Path, help="CSV or Parquet: name, rows, dim, pooling_factor[, bin_0..bin_16]")
    p.add_argument("--devices", required=True, type=int, help="number of devices")
    p.add_argument("--memory-gb", required=True, type=float, help="memory capacity of each device, GB")
    p.add_argument("--algo", required=True, choices=sorted(SHARDERS), help="sharder")
    p.add_argument("-o", "--output", required=True, type=Path, help="plan JSON to write")
    p.add_argument("--seed", type=int, default=0, help="seed of randomised sharders")
    p.add_argument("--weights-precision", default="fp32", choices=sorted(BYTES_PER_WEIGHT))
    p.add_argument("--optimizer", default="exact_sgd", choices=sorted(OPTIMIZER_STATE_BYTES))
    p.set_defaults(func=cmd_plan)
    return parser


def cmd_plan(args: argparse.Namespace) -> None:
    tables = read_tables_file(args.tables)
    if args.devices < 1:
        raise DreamShardError(f"--devices: expected a positive integer, got {args.devices}")
    if not args.memory_gb > 0:
        raise DreamShardError(f"--memory-gb: expected a positive number, got {args.memory_gb}")
    task = Task.uniform(args.tables.stem, tables, args.devices, args.memory_gb,
                        MemoryModel(args.weights_precision, args.optimizer))
    plan = make_sharder(args.algo, seed=args.seed).shard(task)
    validate_plan(task, plan)
    plan.save_json(args.output, algorithm=args.algo, tables_file=str(args.tables),
                   memory_gb=args.memory_gb, weights_precision=args.weights_precision, optimizer=args.optimizer)
    used = device_memory_bytes(task, plan)
    print(f"{args.algo}: {len(tables)} tables on {args.devices} devices of {args.memory_gb:g} GB -> {args.output}")
    print(f"{'device':>6} {'tables':>6} {'dim_sum':>8} {'memory_gb':>10}")
    for d in range(args.devices):
        shards = plan.device_shards(d)
        dim_sum = sum(s.col_end - s.col_start for s in shards)
        print(f"{d:>6} {len(shards):>6} {dim_sum:>8} {used[d] / GB:>10.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (DreamShardError, ValueError, OSError) as exc:
        print(f"dreamshard: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
