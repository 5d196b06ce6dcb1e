"""The cost network's held-out accuracy over fit seeds, for variants of train_cost's params.

    python -m experiments.cost_net_seeds [--root .] [--seeds 5] [--variant NAME=JSON ...] [--out seeds.json]

One held-out accuracy (metrics/cost_model.json) rests on one fit seed, and its spread over seeds is as wide
as most of the differences between settings. This fits the network as the train_cost stage fits it
(`stages.train_cost.fit_network`) on the project's collected plans and single devices, with the stage's
held-out split (`train_cost.seed`, `holdout_fraction`), once per fit seed 0..seeds-1, and reports each
seed's held-out device-max Kendall tau, device compute MAPE and device-max plan MAPE with their mean and
range. The project's own params come first ("params"); each `--variant` is a JSON object of
`{"params": {group: {key: value}}, "widths": {"hidden": 256, "embed": 64}}`: params merged over the
project's (a key not in params.yaml is an error: nothing is silently ignored), widths the network's
(CostNetConfig). Variants fit on the same split as the project's, so their differences are the setting's:
a variant setting what that split and its data rest on (SHARED) is an error, not a setting quietly unused.
A different set of single devices is a variant with another `paths.single_devices`.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from stages.common import load_params, section

METRICS = ("plan_device_max_kendall_tau", "device_compute_mape", "plan_device_max_mape")
# what every variant shares: the collected plans, the held-out split and the fit seeds (the benchmark's loop)
SHARED = ("paths.costs", "paths.tasks", "paths.tables", "train_cost.seed", "train_cost.holdout_fraction",
          "train_cost.learn_from_held_out")


def merged(base: dict[str, Any], overrides: dict[str, Any], where: str = "params") -> dict[str, Any]:
    """`base` with `overrides` laid over it, key by key; a key `base` lacks is a ValueError naming its path."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if key not in out:
            raise ValueError(f"{where}.{key}: not in params.yaml (expected one of {', '.join(map(str, out))})")
        if isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = merged(out[key], value, f"{where}.{key}")
        else:
            out[key] = value
    return out


def check_shared(name: str, params: dict[str, Any], base: dict[str, Any]) -> None:
    """A ValueError naming the SHARED keys variant `name` changes."""
    changed = [k for k in SHARED if section(params, k) != section(base, k)]
    if changed:
        raise ValueError(f"--variant {name}: sets {', '.join(changed)}, which every variant shares with the "
                         "project's params (its collected plans, held-out split and fit seeds)")


def parse_variant(text: str) -> tuple[str, dict[str, Any], dict[str, int]]:
    """NAME=JSON -> (name, params overrides, widths)."""
    name, sep, body = text.partition("=")
    if not sep or not name:
        raise ValueError(f"--variant {text!r}: expected NAME=JSON")
    try:
        spec = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--variant {name}: not JSON ({exc})") from None
    if not isinstance(spec, dict) or not set(spec) <= {"params", "widths"}:
        raise ValueError(f"--variant {name}: expected an object with 'params' and/or 'widths', got {body}")
    params, widths = spec.get("params", {}), spec.get("widths", {})
    if not isinstance(params, dict) or not isinstance(widths, dict):
        raise ValueError(f"--variant {name}: 'params' and 'widths' must be objects")
    return name, params, widths


def summary(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {m: {"mean": statistics.fmean(r[m] for r in rows), "min": min(r[m] for r in rows),
                "max": max(r[m] for r in rows)} for m in METRICS}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.cost_net_seeds", description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path("."), help="the project whose params and collected data are used")
    ap.add_argument("--params", default="params.yaml", help="under --root")
    ap.add_argument("--seeds", type=int, default=5, help="fit seeds 0..seeds-1")
    ap.add_argument("--variant", action="append", default=[], help='NAME=JSON, e.g. lr=\'{"params": '
                    '{"train_cost": {"lr": 0.001}}}\' (repeatable)')
    ap.add_argument("--out", type=Path, default=None, help="a JSON of every seed's figures")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    try:
        variants = [("params", {}, {})] + [parse_variant(v) for v in args.variant]
    except ValueError as exc:
        ap.error(str(exc))
    names = [v[0] for v in variants]
    if len(set(names)) < len(names):
        ap.error(f"variant names must differ (and not be 'params'): {', '.join(names)}")
    import torch

    from dreamshard.errors import DreamShardError
    from dreamshard.io import write_text
    from dreamshard.learning.cost_model import evaluate_cost_net
    from stages.cost_data import load_scaler_and_data
    from stages.fit_data import load_single_devices, plan_split
    from stages.train_cost import fit_network

    out = args.out.resolve() if args.out else None
    torch.set_num_threads(1)  # a program, as the stages: fits are small
    here = os.getcwd()
    os.chdir(args.root.resolve())  # params' paths are the project's
    try:
        base = load_params(args.params)
        scaler, data, tasks = load_scaler_and_data(base)
        held_idx, fit_idx = plan_split(base, data)
        held, fit_on = data.subset(held_idx), data.subset(fit_idx)
        result: dict[str, Any] = {"held_out_plans": held.num_plans, "fitted_plans": fit_on.num_plans,
                                  "seeds": args.seeds, "variants": {}}
        print(f"cost_net_seeds: {fit_on.num_plans} plans fitted, {held.num_plans} held out, seeds 0-{args.seeds - 1}")
        settings = [(name, merged(base, overrides), overrides, widths) for name, overrides, widths in variants]
        for name, params, _, _ in settings:  # every variant checked before the first fit
            check_shared(name, params, base)
        singles: dict[tuple[str, str], Any] = {}  # single devices read once per (file, device_data as given)
        for name, params, overrides, widths in settings:
            key = (str(section(params, "paths.single_devices")), repr(section(params, "train_cost.device_data")))
            if key not in singles:
                singles[key] = load_single_devices(params, tasks)
            single = singles[key]
            start, rows = time.perf_counter(), []
            for seed in range(args.seeds):
                net, _ = fit_network(params, scaler, fit_on, single, seed, widths)
                m = evaluate_cost_net(net, scaler, held)
                rows.append({"seed": seed, **{k: float(m[k]) for k in METRICS}})
            s = summary(rows)
            result["variants"][name] = {"params": overrides, "widths": widths,
                                        "single_devices": 0 if single is None else single.num_plans,
                                        "per_seed": rows, "summary": s}
            t, c, p = (s[k] for k in METRICS)
            print(f"{name:>16}: tau {t['mean']:.3f} ({t['min']:.3f}-{t['max']:.3f})  compute MAPE "
                  f"{c['mean']:.3f} ({c['min']:.3f}-{c['max']:.3f})  plan MAPE {p['mean']:.3f}  "
                  f"[{time.perf_counter() - start:.0f} s]", flush=True)
    except (DreamShardError, ValueError, OSError) as exc:
        print(f"cost_net_seeds: error: {exc}", file=sys.stderr)
        return 1
    finally:
        os.chdir(here)
    if out:
        write_text(json.dumps(result, indent=2) + "\n", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
