"""Markdown summaries of metrics/eval.json, for README and Prefect artifacts."""
from __future__ import annotations

import re
from pathlib import Path

BEGIN = "<!-- eval-summary:begin (python -m dreamshard.evaluation.report) -->"
END = "<!-- eval-summary:end -->"


def eval_markdown(metrics: dict) -> str:
    """Per family and sharder: measured cost, relative to the best heuristic and to the lower bound."""
    kind = "measured" if metrics.get("measured") else "modelled, not measured"
    additivity = metrics["additivity"]
    ratios = ", ".join(f"{r:.2f}" for r in additivity.get("fused_over_sum_of_singles", []))
    lines = [
        f"Backend `{metrics['backend']}` on {metrics['device']} ({kind}), batch {metrics.get('batch_size')}; "
        f"test tasks. Fusion regime measured on this machine: {additivity['regime']} "
        f"(fused / sum of single-table costs: {ratios}); lower bound: {additivity['lower_bound']}.",
        "",
        "| family | sharder | mean cost (ms) | vs best heuristic | cost / lower bound | planning p50 (ms) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for family, algos in metrics["families"].items():
        best = algos.get("best_heuristic")
        for algo, v in algos.items():
            if not isinstance(v, dict):
                continue
            rel = v["mean_cost_ms"] / algos[best]["mean_cost_ms"] if best else float("nan")
            lines.append(f"| {family} | {algo}{' (best heuristic)' if algo == best else ''} | "
                         f"{v['mean_cost_ms']:.2f} | {rel:.3f} | {v['mean_cost_over_lb']:.3f} | {v['planning_ms_p50']:.1f} |")
    return "\n".join(lines) + "\n"


def update_readme(readme: Path, metrics: dict) -> None:
    """Replace the summary block of README with the table of `metrics`."""
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme}: no summary block ({BEGIN} ... {END})")
    block = f"{BEGIN}\n{eval_markdown(metrics)}{END}"
    readme.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S))


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Regenerate README's evaluation summary from metrics/eval.json")
    parser.add_argument("--metrics", type=Path, default=Path("metrics/eval.json"))
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    args = parser.parse_args()
    update_readme(args.readme, json.loads(args.metrics.read_text()))
    print(f"{args.readme}: summary regenerated from {args.metrics}")
