"""Does leaving unread weights unwritten change what the CPU kernels time? And how much build time does it save?

    python -m benchmarks.weight_init [--params params.yaml] [--family dlrm-80-8] [--tasks 4] [--rounds 4]

On the project's test tasks (the tasks stage's output), each device of `size_lookup_greedy`'s plan is measured
with FBGEMM zeroing every weight (`zero_weights: true`) and with the rows nobody reads left unwritten (the
default), in alternating order round by round. Prints the paired cost ratio unwritten / zeroed (median and a 95%
bootstrap interval of the mean over devices) and the wall time of both ways. CPU timings, labelled with the CPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--family", default="dlrm-80-8")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args(argv)
    from pipeline.__main__ import huge_pages_from_params

    huge_pages_from_params(args.params)  # before torch is imported
    from dreamshard.hardware.fbgemm import FbgemmBackend
    from dreamshard.project.backend import backend_of
    from dreamshard.project.params import load_params, section
    from dreamshard.sharders import make_sharder
    from dreamshard.tasks import read_tasks

    params = load_params(args.params)
    unwritten = backend_of(params)
    if not isinstance(unwritten, FbgemmBackend) or unwritten.config.device != "cpu":
        raise SystemExit("benchmarks.weight_init: needs backend.name fbgemm on cpu (params backend)")
    zeroed = FbgemmBackend(unwritten.lookups, dataclasses.replace(unwritten.config, zero_weights=True))
    tasks = [t for t in read_tasks(f"{section(params, 'paths.tasks')}/test.parquet", section(params, "paths.tables"))
             if t.name.split("/")[1] == args.family][: args.tasks]
    if not tasks:
        raise SystemExit(f"benchmarks.weight_init: no test task of family {args.family!r}")
    ways = {"zeroed": zeroed, "unwritten": unwritten}
    costs: dict[tuple, dict[str, float]] = {}
    wall = dict.fromkeys(ways, 0.0)
    for task in tasks:
        plan = make_sharder("size_lookup_greedy").shard(task)
        for r in range(args.rounds):
            for way in (("zeroed", "unwritten") if r % 2 == 0 else ("unwritten", "zeroed")):
                for d in range(task.num_devices):
                    start = time.perf_counter()
                    cost = ways[way].compute_cost(task, [s for s in plan.shards if s.device == d])
                    wall[way] += time.perf_counter() - start
                    costs.setdefault((task.name, r, d), {})[way] = cost.total_ms
    ratios = np.array([c["unwritten"] / c["zeroed"] for c in costs.values()])
    rng = np.random.default_rng(0)
    means = rng.choice(ratios, (10_000, ratios.size)).mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    print(f"{unwritten.device_name()}, batch {unwritten.batch_size}: {args.family}, {len(tasks)} tasks x "
          f"{args.rounds} rounds, {ratios.size} device measurements each way")
    print(f"cost unwritten / zeroed: median {statistics.median(ratios):.4f}, mean {ratios.mean():.4f} "
          f"[{low:.4f}, {high:.4f}]")
    print(f"wall per measurement (s): zeroed {wall['zeroed'] / ratios.size:.4f}, "
          f"unwritten {wall['unwritten'] / ratios.size:.4f}")


if __name__ == "__main__":
    main()
