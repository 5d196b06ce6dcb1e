"""Does planning repeat from one process to the next? Digests of every evaluated sharder's plans of validation tasks.

    PYTHONHASHSEED=1 python -m tools.plan_digests A.json [--families F,G] [--tasks N] [--sharders S,T]
                                                         [--stock-enumeration]
    PYTHONHASHSEED=2 python -m tools.plan_digests B.json [the same options]
    python -m tools.plan_digests --compare A.json B.json

Plans with the evaluate stage's sharders and trained models (a finished `make run`), on the first N validation tasks
of each family (never the test pool); writes each plan's digest with the process's PYTHONHASHSEED. `--compare`
prints, per sharder, how many plans differ between two such files, and exits 1 when any does.
`--stock-enumeration`: TorchRec's planners enumerate through TorchRec's own EmbeddingEnumerator, as a TorchRec user's
planner does (interop.torchrec's keeps its sharder's order). Nothing is measured here.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
from collections import Counter
from pathlib import Path


def compare(a: dict, b: dict) -> tuple[Counter, Counter]:
    """Per sharder: plans of the same task in both files, and how many of them differ."""
    both, differ = Counter(), Counter()
    for key, digest in a["plans"].items():
        if key in b["plans"]:
            sharder = key.rsplit(" ", 1)[1]
            both[sharder] += 1
            differ[sharder] += digest != b["plans"][key]
    return both, differ


def digests(params_file: Path, families: list[str] | None, num_tasks: int, stock: bool,
            names: list[str] | None = None) -> dict:
    from dreamshard.project.evaluation import make_sharders
    from dreamshard.project.params import load_params, section
    from dreamshard.project.tasks import read_split

    params = load_params(params_file)
    tasks = read_split(params, "validation")
    sharders = make_sharders(params, int(section(params, "backend.batch_size")), names=names)
    plans = {}
    with contextlib.ExitStack() as stack:
        if stock:
            from dreamshard.project.torchrec import stock_enumeration

            stack.enter_context(stock_enumeration())
        for family in families or list(dict.fromkeys(t.family for t in tasks)):
            for task in [t for t in tasks if t.family == family][:num_tasks]:
                for sharder in sharders:
                    plan = sharder.shard(task)
                    plans[f"{task.name} {sharder.name}"] = hashlib.sha1(repr(plan.key()).encode()).hexdigest()
    return {"python_hash_seed": os.environ.get("PYTHONHASHSEED"), "stock_enumeration": stock, "plans": plans}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.plan_digests", description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--families", help="comma-separated validation families (default: all)")
    ap.add_argument("--tasks", type=int, default=2, help="the first N validation tasks of each family")
    ap.add_argument("--sharders", help="comma-separated sharders (default: evaluate.sharders)")
    ap.add_argument("--stock-enumeration", action="store_true", help="TorchRec's own EmbeddingEnumerator")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"))
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        both, differ = compare(a, b)
        if not both:
            ap.error(f"{args.compare[0]} and {args.compare[1]} share no planned task")
        for sharder in both:
            print(f"{sharder:20} {differ[sharder]:3d} of {both[sharder]:3d} plans differ")
        return 1 if sum(differ.values()) else 0
    if args.out is None:
        ap.error("give OUT.json, or --compare A.json B.json")
    from dreamshard.project.domain import write_text

    families = args.families.split(",") if args.families else None
    names = args.sharders.split(",") if args.sharders else None
    result = digests(args.params, families, args.tasks, args.stock_enumeration, names)
    write_text(json.dumps(result, indent=1), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
