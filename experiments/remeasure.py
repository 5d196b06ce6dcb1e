"""The held-out plans measured again: how well a measurement repeats, beside how well the cost network predicts it.

    python -m experiments.remeasure [--root .] [--passes 2] [--out remeasure.json] [--rows remeasured.parquet]

train_cost scores the cost network on the held-out plans against the collect stage's measurements
(metrics/cost_model.json), and gives as the floor under that score how far one round lies from the median
of its rounds (`held_out_measurement_noise`). The rounds of a plan are measured minutes apart at most,
within one spell of the machine, so that floor misses how far a measurement moves between spells. This
measures the held-out plans again, `passes` times one after another, with the collect stage's protocol
(`measure_chunk`: `collect.rounds` rounds in turns within chunks of `collect.chunk_size`, medians), on the
project's backend, and reports plan Kendall tau, plan MAPE and device compute MAPE of

- each pass against the collected measurements (a later measurement against the earlier one),
- each pass against the pass before it (two measurements minutes apart),
- the cost network (`paths.cost_model`, its own plan estimate, as train_cost scores it) against the collected
  measurements (train_cost's own figures), against each pass, and against the mean of the collected and
  the passes' costs.

If the network predicts a new measurement about as well as the collected one does, its error is the
measurements' own and no model can show a better score against them. The network part is left out (null)
where `train_cost.learn_from_held_out` is true: that checkpoint learned from the held-out plans.
MAPE of b against a is mean |b - a| / a; the median ratio of b to a says whether one ran slower
throughout. With `--rows`, every pass's plan rows (collect's columns plus `pass`) are written as Parquet.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def agreement(predicted: np.ndarray, measured: np.ndarray, device_pred: np.ndarray,
              device_true: np.ndarray) -> dict[str, float]:
    """Plan Kendall tau, MAPE and median ratio of `predicted` to `measured` (plan costs, ms), and the MAPE of
    the device compute costs `device_pred` against `device_true` (fwd + bwd per device row, ms) over the
    devices that compute anything."""
    from dreamshard.learning.cost_model import kendall_tau

    keep = device_true > 0
    return {"plan_kendall_tau": kendall_tau(predicted, measured),
            "plan_mape": float(np.mean(np.abs(predicted - measured) / measured)),
            "plan_median_ratio": float(np.median(predicted / measured)),
            "device_compute_mape": float(np.mean(np.abs(device_pred[keep] - device_true[keep]) / device_true[keep]))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.remeasure", description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path("."), help="the project whose collected plans are measured")
    ap.add_argument("--passes", type=int, default=2, help="measurements of every held-out plan, one after another")
    ap.add_argument("--out", type=Path, default=None, help="a JSON of the figures")
    ap.add_argument("--rows", type=Path, default=None, help="a Parquet of every pass's plan rows")
    args = ap.parse_args(argv)
    if args.passes < 1:
        ap.error("--passes must be >= 1")
    root = args.root.resolve()
    out = args.out.resolve() if args.out else None
    rows_out = args.rows.resolve() if args.rows else None
    from pipeline.__main__ import huge_pages_from_params

    huge_pages_from_params(str(root / "params.yaml"))  # before torch is imported
    import pandas as pd
    import pyarrow as pa
    import torch

    from dreamshard.errors import DreamShardError
    from dreamshard.evaluation.collect import PlanToMeasure, measure_chunk
    from dreamshard.io import write_parquet, write_text
    from dreamshard.learning.cost_model import device_predictions, load_cost_net, plan_predictions
    from dreamshard.plan import Plan
    from stages.backend import make_stage_backend
    from stages.common import load_params, section
    from stages.cost_data import load_scaler_and_data
    from stages.fit_data import plan_split

    torch.set_num_threads(1)  # a program, as the stages
    here = os.getcwd()
    os.chdir(root)  # params' paths are the project's
    try:
        params = load_params("params.yaml")
        _, data, tasks = load_scaler_and_data(params)
        costs = Path(section(params, "paths.costs"))
        plans = pd.read_parquet(costs / "plans.parquet")
        held_idx, _ = plan_split(params, data)
        held = data.subset(held_idx)
        by_name = {t.name: t for t in tasks}
        items = []
        for i in held_idx:
            row = plans.iloc[int(i)]  # load_scaler_and_data checked its task_id
            plan = Plan.from_dict({"num_devices": int(row.num_devices), "shards": json.loads(row.shards)},
                                  f"{costs / 'plans.parquet'}: plan {row.plan_id}")
            items.append(PlanToMeasure(row.plan_id, by_name[row.task_id], row.source, plan))
        collected_at = datetime.datetime.fromtimestamp((costs / "plans.parquet").stat().st_mtime, datetime.UTC)
        backend = make_stage_backend(params)
        rounds, chunk = int(section(params, "collect.rounds")), int(section(params, "collect.chunk_size"))
        print(f"remeasure: {len(items)} held-out plans, {args.passes} pass(es) of {rounds} round(s) with "
              f"{backend.name} on {backend.device_name()}", flush=True)
        # the collected rows, in held-out order: plan costs and device compute (device rows follow their plans)
        collected_plan = held.plan_cost_ms
        collected_dev = held.device_ms[:, :2].sum(axis=1)
        passes, rows = [], []
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
                raise DreamShardError(f"remeasure: pass {p} measured {len(dev_now)} devices of the held-out plans, "
                                      f"the collected rows have {len(collected_dev)}")
            passes.append({"started": started.isoformat(timespec="seconds"),
                           "seconds": round(time.perf_counter() - start, 1),
                           "plan_cost_ms": costs_now, "device_compute_ms": dev_now})
            rows += [{**r, "pass": p} for r in plan_rows]
            print(f"remeasure: pass {p}: {passes[-1]['seconds']:.0f} s", flush=True)
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
            print("remeasure: train_cost.learn_from_held_out is true: the checkpoint learned from these plans, so "
                  "the network is not scored on them")
        else:
            net, scaler = load_cost_net(section(params, "paths.cost_model"))
            predicted, _ = plan_predictions(net, scaler, held)
            dev_pred = device_predictions(net, scaler, held)[:, :2].sum(axis=1)
            mean_plan = np.mean([collected_plan] + [p["plan_cost_ms"] for p in passes], axis=0)
            mean_dev = np.mean([collected_dev] + [p["device_compute_ms"] for p in passes], axis=0)
            result["network"] = {
                "estimate": net.plan_estimate,
                "vs_collected": agreement(predicted, collected_plan, dev_pred, collected_dev),
                "vs_pass": [agreement(predicted, p["plan_cost_ms"], dev_pred, p["device_compute_ms"]) for p in passes],
                "vs_mean_of_measurements": agreement(predicted, mean_plan, dev_pred, mean_dev),
            }
    except (DreamShardError, ValueError, OSError) as exc:
        print(f"remeasure: error: {exc}", file=sys.stderr)
        return 1
    finally:
        os.chdir(here)
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
    if rows_out:
        frame = pd.DataFrame(rows)
        write_parquet(pa.Table.from_pandas(frame, preserve_index=False), rows_out)
    if out:
        write_text(json.dumps(result, indent=2) + "\n", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
