"""`dreamshard report`: one plan costed as `dreamshard measure` costs it, beside its lower bound, written as an HTML
page and a PNG (dreamshard.evaluation.plan_report makes them; docs/report.md)."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from dreamshard.cli.inputs import DEFAULT_REGIME, add_plan_measure_arguments, measuring_backend, planned_task
from dreamshard.errors import DreamShardError
from dreamshard.evaluation.plan_report import EITHER_REGIME, build_report, write_report
from dreamshard.io import check_output_file, is_stdout, output_argument, same_file


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `report` subcommand to `sub` (the `add_subparsers` of the dreamshard command)."""
    p = sub.add_parser("report", help="write an HTML report and a PNG figure of a plan's costs and memory",
                       description="Cost a plan as `dreamshard measure` does and write an HTML page (self-contained) "
                                   "and a PNG: per-device forward, backward and communication time against the "
                                   "plan's lower bound, memory used against capacity, the shards of each device. "
                                   "See docs/report.md.")
    add_plan_measure_arguments(p, "analytic: what fusing tables does to their cost (default: the regime of the "
                                  f"estimate the plan file records, else {DEFAULT_REGIME}). fbgemm: the regime "
                                  "measured on this machine, for the lower bound (default: the bound valid in either "
                                  "regime)")
    p.add_argument("-o", "--output", required=True, type=output_argument,
                   help="HTML file to write (- : standard output, with --png naming the PNG's file)")
    p.add_argument("--png", type=output_argument,
                   help="PNG file to write (default: the HTML file's name with .png); a file, never -")
    p.set_defaults(func=cmd_report)
    return p


def cmd_report(args: argparse.Namespace) -> None:
    from dreamshard.evaluation.bounds import EITHER, column_splits_in, lower_bound, row_splits_of
    from dreamshard.hardware import Topology  # imports torch: only when reporting

    if is_stdout(args.output) and args.png is None:
        raise DreamShardError("-o -: the page goes to standard output; give --png FILE for its figure")
    png_path = args.png if args.png is not None else args.output.with_suffix(".png")
    inputs = [("--tables", args.tables), ("--plan", args.plan), ("--devices-file", args.devices_file)]
    check_output_file(args.output, "-o", inputs, stdout=True)
    check_output_file(png_path, "--png", inputs)
    if not is_stdout(args.output) and same_file(args.output, png_path):
        raise DreamShardError(f"-o {args.output}: the page would overwrite the PNG; give an .html name or --png")
    task, plan, regime_line = planned_task(args)  # the task and plan as `dreamshard measure` rebuilds them
    topology = Topology()
    backend = measuring_backend(args, topology)
    cost = backend.plan_cost(task, plan)
    if args.regime is not None:
        bound_regime, described = args.regime, args.regime
    else:  # fbgemm, regime not measured: min(fused / N, super-additive bound) holds in either
        bound_regime, described = EITHER, EITHER_REGIME
    bound = lower_bound(backend, task, bound_regime, column_splits=column_splits_in(task, [plan]),
                        row_splits=row_splits_of(task, [plan]) or None)
    sources = [("plan file", str(args.plan)), ("tables file", str(args.tables))]
    if args.devices_file is not None:
        sources.append(("devices file", str(args.devices_file)))
    report = build_report(task, plan, cost, bound, args.batch_size, described, sources)
    write_report(report, args.output, png_path)
    say = sys.stderr if is_stdout(args.output) else sys.stdout  # `-o -`: stdout holds the page
    if regime_line is not None:
        print(regime_line, file=say)
    print(f"report: {cost.backend} ({report.measured_label}), cost {report.cost_ms:.3f} ms, lower bound "
          f"{bound.total_ms:.3f} ms ({report.cost_over_bound:.2f}x) -> {args.output}, {png_path}", file=say)
