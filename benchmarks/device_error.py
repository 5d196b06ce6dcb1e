"""How far off is a cost network on devices of unseen tables, by how many tables a device holds?

    python -m benchmarks.device_error measure --out held_out_devices.parquet [--samples 240] [--max-tables 30] \
        [--memory-cap-gb 1.0] [--seed 7] [--rounds 3] [--root .]
    python -m benchmarks.device_error score --devices held_out_devices.parquet models/cost_net.pt OTHER.pt \
        [--buckets 5] [--out scores.json] [--root .]

`measure` draws random sets of 1..max_tables tables of the project's *test* pool (tables no model learned
from) at the configured dims, as the collect_devices stage draws its training samples
(`dreamshard.evaluation.devices.device_samples`), and measures each as one fused operator on the project's
backend in `rounds` interleaved rounds (medians; every round kept in the rows, with the device). `score`
reports, per cost-network checkpoint and per bucket of table counts, the devices' compute MAPE and the
median signed error (predicted / measured - 1): whether the network is off, and which way, on devices larger
than those it learned from.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.device_error", description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=("measure", "score"))
    ap.add_argument("models", nargs="*", help="score: cost-network checkpoints")
    ap.add_argument("--root", type=Path, default=Path("."), help="the project whose params, tables and tasks are used")
    ap.add_argument("--out", type=Path, default=None, help="measure: the devices' Parquet; score: a JSON summary")
    ap.add_argument("--devices", type=Path, default=None, help="score: the Parquet `measure` wrote")
    ap.add_argument("--samples", type=int, default=240)
    ap.add_argument("--max-tables", type=int, default=30)
    ap.add_argument("--memory-cap-gb", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--buckets", type=int, default=5, help="score: table counts per bucket")
    args = ap.parse_intermixed_args(argv)  # checkpoints may follow the options
    if args.action == "measure" and args.out is None:
        ap.error("measure needs --out")
    if args.action == "score" and (args.devices is None or not args.models):
        ap.error("score needs --devices and at least one checkpoint")
    if min(args.samples, args.max_tables, args.rounds, args.buckets) < 1 or not args.memory_cap_gb > 0:
        ap.error("--samples, --max-tables, --rounds and --buckets must be >= 1 and --memory-cap-gb > 0")
    from pipeline.__main__ import huge_pages_from_params

    root = args.root.resolve()
    out = args.out.resolve() if args.out else None
    devices_path = args.devices.resolve() if args.devices else None
    models = [Path(m).resolve() for m in args.models]
    huge_pages_from_params(str(root / "params.yaml"))  # before torch is imported
    os.chdir(root)
    import pandas as pd
    import pyarrow as pa

    from dreamshard.errors import DreamShardError
    from dreamshard.evaluation.devices import cost_data_from_rows, device_samples, measure_samples
    from dreamshard.io import write_parquet, write_text
    from dreamshard.learning.cost_model import device_predictions, load_cost_net
    from dreamshard.tasks import read_tasks, table_pool
    from stages.backend import make_stage_backend
    from stages.common import load_params, section

    try:
        params = load_params("params.yaml")
        tasks = read_tasks(Path(section(params, "paths.tasks")) / "test.parquet", section(params, "paths.tables"))
        pool = table_pool(tasks)
        if args.action == "measure":
            dims = [int(d) for d in section(params, "tasks.dims")]
            samples = device_samples(pool, args.samples, args.max_tables, args.memory_cap_gb, dims, tasks[0], args.seed)
            backend = make_stage_backend(params)
            rows = measure_samples(backend, samples, tasks[0], {"seed": args.seed, "pool": "test"}, args.rounds)
            write_parquet(pa.Table.from_pylist(rows), out)
            print(f"device_error: {len(rows)} devices of test tables measured on {backend.device_name()} -> {out}")
            return 0
        rows = pd.read_parquet(devices_path)
        data = cost_data_from_rows(rows, pool, tasks[0], str(devices_path))
        counts = rows["tables"].map(len).to_numpy()
        measured = data.device_ms[:, :2].sum(axis=1)
        summary: dict[str, Any] = {"devices": str(args.devices), "device_name": str(rows["device_name"].iloc[0]),
                                   "models": {}}
        for given, path in zip(args.models, models, strict=True):
            net, scaler = load_cost_net(path)
            predicted = device_predictions(net, scaler, data)[:, :2].sum(axis=1)
            summary["models"][given] = per = bucket_errors(counts, predicted, measured, args.buckets)
            print(given)
            for key, v in per.items():
                print(f"  {key:>7} tables: {v['devices']:4d} devices, MAPE {v['mape']:.3f}, "
                      f"median signed {v['median_signed']:+.3f}")
    except (DreamShardError, ValueError, OSError) as exc:
        print(f"device_error: error: {exc}", file=sys.stderr)
        return 1
    if out:
        write_text(json.dumps(summary, indent=2) + "\n", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
