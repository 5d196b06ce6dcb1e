"""The evaluate stage's per-family summary of the tasks an evaluate journal holds, where the run stopped before its end.

    python -m tools.journal_summary JOURNAL_DIR OUT_DIR [--seed 0]

A GPU call that runs out of time leaves the tasks it measured in its journal (dreamshard/evaluation/journal.py) and
no metrics. This summarises those rows with the stage's own functions (`family_summary`, the cost-ratio table and
figure): OUT_DIR/eval_partial.json (which tasks there were, by split and family, beside the summaries),
eval_cost_ratio.csv and eval_cost_ratio.png; `pooled`: each sharder over every test family's tasks at once, against
each family's best heuristic and TorchRec peer. Nothing is measured here; the rows keep their device and versions.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd


def journal_rows(folder: Path) -> pd.DataFrame:
    files = sorted(folder.glob("task-*.parquet"))
    if not files:
        raise SystemExit(f"{folder}: no task-*.parquet files (an evaluate journal holds one per task)")
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.journal_summary", description=__doc__.split("\n")[0])
    ap.add_argument("journal", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (params evaluate.seed)")
    ap.add_argument("--name", default="eval_partial.json", help="the summary's file name in OUT_DIR (default: "
                    "eval_partial.json; eval_summary.json for a journal of a whole run)")
    args = ap.parse_args(argv)
    from dreamshard.project.domain import write_text
    from dreamshard.project.evaluation import bootstrap_meta, cost_ratio_figure, cost_ratio_table, family_summary, pooled_summary

    rows = journal_rows(args.journal)
    devices = sorted(rows["device_name"].unique())
    counts = rows.groupby(["split", "family"])["task"].nunique()
    metrics = {
        "source": str(args.journal), "command": " ".join(["python -m tools.journal_summary", *sys.argv[1:]]),
        "device": devices, "measured": bool(rows["measured"].all()),
        "tasks": {f"{s}/{f}": int(n) for (s, f), n in counts.items()},
        "bootstrap": bootstrap_meta(args.seed),
        "families": family_summary(rows[rows["split"] == "test"], seed=args.seed),
        "train_families": family_summary(rows[rows["split"] == "train"], seed=args.seed),
        # every test family's tasks at once, each against its own family's references
        "pooled": pooled_summary(rows[rows["split"] == "test"], seed=args.seed),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(json.dumps(metrics, indent=2) + "\n", args.out / args.name)
    cost_ratio_table(metrics["families"]).to_csv(args.out / "eval_cost_ratio.csv", index=False)
    cost_ratio_figure(metrics["families"], args.out / "eval_cost_ratio.png", backend=str(rows["backend"].iloc[0]),
                      device=", ".join(devices), measured=metrics["measured"])
    print(f"journal_summary: {len(rows)} rows of {rows['task'].nunique()} tasks -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
