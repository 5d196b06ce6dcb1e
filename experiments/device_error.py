"""How far off is a cost network on devices of unseen tables, by how many tables a device holds?

    python -m experiments.device_error measure --out held_out_devices.parquet [--pools test] [--samples 240] \
        [--max-tables 30] [--memory-cap-gb 1.0] [--seed 7] [--rounds 3] [--root .]
    python -m experiments.device_error score --devices held_out_devices.parquet models/cost_net.pt OTHER.pt \
        [--buckets 5] [--out scores.json] [--root .]

`measure` draws, per pool in `--pools`, `samples` random sets of 1..max_tables tables of the project's
*test* pool (tables no model learned from) or *train* pool (new random sets of the training tables) at the
configured dims, as the collect_devices stage draws its training samples
(`dreamshard.learning.devices.device_samples`, seed + the pool's position), and measures all of them as
one fused operator each on the project's backend in `rounds` interleaved rounds (medians; every round kept
in the rows, with the device and the pool). Measuring both pools in one pass separates what unseen tables
cost the network from the machine's drift since its training data were measured. `score` reports, per
cost-network checkpoint, pool and bucket of table counts, the devices' compute MAPE and the median signed
error (predicted / measured - 1).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ID_STRIDE = 1_000_000  # sample ids of the k-th pool start at k x ID_STRIDE


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
    ap = argparse.ArgumentParser(prog="python -m experiments.device_error", description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=("measure", "score"))
    ap.add_argument("models", nargs="*", help="score: cost-network checkpoints")
    ap.add_argument("--root", type=Path, default=Path("."), help="the project whose params, tables and tasks are used")
    ap.add_argument("--out", type=Path, default=None, help="measure: the devices' Parquet; score: a JSON summary")
    ap.add_argument("--devices", type=Path, default=None, help="score: the Parquet `measure` wrote")
    ap.add_argument("--pools", default="test", help="measure: test and/or train, comma-separated")
    ap.add_argument("--samples", type=int, default=240, help="measure: devices per pool")
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
    pools = [x for x in args.pools.split(",") if x]
    if not pools or not set(pools) <= {"train", "test"} or len(set(pools)) < len(pools):
        ap.error(f"--pools: expected test and/or train, got {args.pools!r}")
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
    from dreamshard.io import write_parquet, write_text
    from dreamshard.learning.cost_model import device_predictions, load_cost_net
    from dreamshard.learning.devices import DeviceSample, cost_data_from_rows, device_samples, measure_samples
    from dreamshard.tasks import read_tasks, table_pool
    from stages.backend import make_stage_backend
    from stages.common import load_params, section

    try:
        params = load_params("params.yaml")
        folder, tables = Path(section(params, "paths.tasks")), section(params, "paths.tables")
        tasks = {split: read_tasks(folder / f"{split}.parquet", tables) for split in ("train", "test")}
        if args.action == "measure":
            dims = [int(d) for d in section(params, "tasks.dims")]
            samples, pool_of = [], {}
            for k, name in enumerate(pools):  # sample ids kept apart per pool
                for s in device_samples(table_pool(tasks[name]), args.samples, args.max_tables, args.memory_cap_gb,
                                        dims, tasks[name][0], args.seed + k):
                    samples.append(DeviceSample(k * ID_STRIDE + s.index, s.tables))
                    pool_of[samples[-1].index] = name
            backend = make_stage_backend(params)
            rows = measure_samples(backend, samples, tasks["test"][0], {"seed": args.seed}, args.rounds)
            for r in rows:
                r["pool"] = pool_of[r["sample"]]
            write_parquet(pa.Table.from_pylist(rows), out)
            print(f"device_error: {len(rows)} devices ({', '.join(pools)} tables) measured on "
                  f"{backend.device_name()} -> {out}")
            return 0
        rows = pd.read_parquet(devices_path)
        if "pool" not in rows.columns or not set(rows["pool"]) <= {"train", "test"}:
            raise DreamShardError(f"{devices_path}: column 'pool': expected train or test on every row (what "
                                  "`measure` writes)")
        summary: dict[str, Any] = {"devices": str(args.devices), "device_name": str(rows["device_name"].iloc[0]),
                                   "models": {}}
        by_pool = {}  # pool -> (its devices' CostData, their table counts): read once, scored by every model
        for name, sub in rows.groupby("pool", sort=False):
            sub = sub.reset_index(drop=True)
            by_pool[name] = (cost_data_from_rows(sub, table_pool(tasks[name]), tasks[name][0],
                                                 f"{devices_path} ({name})"), sub["tables"].map(len).to_numpy())
        for given, path in zip(args.models, models, strict=True):
            net, scaler = load_cost_net(path)
            summary["models"][given] = {}
            for name, (data, counts) in by_pool.items():
                predicted = device_predictions(net, scaler, data)[:, :2].sum(axis=1)
                per = bucket_errors(counts, predicted, data.device_ms[:, :2].sum(axis=1), args.buckets)
                summary["models"][given][name] = per
                print(f"{given}, {name} tables")
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
