"""`dreamshard measure`: a plan of a tables file costed with a backend, per device, as a table or JSON."""
from __future__ import annotations

import argparse
from typing import Any

from dreamshard.cli.inputs import DEFAULT_REGIME, add_plan_measure_arguments, measuring_backend, planned_task
from dreamshard.errors import DreamShardError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `measure` subcommand to `sub` (the `add_subparsers` of the dreamshard command)."""
    p = sub.add_parser("measure", help="measure a plan of a tables file with a cost backend")
    add_plan_measure_arguments(p, "analytic: what fusing tables does to their cost; real kernels differ between "
                                  "processors (default: the regime of the estimate the plan file records, else "
                                  f"{DEFAULT_REGIME})")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_measure)
    return p


def cmd_measure(args: argparse.Namespace) -> None:
    import json

    from dreamshard.hardware.comm import forward_wait_ms

    if args.backend != "analytic" and args.regime is not None:
        raise DreamShardError(f"--regime: only with --backend analytic (the {args.backend} backend measures; it has "
                              "no regime to choose)")
    task, plan_obj, regime_line = planned_task(args)
    cost = measuring_backend(args).plan_cost(task, plan_obj)
    # the modelled forward all-to-all waits for the slowest device's forward compute: that wait, apart from transfer
    waits = forward_wait_ms([d.fwd_ms for d in cost.devices]) if cost.comm == "model" else None
    devices = [{"fwd_ms": d.fwd_ms, "bwd_ms": d.bwd_ms, "fwd_comm_ms": d.fwd_comm_ms, "bwd_comm_ms": d.bwd_comm_ms}
               for d in cost.devices]
    # each device's communication in parts (fwd_comm_ms = fwd_wait_ms + fwd_transfer_ms): a list of its own, so that
    # the devices' entries still sum to their totals
    split = None if waits is None else [
        {"fwd_wait_ms": float(w), "fwd_transfer_ms": max(0.0, d.fwd_comm_ms - float(w)),
         "bwd_transfer_ms": d.bwd_comm_ms} for d, w in zip(cost.devices, waits)]
    if args.json:
        print(json.dumps({"cost_ms": cost.cost_ms, "backend": cost.backend, "device": cost.device_name,
                          "measured": cost.measured, "comm": cost.comm, "batch_size": args.batch_size,
                          "regime": args.regime, "regime_chosen": regime_line, "devices": devices,
                          "comm_split": split}, indent=2))
        return
    if regime_line is not None:
        print(regime_line)
    kind = "measured" if cost.measured else "modelled, not measured"
    print(f"{cost.backend} on {cost.device_name} ({kind}), batch {args.batch_size}, communication: {cost.comm}")
    if split is None:
        print(f"{'device':>6} {'fwd_ms':>9} {'bwd_ms':>9} {'fwd_comm':>9} {'bwd_comm':>9} {'total':>9}")
        for d, dc in enumerate(cost.devices):
            print(f"{d:>6} {dc.fwd_ms:>9.3f} {dc.bwd_ms:>9.3f} {dc.fwd_comm_ms:>9.3f} {dc.bwd_comm_ms:>9.3f} "
                  f"{dc.total_ms:>9.3f}")
    else:
        print(f"{'device':>6} {'fwd_ms':>9} {'bwd_ms':>9} {'fwd_wait':>9} {'fwd_xfer':>9} {'bwd_xfer':>9} "
              f"{'total':>9}")
        for d, (dc, row) in enumerate(zip(cost.devices, split)):
            print(f"{d:>6} {dc.fwd_ms:>9.3f} {dc.bwd_ms:>9.3f} {row['fwd_wait_ms']:>9.3f} "
                  f"{row['fwd_transfer_ms']:>9.3f} {row['bwd_transfer_ms']:>9.3f} "
                  f"{dc.total_ms:>9.3f}")
        print("fwd_wait: idle in the forward all-to-all until the slowest device's forward compute ends; fwd_xfer, "
              "bwd_xfer: the device's own all-to-all transfers (--json: comm_split)")
    print(f"cost (slowest device): {cost.cost_ms:.3f} ms")
