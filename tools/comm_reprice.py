"""What the input dist alone moves: the evaluate stage's test rows repriced without and with it, the same plans.

    python -m tools.comm_reprice OUT.json [--results data/eval/results.parquet] [--priced-by 2]

Each row keeps its measured compute; its communication is recomputed without the input dist (comm model 1) and with
it (2, hardware/comm.py), and the stage's own `family_summary` gives each family's ratios under both. `--priced-by`:
the comm model that priced the rows (2 from commit 5064be3 on; a results file from before it: 1). Nothing is
measured or planned; it reads the evaluate stage's test rows, as tools.model_error does.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _interval(compared: dict | None) -> dict | None:
    """A family_summary comparison's mean paired ratio and its 95% interval (what the README quotes)."""
    return None if compared is None else {k: round(float(compared[k]), 4) for k in ("mean_ratio", "ci_low", "ci_high")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.comm_reprice", description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--results", type=Path, default=None, help="a results.parquet (default: paths.eval's)")
    ap.add_argument("--priced-by", type=int, choices=(1, 2), default=2)
    ap.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (params evaluate.seed)")
    args = ap.parse_args(argv)
    import pandas as pd

    from dreamshard.project.domain import write_text
    from dreamshard.project.evaluation import evaluated_tasks, family_summary
    from dreamshard.project.model_error import input_dist_repriced
    from dreamshard.project.params import load_params, section

    params = load_params(args.params)
    path = args.results or Path(section(params, "paths.eval")) / "results.parquet"
    rows = pd.read_parquet(path)
    rows = rows[rows["split"] == "test"]
    tasks, _ = evaluated_tasks(params)
    priced = input_dist_repriced(rows, {t.name: t for t in tasks}, params, args.priced_by)
    keys = ("dreamshard_cut", "dreamshard", "neuroshard")
    out: dict = {"command": " ".join(["python -m tools.comm_reprice", *sys.argv[1:]]), "results": str(path),
                 "priced_by": args.priced_by, "families": {}}
    for label, column in (("without_input_dist", "cost_ms_without"), ("with_input_dist", "cost_ms_with")):
        summary = family_summary(priced.assign(cost_ms=priced[column]), seed=args.seed)
        for family, algos in summary.items():
            entry = out["families"].setdefault(family, {})
            entry[label] = {"torchrec_peer": algos.get("torchrec_peer"),
                            **{k: {r: _interval(algos[k].get(r)) for r in ("vs_torchrec_peer", "vs_best_heuristic")}
                               for k in keys if k in algos}}
    share = (priced["cost_ms_with"] - priced["cost_ms_without"]) / priced["cost_ms_with"]
    for (family, algo), value in share.groupby([priced["family"], priced["algorithm"]]).mean().items():
        out["families"][family].setdefault("input_dist_share_of_cost", {})[algo] = round(float(value), 6)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(json.dumps(out, indent=2) + "\n", args.out)
    f = lambda r: f"{r['mean_ratio']:.3f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"  # noqa: E731
    print("| family | dreamshard_cut / peer, without | with | peer without / with | input dist share of cost |")
    print("|---|---:|---:|---|---:|")
    for family, e in out["families"].items():
        a, b = e["without_input_dist"], e["with_input_dist"]
        print(f"| {family} | {f(a['dreamshard_cut']['vs_torchrec_peer'])} | {f(b['dreamshard_cut']['vs_torchrec_peer'])}"
              f" | `{a['torchrec_peer']}` / `{b['torchrec_peer']}` | {max(e['input_dist_share_of_cost'].values()):.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
