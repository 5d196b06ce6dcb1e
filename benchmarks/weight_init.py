"""Does where the weights live change what the CPU kernels time? And how much build time does each way take?

    python -m benchmarks.weight_init [--params params.yaml] [--family dlrm-80-8] [--tasks 4] [--rounds 4]

On the project's validation tasks (the tasks stage's output), each device of `size_lookup_greedy`'s plan is measured
with each `backend.fbgemm.weight_memory`: zeroed (FBGEMM's own buffer, every byte zeroed), fresh (a new buffer
it does not zero) and reused (one buffer kept across builds), in a rotating order round by round. Prints each
way's paired cost ratio over zeroed (median, and a 95% bootstrap interval of the mean over devices) and its wall
time per measurement. CPU timings, labelled with the CPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np

WAYS = ("zeroed", "fresh", "reused")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--family", default="dlrm-80-8")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args(argv)
    from dreamshard.project.backend import huge_pages_from_params

    huge_pages_from_params(args.params)  # before torch is imported
    from dreamshard.project.backend import backend_of
    from dreamshard.project.hardware import FbgemmBackend
    from dreamshard.project.params import load_params
    from dreamshard.project.sharders import make_sharder
    from dreamshard.project.tasks import read_split

    params = load_params(args.params)
    base = backend_of(params)
    if not isinstance(base, FbgemmBackend) or base.config.device != "cpu":
        raise SystemExit("benchmarks.weight_init: needs backend.name fbgemm on cpu (params backend)")
    ways = {w: FbgemmBackend(base.lookups, dataclasses.replace(base.config, weight_memory=w)) for w in WAYS}
    tasks = [t for t in read_split(params, "validation")
             if t.name.split("/")[1] == args.family][: args.tasks]
    if not tasks:
        raise SystemExit(f"benchmarks.weight_init: no validation task of family {args.family!r}")
    costs: dict[tuple, dict[str, float]] = {}
    wall = dict.fromkeys(ways, 0.0)
    for task in tasks:
        plan = make_sharder("size_lookup_greedy").shard(task)
        for r in range(args.rounds):
            for way in WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]:
                for d in range(task.num_devices):
                    start = time.perf_counter()
                    cost = ways[way].compute_cost(task, [s for s in plan.shards if s.device == d])
                    wall[way] += time.perf_counter() - start
                    costs.setdefault((task.name, r, d), {})[way] = cost.total_ms
    n = len(costs)
    print(f"{base.device_name()}, batch {base.batch_size}: {args.family}, {len(tasks)} tasks x {args.rounds} rounds, "
          f"{n} device measurements each way")
    rng = np.random.default_rng(0)
    for way in WAYS:
        ratios = np.array([c[way] / c["zeroed"] for c in costs.values()])
        low, high = np.quantile(rng.choice(ratios, (10_000, ratios.size)).mean(axis=1), [0.025, 0.975])
        print(f"{way:>7}: cost over zeroed median {statistics.median(ratios):.4f}, mean {ratios.mean():.4f} "
              f"[{low:.4f}, {high:.4f}]; wall per measurement {wall[way] / n:.4f} s")


if __name__ == "__main__":
    main()
