"""Each cost model's error on the plans the evaluate stage measured, per test family (holdout families beside the
default ones): DreamShard's cost network, NeuroShard's models, TorchRec's perf model and TorchRec's calibrated one.

    python -m tools.model_error OUT.json [--params params.yaml]

Reads the evaluate stage's results (paths.eval/results.parquet), its test tasks, the trained models and the
collected measurements (for the calibration) of a finished `make run`; writes OUT.json (per family and model:
mape, bias, tau, plans; dreamshard.project.model_error) and prints a table. Nothing is measured here.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.model_error", description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    args = ap.parse_args(argv)
    import pandas as pd

    from dreamshard.project.domain import write_text
    from dreamshard.project.evaluation import evaluated_tasks
    from dreamshard.project.model_error import estimates_of, model_error
    from dreamshard.project.params import load_params, section

    params = load_params(args.params)
    results = pd.read_parquet(Path(section(params, "paths.eval")) / "results.parquet")
    results = results[results["split"] == "test"]
    tasks, _ = evaluated_tasks(params)
    estimates = estimates_of(params)
    summary = model_error(results, tasks, estimates)
    devices = sorted(results["device_name"].unique())
    write_text(json.dumps({"command": " ".join(["python -m tools.model_error", *sys.argv[1:]]), "device": devices,
                           "families": summary}, indent=2) + "\n", args.out)
    names = list(estimates)
    print("| family | " + " | ".join(f"{n} MAPE | bias | tau" for n in names) + " |")
    print("|---|" + "---:|" * (3 * len(names)))
    for family, by_model in summary.items():
        cells = []
        for n in names:
            m = by_model[n]
            cells += [f"{m['mape']:.2f}", f"{m['bias']:+.2f}", "-" if m["tau"] is None else f"{m['tau']:.2f}"]
        print(f"| {family} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
