"""UVM caching (`fused_uvm_caching`) on FBGEMM's CUDA kernels against the project's model of it.

    python -m tools.gpu_uvm --out DIR [--batch 65536] [--rows 2000000] [--dim 64] [--pooling 20]
                            [--alphas 0.6,1.0,1.2] [--factors 0.01,0.05,0.2] [--batches 8]

For each Zipf skew, one table is measured in HBM (`fused`) and UVM-cached at each load factor, two ways:
  fixed     the backend's own protocol (`FbgemmBackend.compute_cost` of a shard with `cache=`): one batch,
            repeated, so that after the warm-up the cache holds the rows that batch reads;
  rotating  `--batches` different batches of the same table in turn, FBGEMM's cache statistics gathered.
            --draws one (the default): the batches are one draw of batches x batch samples, split, so that they
            share the table's hot rows and differ in the rest, as a training job's steps do; --draws seeds: each
            batch drawn with its own seed, which also moves the hot rows (generate_lookups scatters the ranks by
            the seed), so that every step's hot rows are new to the cache: the worst case, and what the first
            run of this check measured (results/gpu/README.md, 2026-11-27).
Beside each: `caching.hit_rate` (the share of lookups the model says the cache serves, from the table's
access-count bins) and the slowdown over HBM the analytic backend prices from it (`uvm_miss_factor`).
Writes DIR/uvm.json (every row, with the device, versions and this command). CUDA only.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path


def rotating(table, requests, factor, device_name: str = "cuda", warm_passes: int = 2, timed_passes: int = 2):
    """Median fwd+bwd ms over the batches in turn, and FBGEMM's unique-row miss share (None for HBM)."""
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    device = torch.device(device_name)
    location = EmbeddingLocation.DEVICE if factor is None else EmbeddingLocation.MANAGED_CACHING
    if device.type == "cpu":  # a smoke test of this script: HBM only, FBGEMM's CPU kernels
        location = EmbeddingLocation.HOST
    extra = {} if factor is None else {"cache_load_factor": factor, "gather_uvm_cache_stats": True}
    compute = ComputeDevice.CUDA if device.type == "cuda" else ComputeDevice.CPU
    op = SplitTableBatchedEmbeddingBagsCodegen([(table.rows, table.dim, location, compute)],
                                               optimizer=EmbOptimType.EXACT_SGD, weights_precision=SparseType.FP32,
                                               learning_rate=0.01, device=device, **extra)
    inputs = []
    for idx, lengths in requests:
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.from_numpy(lengths).cumsum(0)])
        inputs.append((torch.from_numpy(idx).to(device), offsets.to(device)))
    grad = torch.randn(len(requests[0][1]), table.dim, device=device) * 0.01
    for _ in range(warm_passes):
        for i, o in inputs:
            op(i, o).backward(grad)
    if factor is not None:
        op.reset_uvm_cache_stats()
    times = []
    for _ in range(timed_passes):
        for i, o in inputs:
            if device.type == "cpu":
                t = time.perf_counter()
                op(i, o).backward(grad)
                times.append((time.perf_counter() - t) * 1e3)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            op(i, o).backward(grad)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    miss = None
    if factor is not None:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import UVMCacheStatsIndex

        stats = op.get_uvm_cache_stats().tolist()
        unique = stats[UVMCacheStatsIndex.num_unique_indices]
        miss = stats[UVMCacheStatsIndex.num_unique_misses] / unique if unique else None
    del op
    torch.cuda.empty_cache()
    return statistics.median(times), miss


def batches_of(generate, profile, batch: int, count: int, draws: str):
    """`count` batches of (indices, lengths): split from one draw of count x batch samples (seed 0), or one draw
    per batch with seeds 0..count-1."""
    import numpy as np

    if draws == "seeds":
        return [generate(profile, batch, seed) for seed in range(count)]
    indices, lengths = generate(profile, count * batch, 0)
    ends = np.concatenate([[0], np.cumsum(lengths)])[::batch]  # where each batch's ids start, and the last end
    return [(indices[ends[i]:ends[i + 1]], lengths[i * batch:(i + 1) * batch]) for i in range(count)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gpu_uvm", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--pooling", type=float, default=20.0)
    ap.add_argument("--alphas", default="0.6,1.0,1.2")
    ap.add_argument("--factors", default="0.01,0.05,0.2")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--draws", default="one", choices=["one", "seeds"],
                    help="one: the rotating batches split from one draw (shared hot rows); seeds: one draw each")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke test of this script, HBM rows only (--factors '')")
    args = ap.parse_args(argv)
    import torch

    from dreamshard.project.data import RecordedLookups, TableProfile, TableRequests, generate_lookups, table_statistics
    from dreamshard.project.domain import Shard, Table, Task
    from dreamshard.project.hardware import (
        AnalyticConfig,
        FbgemmBackend,
        FbgemmConfig,
        fbgemm_version,
        hit_rate,
        huge_pages_enabled,
        pin_threads,
    )

    factors = [None] + [float(f) for f in args.factors.split(",") if f]
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("needs a CUDA GPU: UVM caching is a CUDA kernel")
    if args.device == "cpu" and len(factors) > 1:
        ap.error("--device cpu: UVM caching is a CUDA kernel; pass --factors '' for the smoke test")
    rows, t0 = [], time.time()
    for alpha in [float(a) for a in args.alphas.split(",")]:
        profile = TableProfile(args.rows, args.pooling, alpha)
        requests = batches_of(generate_lookups, profile, args.batch, args.batches, args.draws)
        bins = tuple(table_statistics(*requests[0]).bins)  # the bins the process stage would record
        table = Table(f"zipf{alpha}", args.rows, args.dim, args.pooling, bins=bins)
        task = Task.uniform("uvm", [table], 1, 64.0)
        backend = FbgemmBackend(RecordedLookups({table.name: TableRequests(*requests[0])}),
                                FbgemmConfig(batch_size=args.batch, device=args.device, warmup=5, iterations=15,
                                             memory_budget_gb=64.0, huge_pages=huge_pages_enabled()))
        pin_threads(backend)
        for factor in factors:
            fixed = backend.compute_cost(task, [Shard(table.name, 0, 0, args.dim, cache=factor)]).total_ms
            turn_ms, miss = rotating(table, requests, factor, args.device)
            row = {"alpha": alpha, "load_factor": factor, "fixed_ms": fixed, "rotating_ms": turn_ms,
                   "fbgemm_unique_miss_share": miss,
                   "model_hit_rate": None if factor is None else hit_rate(table, factor, args.batch)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    miss_factor = AnalyticConfig.__dataclass_fields__["uvm_miss_factor"].default
    for row in rows:  # slowdowns over the same skew's HBM table, measured and modelled
        hbm = next(r for r in rows if r["alpha"] == row["alpha"] and r["load_factor"] is None)
        row["fixed_over_hbm"] = row["fixed_ms"] / hbm["fixed_ms"]
        row["rotating_over_hbm"] = row["rotating_ms"] / hbm["rotating_ms"]
        row["model_over_hbm"] = 1.0 if row["load_factor"] is None else \
            1.0 + (miss_factor - 1.0) * (1.0 - row["model_hit_rate"])
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()
    record = {"device": name, "torch": torch.__version__, "fbgemm_gpu": fbgemm_version(),
              "python": platform.python_version(), "command": " ".join(["python -m tools.gpu_uvm", *sys.argv[1:]]),
              "seconds": round(time.time() - t0, 1), "batch": args.batch, "draws": args.draws,
              "table": {"rows": args.rows, "dim": args.dim,
              "pooling": args.pooling}, "rows": rows}
    (args.out / "uvm.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
