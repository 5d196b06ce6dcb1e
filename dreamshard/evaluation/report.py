"""Markdown summaries of metrics/eval.json, for results pages and Prefect artifacts."""
from __future__ import annotations

import re
from pathlib import Path

BEGIN = "<!-- eval-summary:begin (python -m dreamshard.evaluation.report) -->"
END = "<!-- eval-summary:end -->"


def _header(metrics: dict) -> str:
    kind = "measured" if metrics.get("measured") else "modelled, not measured"
    additivity = metrics["additivity"]
    ratios = ", ".join(f"{r:.2f}" for r in additivity.get("fused_over_sum_of_singles", []))
    costliest = additivity.get("fused_over_costliest_single")  # metrics written since the non-monotone bound
    monotone = f"; fused / costliest single table: {', '.join(f'{r:.2f}' for r in costliest)}" if costliest else ""
    return (f"Backend `{metrics['backend']}` on {metrics['device']} ({kind}), batch {metrics.get('batch_size')}; "
            f"test tasks. Fusion regime measured on this machine: {additivity['regime']} "
            f"(fused / sum of single-table costs: {ratios}{monotone}); lower bound: {additivity['lower_bound']}.")


def _sharders(algos: dict) -> dict[str, dict]:
    """A family's sharder entries (its other keys, such as best_heuristic, are not dicts)."""
    return {a: v for a, v in algos.items() if isinstance(v, dict)}


def _interval(c: dict | None) -> str:
    return f"{c['mean_ratio']:.3f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]" if c else "–"


def _names(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def eval_markdown(metrics: dict) -> str:
    """Per family and sharder: measured cost; the paired per-task cost ratio to the best heuristic with its
    bootstrap interval and win rate, and to TorchRec (the peer where named, else torchrec_full, else torchrec); cost /
    lower bound; planning time. Then a legend (tasks per family, how the intervals were drawn, rounds
    per plan) and, per family, which sharders are better or worse than the best heuristic."""
    families = metrics["families"]
    entries = [v for algos in families.values() for v in _sharders(algos).values()]
    boot = metrics.get("bootstrap", {})
    level = f"{100 * boot.get('level', 0.95):g}%"
    torchrec = next((r for r in ("torchrec_peer", "torchrec_full", "torchrec") if any(f"vs_{r}" in v for v in entries)),
                    None)
    head = ["family", "sharder", "mean cost (ms)", f"vs best heuristic ({level} CI)", "win rate vs best heuristic"]
    if torchrec:
        head.append(f"vs the TorchRec peer ({level} CI)" if torchrec == "torchrec_peer" else
                    f"vs TorchRec (`{torchrec}`, {level} CI)")
    head += ["cost / lower bound", "planning p50 (ms)"]
    lines = [_header(metrics), "", "| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    verdicts = []
    for family, algos in families.items():
        best = algos.get("best_heuristic")
        better, worse = [], []
        for algo, v in _sharders(algos).items():
            c = v.get("vs_best_heuristic")
            cells = [family, f"{algo}{' (best heuristic)' if algo == best else ''}", f"{v['mean_cost_ms']:.2f}",
                     _interval(c), f"{100 * c['win_rate']:.0f}%" if c else "–"]
            if torchrec:
                cells.append(_interval(v.get(f"vs_{torchrec}")))
            cells += [f"{v['mean_cost_over_lb']:.3f}", f"{v['planning_ms_p50']:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
            if c and c["better"]:
                better.append(algo)
            elif c and c["worse"]:
                worse.append(algo)
        if not best:
            verdicts.append(f"- {family}: no heuristic was evaluated, nothing to compare with.")
        elif not better and not worse:
            verdicts.append(f"- {family}: no sharder is distinguishable from the best heuristic (`{best}`).")
        else:
            verdicts.append(f"- {family}: better than the best heuristic (`{best}`): {_names(better) or 'none'}; "
                            f"worse: {_names(worse) or 'none'}.")
    counts = {}
    for family, algos in families.items():
        tasks = [v["vs_best_heuristic"]["tasks"] for v in _sharders(algos).values() if "vs_best_heuristic" in v]
        counts[family] = max(tasks) if tasks else max((v["num_tasks"] for v in _sharders(algos).values()), default=0)
    per_family = ", ".join(f"{f}: {n}" for f, n in counts.items())
    seed = f"seed {boot['seed']}" if "seed" in boot else "seed not recorded"
    resamples = f" with {boot['resamples']} resamples" if "resamples" in boot else ""
    legend = (f"Test tasks per family: {per_family}. Ratios are paired per task (a sharder's cost over the "
              f"reference's on the same task, averaged over tasks); intervals are {level} percentile bootstrap "
              f"over {boot.get('over', 'tasks')} ({seed}){resamples}; a sharder is called better only where the "
              f"whole interval is below 1, worse only where it is above 1. The win rate is the share of tasks where the sharder "
              f"costs less than the best heuristic (a tie counts one half).")
    if "rounds" in metrics:
        legend += f" Each plan was measured in {metrics['rounds']} round{'s' if metrics['rounds'] != 1 else ''}."
    return "\n".join(lines + ["", legend, ""] + verdicts) + "\n"


def generalisation_markdown(metrics: dict) -> str:
    """For each sharder trained on task families: the families it trained on, then its paired cost ratio to the
    best heuristic on each family's training tasks (nothing new) and test tasks, with what each test family is
    new in (tables, table count, device count). Empty when the metrics hold no trained sharder."""
    gen = metrics.get("generalisation") or {}
    if not gen:
        return ""
    level = f"{100 * metrics.get('bootstrap', {}).get('level', 0.95):g}%"
    lines = ["| sharder | trained on | tasks | new to the sharder | vs best heuristic "
             f"({level} CI) | win rate |", "|---|---|---|---|---:|---:|"]
    for algo, g in gen.items():
        trained = ", ".join(g.get("trained_on", [])) or "–"
        rows = [(f"{f} (training tasks)", "nothing", metrics.get("train_families", {}).get(f, {}).get(algo))
                for f in g.get("trained_on", []) if f in metrics.get("train_families", {})]
        for family, new in g.get("test_families", {}).items():
            unseen = [w for w, key in (("tables", "unseen_tables"), ("table count", "unseen_table_count"),
                                       ("device count", "unseen_device_count")) if new.get(key)]
            rows.append((family, ", ".join(unseen) or "nothing", metrics["families"].get(family, {}).get(algo)))
        for tasks, what, v in rows:
            c = (v or {}).get("vs_best_heuristic")
            win = f"{100 * c['win_rate']:.0f}%" if c else "–"
            lines.append(f"| {algo} | {trained} | {tasks} | {what} | {_interval(c)} | {win} |")
    return "\n".join(lines) + "\n"


def summary_markdown(metrics: dict) -> str:
    """eval_markdown, then the generalisation table where the metrics hold one."""
    gen = generalisation_markdown(metrics)
    if gen:
        gen = f"\nGeneralisation of the trained sharders (the same ratios, by what each family is new in):\n\n{gen}"
    return eval_markdown(metrics) + gen


def replace_block(readme: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace what lies between the markers `begin` and `end` of `readme` with `text`."""
    old = readme.read_text()
    if begin not in old or end not in old:
        raise ValueError(f"{readme}: no block to replace ({begin} ... {end})")
    block = f"{begin}\n{text}{end}"
    readme.write_text(re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, old, flags=re.S))


def only_families(metrics: dict, families: list[str]) -> dict:
    """`metrics` with only `families` among its test families (and in its generalisation table); a family it does
    not hold is an error."""
    missing = sorted(set(families) - set(metrics.get("families", {})))
    if missing:
        raise SystemExit(f"--families: {', '.join(missing)} not in the metrics' test families "
                         f"({', '.join(metrics.get('families', {}))})")
    out = {**metrics, "families": {f: v for f, v in metrics["families"].items() if f in families}}
    out["generalisation"] = {algo: {**g, "test_families": {f: v for f, v in g.get("test_families", {}).items()
                                                           if f in families}}
                             for algo, g in metrics.get("generalisation", {}).items()}
    return out


def update_readme(readme: Path, metrics: dict) -> None:
    """Replace the summary block of a results page (a markdown file) with the table of `metrics`."""
    replace_block(readme, summary_markdown(metrics))


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Regenerate the evaluation summary block of a results page "
                                                 "from metrics/eval.json (README's headline table: "
                                                 "python -m dreamshard.evaluation.readme_table)")
    parser.add_argument("--metrics", type=Path, default=Path("metrics/eval.json"))
    parser.add_argument("--readme", type=Path, default=Path("results/README-history.md"))
    parser.add_argument("--families", help="comma-separated: only these test families (default: all), so that a "
                                           "page of many families can be split in two")
    args = parser.parse_args()
    metrics = json.loads(args.metrics.read_text())
    if args.families:
        metrics = only_families(metrics, args.families.split(","))
    update_readme(args.readme, metrics)
    print(f"{args.readme}: summary regenerated from {args.metrics}")
