"""Each cost model's error on the plans the evaluate stage measured, per test family (holdout families beside the
default ones): DreamShard's cost network, NeuroShard's models, TorchRec's perf model and TorchRec's calibrated one.

    python -m tools.model_error OUT.json [--params params.yaml]

Reads the evaluate stage's results (paths.eval/results.parquet), its test tasks, the trained models and the
collected measurements (for the calibration) of a finished `make run`; writes OUT.json (per family and model:
mape, bias, tau, plans; dreamshard.project.model_error) and prints a table. `--blend`: also a blend of the cost
network and the calibrated model fitted on the training tasks' plans. `--also LABEL=DIR`: also the learned models
of another finished project folder (its own params.yaml's model paths), named "cost_network@LABEL" and
"neuroshard@LABEL": models trained otherwise, rated on the same plans. Nothing is measured here.
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
    ap.add_argument("--blend", action="store_true", help="also a log-linear blend of the cost network and TorchRec's "
                    "calibrated model, fitted on the evaluate stage's training-task plans (model_error.fitted_blend)")
    ap.add_argument("--also", action="append", default=[], metavar="LABEL=DIR",
                    help="the learned models of another project folder, rated on the same plans (repeatable)")
    args = ap.parse_args(argv)
    also = []
    for spec in args.also:
        label, sep, folder = spec.partition("=")
        if not sep or not label or not (Path(folder) / "params.yaml").is_file():
            ap.error(f"--also {spec!r}: expected LABEL=DIR with DIR a project folder holding params.yaml")
        also.append((label, Path(folder)))
    import pandas as pd

    from dreamshard.project.domain import write_text
    from dreamshard.project.evaluation import evaluated_tasks, reported_train_tasks
    from dreamshard.project.model_error import estimates_of, fitted_blend, learned_estimates_of, model_error
    from dreamshard.project.params import load_params, section

    params = load_params(args.params)
    rows = pd.read_parquet(Path(section(params, "paths.eval")) / "results.parquet")
    results = rows[rows["split"] == "test"]
    tasks, _ = evaluated_tasks(params)
    estimates = estimates_of(params)
    for label, folder in also:
        estimates.update({f"{name}@{label}": rate for name, rate in learned_estimates_of(folder).items()})
    out: dict = {"command": " ".join(["python -m tools.model_error", *sys.argv[1:]]),
                 "device": sorted(results["device_name"].unique())}
    if args.blend:
        estimates["blend"], weights = fitted_blend(rows[rows["split"] == "train"], reported_train_tasks(params),
                                                   estimates["cost_network"], estimates["torchrec_calibrated"])
        out["blend"] = {"log_weights": {"constant": weights[0], "cost_network": weights[1],
                                        "torchrec_calibrated": weights[2]},
                        "fitted_on": "the evaluate stage's training-task plans"}
    out["families"] = model_error(results, tasks, estimates)
    write_text(json.dumps(out, indent=2) + "\n", args.out)
    summary = out["families"]
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
