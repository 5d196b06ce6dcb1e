"""The cost network's studies: its held-out accuracy over fit seeds, its error on devices of unseen tables, and
the held-out plans measured again.

    python -m experiments.cost_net seeds [--root .] [--params params.yaml] [--seeds 5] [--variant NAME=JSON ...] \
        [--out seeds.json]
    python -m experiments.cost_net device-error measure --out held_out_devices.parquet [--pools validation] \
        [--samples 240] [--max-tables 30] [--memory-cap-gb 1.0] [--seed 7] [--rounds 3] [--root .]
    python -m experiments.cost_net device-error score --devices held_out_devices.parquet models/cost_net.pt \
        OTHER.pt [--buckets 5] [--out scores.json] [--root .]
    python -m experiments.cost_net remeasure [--root .] [--passes 2] [--out remeasure.json] [--rows remeasured.parquet]

Every subcommand works in the project at `--root` (its params.yaml, collected plans, tasks and checkpoints:
params' paths are the project's), with the allocator setting its params give and torch on one thread, as a
stage runs. The held-out plans are train_cost's (`train_cost.seed`, `holdout_fraction`); a device's compute is
its forward plus backward time.

`seeds`: one held-out accuracy (metrics/cost_model.json) rests on one fit seed, and its spread over seeds is
as wide as most of the differences between settings. This fits the network as the train_cost stage fits it
(`dreamshard.project.cost_network.fit_network`) on the project's collected plans and single devices, with the stage's
held-out split, once per fit seed 0..seeds-1, and reports each seed's held-out device-max Kendall tau, device
compute MAPE and device-max plan MAPE with their mean and range. The project's own params come first
("params"); each `--variant` is a JSON object of `{"params": {group: {key: value}}, "widths": {"hidden": 256,
"embed": 64}}`: params merged over the project's (a key not in params.yaml is an error: nothing is silently
ignored), widths the network's (CostNetConfig). Variants fit on the same split as the project's, so their
differences are the setting's: a variant setting what that split and its data rest on (SHARED) is an error,
not a setting quietly unused. A different set of single devices is a variant with another
`paths.single_devices`.

`device-error measure` draws, per pool in `--pools`, `samples` random sets of 1..max_tables tables of the
project's *validation* pool (tables no model learned from; the test pool is evaluate's alone) or *train* pool
(new random sets of the training tables) at the configured dims, as the collect_devices stage draws its training samples
(`dreamshard.learning.devices.device_samples`, seed + the pool's position), and measures all of them as one
fused operator each on the project's backend in `rounds` interleaved rounds (medians; every round kept in the
rows, with the device and the pool). Measuring both pools in one pass separates what unseen tables cost the
network from the machine's drift since its training data were measured. `device-error score` reports, per
cost-network checkpoint, pool and bucket of table counts, the devices' compute MAPE and the median signed
error (predicted / measured - 1).

`remeasure`: train_cost scores the network on the held-out plans against the collect stage's measurements,
and gives as the floor under that score how far one round lies from the median of its rounds
(`held_out_measurement_noise`). The rounds of a plan are measured minutes apart at most, within one spell of
the machine, so that floor misses how far a measurement moves between spells. This measures the held-out
plans again, `passes` times one after another, with the collect stage's protocol (`measure_chunk`:
`collect.rounds` rounds in turns within chunks of `collect.chunk_size`, medians), on the project's backend,
and reports plan Kendall tau, plan MAPE and device compute MAPE of each pass against the collected
measurements, each pass against the pass before it, and the network (`paths.cost_model`, its own plan
estimate, as train_cost scores it) against the collected measurements (train_cost's own figures), against
each pass and against the mean of the collected and the passes' costs. If the network predicts a new
measurement about as well as the collected one does, its error is the measurements' own and no model can
show a better score against them. The network part is left out (null) where `train_cost.learn_from_held_out`
is true: that checkpoint learned from the held-out plans. MAPE of b against a is mean |b - a| / a; the median
ratio of b to a says whether one ran slower throughout. With `--rows`, every pass's plan rows (collect's
columns plus `pass`) are written as Parquet.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dreamshard.project.params import load_params, section

PROG = "python -m experiments.cost_net"
METRICS = ("plan_device_max_kendall_tau", "device_compute_mape", "plan_device_max_mape")
# what every `seeds` variant shares: the collected plans, the held-out split and the fit seeds (the study's loop)
SHARED = ("paths.costs", "paths.tasks", "paths.tables", "train_cost.seed", "train_cost.holdout_fraction",
          "train_cost.learn_from_held_out")
ID_STRIDE = 1_000_000  # device-error: sample ids of the k-th pool start at k x ID_STRIDE


# ------------------------------------------------------------------ shared: the project, its cost data, scoring

@contextlib.contextmanager
def in_project(root: Path) -> Iterator[None]:
    """Inside the project `root`, as a stage runs: its allocator setting (before torch is imported), its folder
    (params' paths are the project's), torch on one thread; back in the caller's folder afterwards."""
    from dreamshard.project.backend import huge_pages_from_params

    huge_pages_from_params(str(root / "params.yaml"))
    import torch

    torch.set_num_threads(1)  # a program, as the stages: fits are small; a measuring backend pins its own count
    here = os.getcwd()
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(here)


def held_out_split(params: dict[str, Any]) -> tuple[Any, Any, list[Any], np.ndarray, np.ndarray]:
    """(scaler, collected cost data, training tasks, held-out plan indices, fitted plan indices), as train_cost
    splits the collected plans."""
    from dreamshard.project.costs import load_scaler_and_data
    from dreamshard.project.fit_data import plan_split

    scaler, data, tasks = load_scaler_and_data(params)
    held_idx, fit_idx = plan_split(params, data)
    return scaler, data, tasks, held_idx, fit_idx


def measured_compute(data: Any) -> np.ndarray:
    """Each device row's measured compute (forward + backward, ms)."""
    return data.device_ms[:, :2].sum(axis=1)


def predicted_compute(net: Any, scaler: Any, data: Any) -> np.ndarray:
    """The network's compute (forward + backward, ms) of each device row of `data`."""
    from dreamshard.project.learning import device_predictions

    return device_predictions(net, scaler, data)[:, :2].sum(axis=1)


def write_json(result: dict[str, Any], out: Path | None) -> None:
    if out:
        from dreamshard.project.domain import write_text

        write_text(json.dumps(result, indent=2) + "\n", out)


# ------------------------------------------------------------------ seeds

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


def seed_summary(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Mean, min and max over the seeds' rows of each of METRICS."""
    return {m: {"mean": statistics.fmean(r[m] for r in rows), "min": min(r[m] for r in rows),
                "max": max(r[m] for r in rows)} for m in METRICS}


def seeds_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--root", type=Path, default=Path("."), help="the project whose params and collected data are used")
    ap.add_argument("--params", default="params.yaml", help="under --root")
    ap.add_argument("--seeds", type=int, default=5, help="fit seeds 0..seeds-1")
    ap.add_argument("--variant", action="append", default=[], help='NAME=JSON, e.g. lr=\'{"params": '
                    '{"train_cost": {"lr": 0.001}}}\' (repeatable)')
    ap.add_argument("--out", type=Path, default=None, help="a JSON of every seed's figures")


def check_seeds(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors before any work; args.variants: the project's params first, then each --variant parsed."""
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    try:
        args.variants = [("params", {}, {})] + [parse_variant(v) for v in args.variant]
    except ValueError as exc:
        ap.error(str(exc))
    names = [v[0] for v in args.variants]
    if len(set(names)) < len(names):
        ap.error(f"variant names must differ (and not be 'params'): {', '.join(names)}")


def seeds(args: argparse.Namespace) -> dict[str, Any]:
    """Every variant's held-out figures per fit seed, with their mean and range."""
    from dreamshard.project.cost_network import fit_network
    from dreamshard.project.fit_data import load_single_devices
    from dreamshard.project.learning import evaluate_cost_net

    base = load_params(args.params)
    scaler, data, tasks, held_idx, fit_idx = held_out_split(base)
    held, fit_on = data.subset(held_idx), data.subset(fit_idx)
    result: dict[str, Any] = {"held_out_plans": held.num_plans, "fitted_plans": fit_on.num_plans,
                              "seeds": args.seeds, "variants": {}}
    print(f"cost_net seeds: {fit_on.num_plans} plans fitted, {held.num_plans} held out, seeds 0-{args.seeds - 1}")
    settings = [(name, merged(base, overrides), overrides, widths) for name, overrides, widths in args.variants]
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
        s = seed_summary(rows)
        result["variants"][name] = {"params": overrides, "widths": widths,
                                    "single_devices": 0 if single is None else single.num_plans,
                                    "per_seed": rows, "summary": s}
        t, c, p = (s[k] for k in METRICS)
        print(f"{name:>16}: tau {t['mean']:.3f} ({t['min']:.3f}-{t['max']:.3f})  compute MAPE "
              f"{c['mean']:.3f} ({c['min']:.3f}-{c['max']:.3f})  plan MAPE {p['mean']:.3f}  "
              f"[{time.perf_counter() - start:.0f} s]", flush=True)
    return result


# ------------------------------------------------------------------ device-error

def bucket_errors(tables: np.ndarray, predicted: np.ndarray, measured: np.ndarray, width: int) -> dict[str, Any]:
    """Per bucket of `width` table counts (1..width, width+1..2 width, ...): devices, MAPE, median signed error."""
    err = predicted / measured - 1.0
    out = {}
    for low in range(1, int(tables.max()) + 1, width):
        k = (tables >= low) & (tables < low + width)
        if k.any():
            out[f"{low}-{low + width - 1}"] = {"devices": int(k.sum()), "mape": float(np.mean(np.abs(err[k]))),
                                               "median_signed": float(np.median(err[k]))}
    return out


def device_error_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("action", choices=("measure", "score"))
    ap.add_argument("models", nargs="*", help="score: cost-network checkpoints")
    ap.add_argument("--root", type=Path, default=Path("."), help="the project whose params, tables and tasks are used")
    ap.add_argument("--out", type=Path, default=None, help="measure: the devices' Parquet; score: a JSON summary")
    ap.add_argument("--devices", type=Path, default=None, help="score: the Parquet `measure` wrote")
    ap.add_argument("--pools", default="validation", help="measure: validation and/or train, comma-separated")
    ap.add_argument("--samples", type=int, default=240, help="measure: devices per pool")
    ap.add_argument("--max-tables", type=int, default=30)
    ap.add_argument("--memory-cap-gb", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--buckets", type=int, default=5, help="score: table counts per bucket")


def check_device_error(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors before any work; args.pool_names: the pools to draw from, in order."""
    if args.action == "measure" and args.out is None:
        ap.error("measure needs --out")
    if args.action == "score" and (args.devices is None or not args.models):
        ap.error("score needs --devices and at least one checkpoint")
    pools = [x for x in args.pools.split(",") if x]
    if not pools or not set(pools) <= {"train", "validation"} or len(set(pools)) < len(pools):
        ap.error(f"--pools: expected validation and/or train, got {args.pools!r}")
    if min(args.samples, args.max_tables, args.rounds, args.buckets) < 1 or not args.memory_cap_gb > 0:
        ap.error("--samples, --max-tables, --rounds and --buckets must be >= 1 and --memory-cap-gb > 0")
    args.pool_names = pools


def device_error(args: argparse.Namespace) -> dict[str, Any] | None:
    """measure: the drawn devices written as Parquet (None: no JSON); score: per checkpoint, pool and bucket."""
    pools = args.pool_names
    import pandas as pd
    import pyarrow as pa

    from dreamshard.project.backend import backend_of
    from dreamshard.project.domain import DreamShardError, read_tasks, table_dims, table_pool, write_parquet
    from dreamshard.project.learning import (
        DeviceSample,
        cost_data_from_device_rows,
        device_samples,
        load_cost_net,
        measure_samples,
    )

    params = load_params("params.yaml")
    folder, tables = Path(section(params, "paths.tasks")), section(params, "paths.tables")
    tasks = {split: read_tasks(folder / f"{split}.parquet", tables) for split in ("train", "validation")}
    if args.action == "measure":
        dims = table_dims(tasks["train"])  # as collect_devices draws
        samples, pool_of = [], {}
        for k, name in enumerate(pools):  # sample ids kept apart per pool
            for s in device_samples(table_pool(tasks[name]), args.samples, args.max_tables, args.memory_cap_gb,
                                    dims, tasks[name][0], args.seed + k):
                samples.append(DeviceSample(k * ID_STRIDE + s.index, s.tables))
                pool_of[samples[-1].index] = name
        backend = backend_of(params)
        rows = measure_samples(backend, samples, tasks["validation"][0], {"seed": args.seed}, args.rounds)
        for r in rows:
            r["pool"] = pool_of[r["sample"]]
        write_parquet(pa.Table.from_pylist(rows), args.out)
        print(f"cost_net device-error: {len(rows)} devices ({', '.join(pools)} tables) measured on "
              f"{backend.device_name()} -> {args.out}")
        return None
    frame = pd.read_parquet(args.devices)
    if "pool" not in frame.columns or not set(frame["pool"]) <= {"train", "validation"}:
        raise DreamShardError(f"{args.devices}: column 'pool': expected train or validation on every row (what "
                              "`measure` writes)")
    summary: dict[str, Any] = {"devices": str(args.devices_given), "device_name": str(frame["device_name"].iloc[0]),
                               "models": {}}
    by_pool = {}  # pool -> (its devices' CostData, their table counts): read once, scored by every model
    for name, sub in frame.groupby("pool", sort=False):
        sub = sub.reset_index(drop=True)
        by_pool[name] = (cost_data_from_device_rows(sub, table_pool(tasks[name]), tasks[name][0],
                                             f"{args.devices} ({name})"), sub["tables"].map(len).to_numpy())
    for given, path in zip(args.models_given, args.models, strict=True):
        net, scaler = load_cost_net(path)
        summary["models"][given] = {}
        for name, (data, counts) in by_pool.items():
            per = bucket_errors(counts, predicted_compute(net, scaler, data), measured_compute(data), args.buckets)
            summary["models"][given][name] = per
            print(f"{given}, {name} tables")
            for key, v in per.items():
                print(f"  {key:>7} tables: {v['devices']:4d} devices, MAPE {v['mape']:.3f}, "
                      f"median signed {v['median_signed']:+.3f}")
    return summary


# ------------------------------------------------------------------ remeasure

def agreement(predicted: np.ndarray, measured: np.ndarray, device_pred: np.ndarray,
              device_true: np.ndarray) -> dict[str, float]:
    """Plan Kendall tau, MAPE and median ratio of `predicted` to `measured` (plan costs, ms), and the MAPE of
    the device compute costs `device_pred` against `device_true` (fwd + bwd per device row, ms) over the
    devices that compute anything."""
    from dreamshard.project.learning import kendall_tau

    keep = device_true > 0
    return {"plan_kendall_tau": kendall_tau(predicted, measured),
            "plan_mape": float(np.mean(np.abs(predicted - measured) / measured)),
            "plan_median_ratio": float(np.median(predicted / measured)),
            "device_compute_mape": float(np.mean(np.abs(device_pred[keep] - device_true[keep]) / device_true[keep]))}


def remeasure_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--root", type=Path, default=Path("."), help="the project whose collected plans are measured")
    ap.add_argument("--passes", type=int, default=2, help="measurements of every held-out plan, one after another")
    ap.add_argument("--out", type=Path, default=None, help="a JSON of the figures")
    ap.add_argument("--rows", type=Path, default=None, help="a Parquet of every pass's plan rows")


def check_remeasure(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.passes < 1:
        ap.error("--passes must be >= 1")


def remeasure(args: argparse.Namespace) -> dict[str, Any]:
    """Every pass against the collected measurements and the pass before, and the network against them all."""
    import pandas as pd
    import pyarrow as pa

    from dreamshard.project.backend import backend_of
    from dreamshard.project.collection import PlanToMeasure, measure_chunk
    from dreamshard.project.domain import DreamShardError, Plan, write_parquet
    from dreamshard.project.learning import load_cost_net, plan_predictions

    params = load_params("params.yaml")
    _, data, tasks, held_idx, _ = held_out_split(params)
    costs = Path(section(params, "paths.costs"))
    plans = pd.read_parquet(costs / "plans.parquet")
    held = data.subset(held_idx)
    by_name = {t.name: t for t in tasks}
    items = []
    for i in held_idx:
        row = plans.iloc[int(i)]  # load_scaler_and_data checked its task_id
        plan = Plan.from_dict({"num_devices": int(row.num_devices), "shards": json.loads(row.shards)},
                              f"{costs / 'plans.parquet'}: plan {row.plan_id}")
        items.append(PlanToMeasure(row.plan_id, by_name[row.task_id], row.source, plan))
    collected_at = datetime.datetime.fromtimestamp((costs / "plans.parquet").stat().st_mtime, datetime.UTC)
    backend = backend_of(params)
    rounds, chunk = int(section(params, "collect.rounds")), int(section(params, "collect.chunk_size"))
    print(f"cost_net remeasure: {len(items)} held-out plans, {args.passes} pass(es) of {rounds} round(s) with "
          f"{backend.name} on {backend.device_name()}", flush=True)
    # the collected rows, in held-out order: plan costs and device compute (device rows follow their plans)
    collected_plan, collected_dev = held.plan_cost_ms, measured_compute(held)
    passes: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for p in range(args.passes):
        start, started = time.perf_counter(), datetime.datetime.now(datetime.UTC)
        plan_rows, device_rows = [], []
        for c in range(0, len(items), chunk):
            got = measure_chunk(backend, items[c:c + chunk], {}, rounds)
            plan_rows += got[0]
            device_rows += got[1]
        costs_now = np.array([r["cost_ms"] for r in plan_rows])
        dev_now = np.array([r["fwd_ms"] + r["bwd_ms"] for r in device_rows])
        if len(dev_now) != len(collected_dev):
            raise DreamShardError(f"pass {p} measured {len(dev_now)} devices of the held-out plans, "
                                  f"the collected rows have {len(collected_dev)}")
        passes.append({"started": started.isoformat(timespec="seconds"),
                       "seconds": round(time.perf_counter() - start, 1),
                       "plan_cost_ms": costs_now, "device_compute_ms": dev_now})
        rows += [{**r, "pass": p} for r in plan_rows]
        print(f"cost_net remeasure: pass {p}: {passes[-1]['seconds']:.0f} s", flush=True)
    result: dict[str, Any] = {
        "plans": len(items), "devices": int(len(collected_dev)), "rounds": rounds,
        "device": backend.device_name(), "backend": backend.name, "measured": bool(backend.measured),
        "collected_file_time": collected_at.isoformat(timespec="seconds"),
        "passes": [{k: v for k, v in p.items() if k in ("started", "seconds")} for p in passes],
        "pass_vs_collected": [agreement(p["plan_cost_ms"], collected_plan, p["device_compute_ms"], collected_dev)
                              for p in passes],
        "pass_vs_previous_pass": [agreement(b["plan_cost_ms"], a["plan_cost_ms"], b["device_compute_ms"],
                                            a["device_compute_ms"]) for a, b in zip(passes, passes[1:])],
        "network": None,
    }
    if section(params, "train_cost.learn_from_held_out") is True:
        print("cost_net remeasure: train_cost.learn_from_held_out is true: the checkpoint learned from these "
              "plans, so the network is not scored on them")
    else:
        net, scaler = load_cost_net(section(params, "paths.cost_model"))
        predicted, _ = plan_predictions(net, scaler, held)
        dev_pred = predicted_compute(net, scaler, held)
        mean_plan = np.mean([collected_plan] + [p["plan_cost_ms"] for p in passes], axis=0)
        mean_dev = np.mean([collected_dev] + [p["device_compute_ms"] for p in passes], axis=0)
        result["network"] = {
            "estimate": net.plan_estimate,
            "vs_collected": agreement(predicted, collected_plan, dev_pred, collected_dev),
            "vs_pass": [agreement(predicted, p["plan_cost_ms"], dev_pred, p["device_compute_ms"]) for p in passes],
            "vs_mean_of_measurements": agreement(predicted, mean_plan, dev_pred, mean_dev),
        }
    lines = [(f"pass {k} vs collected", a) for k, a in enumerate(result["pass_vs_collected"])]
    lines += [(f"pass {k} vs pass {k - 1}", a) for k, a in enumerate(result["pass_vs_previous_pass"], start=1)]
    if result["network"]:
        n = result["network"]
        lines += [("network vs collected", n["vs_collected"])]
        lines += [(f"network vs pass {k}", a) for k, a in enumerate(n["vs_pass"])]
        lines += [("network vs mean of measurements", n["vs_mean_of_measurements"])]
    for name, a in lines:
        print(f"  {name}: tau {a['plan_kendall_tau']:.3f}  plan MAPE {a['plan_mape']:.3f} (median ratio "
              f"{a['plan_median_ratio']:.3f})  device compute MAPE {a['device_compute_mape']:.3f}")
    if args.rows:
        write_parquet(pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False), args.rows)
    return result


# ------------------------------------------------------------------ the command

Check = Callable[[argparse.ArgumentParser, argparse.Namespace], None]  # usage errors, before any work
Study = Callable[[argparse.Namespace], dict[str, Any] | None]  # the result written as JSON to --out (None: none)
COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Check, Study, str]] = {
    "seeds": (seeds_args, check_seeds, seeds,
              "the network's held-out accuracy over fit seeds, for variants of train_cost's params"),
    "device-error": (device_error_args, check_device_error, device_error,
                     "measure devices of unseen tables, or score checkpoints on them by table count"),
    "remeasure": (remeasure_args, check_remeasure, remeasure,
                  "the held-out plans measured again, beside the network's predictions"),
}


def parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command's parser (its subcommands, for help and a missing or unknown one) and each subcommand's."""
    top = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].replace("\n", " "))
    sub = top.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    leaves = {}
    for name, (add_args, _, _, about) in COMMANDS.items():
        leaves[name] = sub.add_parser(name, help=about, description=about)
        add_args(leaves[name])
    return top, leaves


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top, leaves = parsers()
    if not argv or argv[0] not in leaves:
        top.parse_args(argv)  # help, or the usage error naming the subcommands
        return 2
    ap = leaves[argv[0]]
    args = ap.parse_intermixed_args(argv[1:])  # device-error: checkpoints may follow the options
    _, check, study, _ = COMMANDS[argv[0]]
    check(ap, args)
    # paths given on the command line are the caller's: resolved before working in the project
    for key in ("out", "rows", "devices"):
        if getattr(args, key, None) is not None:
            setattr(args, f"{key}_given", getattr(args, key))
            setattr(args, key, getattr(args, key).resolve())
    if getattr(args, "models", None) is not None:
        args.models_given, args.models = args.models, [Path(m).resolve() for m in args.models]
    from dreamshard.project.domain import DreamShardError

    try:
        with in_project(args.root.resolve()):
            result = study(args)
    except (DreamShardError, ValueError, OSError) as exc:
        print(f"cost_net {argv[0]}: error: {exc}", file=sys.stderr)
        return 1
    if result is not None:
        write_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
