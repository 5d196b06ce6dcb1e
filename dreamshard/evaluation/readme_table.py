"""README's headline tables, built from metrics/eval.json (issue 35).

Per test family, the key sharders' mean cost over the family's best heuristic, and over TorchRec's full
planner (`torchrec_full`, what users plan with today), paired per task, with the 95% bootstrap intervals that
metrics/eval.json records (dreamshard.evaluation.summary). README embeds the output between
`<!-- headline:start -->` and `<!-- headline:end -->`; tests/unit/test_readme.py checks that they agree. Print it,
or write it into README between the markers:

    python -m dreamshard.evaluation.readme_table [metrics/eval.json] [--readme README.md]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

START = "<!-- headline:start -->"
END = "<!-- headline:end -->"

# (key in metrics/eval.json, column heading): the figures README has always led with
COLUMNS: tuple[tuple[str, str], ...] = (
    ("dreamshard", "DreamShard"),
    ("dreamshard_cut", "DreamShard with cuts"),
    ("neuroshard", "NeuroShard"),
    ("torchrec_full", "TorchRec (`torchrec_full`)"),
)
# against torchrec_full: ours, and the best heuristic (its entry is the family's `best_heuristic`)
VS_TORCHREC: tuple[tuple[str, str], ...] = (
    ("dreamshard", "DreamShard"),
    ("dreamshard_cut", "DreamShard with cuts"),
    ("neuroshard", "NeuroShard"),
    ("best_heuristic", "best heuristic"),
)


def _cell(entry: dict | None, key: str = "vs_best_heuristic") -> str:
    """`mean [low, high]` of an entry's ratio (`key`); `–` where the sharder was not evaluated."""
    c = entry.get(key) if isinstance(entry, dict) else None
    if not c:
        return "–"
    return f"{c['mean_ratio']:.3f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]"


def _tasks(algos: dict) -> str:
    counts = {int(v["num_tasks"]) for v in algos.values() if isinstance(v, dict) and v.get("num_tasks")}
    return "/".join(str(n) for n in sorted(counts)) or "?"


def torchrec_reference(metrics: dict) -> tuple[str, str]:
    """The ratio key of the second table and its words: the TorchRec peer (per family the TorchRec planner of lowest
    mean cost, `torchrec_peer`) where the metrics name one, else `torchrec_full` (metrics written before the peer)."""
    if any(isinstance(a, dict) and a.get("torchrec_peer") for a in metrics.get("families", {}).values()):
        return "vs_torchrec_peer", "the TorchRec peer (per family its best planner, told our cluster)"
    return "vs_torchrec_full", "TorchRec's full planner (`torchrec_full`)"


def headline_markdown(metrics: dict) -> str:
    """The headline table of a metrics/eval.json already read."""
    kind = "measured" if metrics.get("measured") else "modelled, not measured"
    level = metrics.get("bootstrap", {}).get("level", 0.95)
    over = metrics.get("bootstrap", {}).get("over", "tasks")
    lines = [
        f"Mean cost over the best heuristic per test family (below 1: cheaper), paired per task, with "
        f"{level:.0%} bootstrap intervals over the {over}. Backend `{metrics.get('backend', '?')}` on "
        f"{metrics.get('device', 'an unrecorded device')} ({kind}), batch {metrics.get('batch_size', '?')}.",
        "",
        "| family | tasks | best heuristic | " + " | ".join(h for _, h in COLUMNS) + " |",
        "|---|---:|---|" + "---:|" * len(COLUMNS),
    ]
    for family, algos in metrics.get("families", {}).items():
        best = algos.get("best_heuristic", "?")
        cells = " | ".join(_cell(algos.get(key)) for key, _ in COLUMNS)
        lines.append(f"| {family} | {_tasks(algos)} | `{best}` | {cells} |")
    key_vs, heading = torchrec_reference(metrics)
    lines += ["", f"Mean cost over {heading}, on the same tasks and terms:", "",
              "| family | " + " | ".join(h for _, h in VS_TORCHREC) + " |", "|---|" + "---:|" * len(VS_TORCHREC)]
    for family, algos in metrics.get("families", {}).items():
        named = {key: algos.get(algos.get("best_heuristic", "") if key == "best_heuristic" else key)
                 for key, _ in VS_TORCHREC}
        lines.append(f"| {family} | " + " | ".join(_cell(named[key], key_vs) for key, _ in VS_TORCHREC) + " |")
    return "\n".join(lines) + "\n"


def headline_table(metrics_path: str | Path) -> str:
    """README's headline table from the metrics file at `metrics_path` (metrics/eval.json)."""
    return headline_markdown(json.loads(Path(metrics_path).read_text()))


def readme_block(readme_text: str) -> str:
    """What README holds between the headline markers, without the newline after the start marker."""
    start = readme_text.index(START) + len(START)
    return readme_text[start:readme_text.index(END, start)].removeprefix("\n")


def with_headline(readme_text: str, table: str) -> str:
    """`readme_text` with `table` between the headline markers."""
    start = readme_text.index(START) + len(START)
    return readme_text[:start] + "\n" + table + readme_text[readme_text.index(END, start):]


def main(argv: list[str] | None = None) -> int:
    import argparse

    from dreamshard.io import write_text

    parser = argparse.ArgumentParser(prog="python -m dreamshard.evaluation.readme_table",
                                     description="README's headline tables from metrics/eval.json")
    parser.add_argument("metrics", nargs="?", default="metrics/eval.json", help="default: metrics/eval.json")
    parser.add_argument("--readme", type=Path, help="write the tables into this README between the headline "
                                                     "markers, in place of printing them")
    args = parser.parse_args(argv)
    try:
        metrics = json.loads(Path(args.metrics).read_text())
    except FileNotFoundError:
        raise SystemExit(f"readme_table: {args.metrics}: no such file (the evaluate stage writes it)") from None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"readme_table: {args.metrics}: not JSON ({exc})") from None
    if not isinstance(metrics, dict) or not isinstance(metrics.get("families"), dict) or not metrics["families"]:
        raise SystemExit(f"readme_table: {args.metrics}: not an evaluation's metrics: expected an object with "
                         "'families' per test family (metrics/eval.json)")
    table = headline_markdown(metrics)
    if args.readme is None:
        print(table, end="")
        return 0
    text = args.readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"readme_table: {args.readme}: no {START} ... {END} markers to write the table between")
    write_text(with_headline(text, table), args.readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
