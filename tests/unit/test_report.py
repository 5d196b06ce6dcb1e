"""README's evaluation table (dreamshard.evaluation.report.eval_markdown): paired ratios with their
bootstrap intervals, win rates, the legend and per-family verdicts."""
from __future__ import annotations

import pandas as pd
import pytest

from dreamshard.evaluation.report import eval_markdown
from dreamshard.evaluation.summary import bootstrap_meta, family_summary

HEADER = {"backend": "analytic", "device": "model", "measured": False, "batch_size": 512,
          "additivity": {"fused_over_sum_of_singles": [1.5], "regime": "super_additive", "lower_bound": "lb"}}


def results(algorithms: dict[str, list[float]], family: str = "f") -> pd.DataFrame:
    """One row per task and algorithm: costs by task index."""
    return pd.DataFrame([{"task": f"{family}/{i}", "family": family, "algorithm": a, "cost_ms": c,
                          "cost_over_lb": c / 5.0, "planning_ms": 2.0}
                         for a, costs in algorithms.items() for i, c in enumerate(costs)])


def metrics(frame: pd.DataFrame, seed: int = 7, **extra) -> dict:
    return {**HEADER, "families": family_summary(frame, seed=seed), "bootstrap": bootstrap_meta(seed), **extra}


def table_rows(markdown: str) -> dict[str, list[str]]:
    """The table's cells by sharder name (the second column), the header row under "sharder"."""
    out = {}
    for line in markdown.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[cells[1]] = cells
    return out


FRAME = pd.concat([
    results({"size_greedy": [10.0, 10.0, 10.0, 10.0, 10.0],
             "lookup_greedy": [12.0, 12.5, 12.2, 12.4, 12.1],
             "dreamshard": [9.0, 9.2, 9.4, 9.1, 8.6],      # below 1 on every task
             "neuroshard": [8.0, 12.0, 9.0, 11.0, 10.0],   # mean 1.0, an interval across 1
             "torchrec": [10.0, 10.0, 10.0, 10.0, 10.0]}),
    results({"size_greedy": [10.0, 11.0, 9.0], "dreamshard": [10.5, 10.0, 9.5], "torchrec": [9.0, 9.0, 9.0],
             "torchrec_full": [9.0, 10.0, 9.0]}, family="g")])


def test_eval_markdown_has_intervals_win_rates_and_torchrec_full():
    m = metrics(FRAME)
    md = eval_markdown(m)
    rows = table_rows(md)
    assert rows["sharder"] == ["family", "sharder", "mean cost (ms)", "vs best heuristic (95% CI)",
                               "win rate vs best heuristic", "vs the TorchRec peer (95% CI)",
                               "cost / lower bound", "planning p50 (ms)"]
    ds = m["families"]["f"]["dreamshard"]["vs_best_heuristic"]
    cells = next(c for c in (line.strip("|").split("|") for line in md.splitlines())
                 if c[0].strip() == "f" and c[1].strip() == "dreamshard")
    cells = [c.strip() for c in cells]
    assert cells[2] == "9.06"
    assert cells[3] == f"{ds['mean_ratio']:.3f} [{ds['ci_low']:.2f}, {ds['ci_high']:.2f}]"
    assert cells[3].startswith("0.906 [0.8") and cells[4] == "100%"
    peer = m["families"]["f"]["dreamshard"]["vs_torchrec_peer"]  # f has torchrec alone: the peer is it
    assert m["families"]["f"]["torchrec_peer"] == "torchrec"
    assert cells[5] == f"{peer['mean_ratio']:.3f} [{peer['ci_low']:.2f}, {peer['ci_high']:.2f}]"
    assert cells[6] == "1.812" and cells[7] == "2.0"
    assert "| f | size_greedy (best heuristic) | 10.00 | 1.000 [1.00, 1.00] | 50% |" in md
    g = m["families"]["g"]["dreamshard"]
    b, t = g["vs_best_heuristic"], g["vs_torchrec_peer"]  # the peer: the TorchRec planner of lower mean cost there
    assert t == g[f"vs_{m['families']['g']['torchrec_peer']}"]
    assert b["mean_ratio"] == pytest.approx((1.05 + 10 / 11 + 9.5 / 9) / 3)  # per-task ratios, then the mean
    assert (f"| g | dreamshard | 10.00 | {b['mean_ratio']:.3f} [{b['ci_low']:.2f}, {b['ci_high']:.2f}] | 33% | "
            f"{t['mean_ratio']:.3f} [{t['ci_low']:.2f}, {t['ci_high']:.2f}] | 2.000 | 2.0 |") in md


def test_eval_markdown_legend_and_verdicts():
    md = eval_markdown(metrics(FRAME, seed=11, rounds=3))
    assert "Test tasks per family: f: 5, g: 3." in md
    assert ("Ratios are paired per task (a sharder's cost over the reference's on the same task, averaged over "
            "tasks); intervals are 95% percentile bootstrap over tasks (seed 11) with 10000 resamples; a sharder "
            "is called better only where the whole interval is below 1") in md
    assert "Each plan was measured in 3 rounds." in md
    assert "- f: better than the best heuristic (`size_greedy`): `dreamshard`; worse: `lookup_greedy`." in md
    assert "- g: no sharder is distinguishable from the best heuristic (`size_greedy`)." in md
    # without rounds in the metrics, no sentence about them; torchrec alone is the TorchRec column
    plain = eval_markdown(metrics(FRAME[FRAME["algorithm"] != "torchrec_full"]))
    assert "rounds" not in plain and "vs the TorchRec peer (95% CI)" in plain
    assert "(seed 7)" in plain
    # a family without any heuristic says so
    none = eval_markdown(metrics(pd.concat([FRAME, results({"dreamshard": [1.0], "torchrec": [2.0]}, "h")])))
    assert "- h: no heuristic was evaluated, nothing to compare with." in none


def test_eval_markdown_without_torchrec_has_no_torchrec_column():
    md = eval_markdown(metrics(FRAME[~FRAME["algorithm"].str.startswith("torchrec")]))
    assert "TorchRec" not in md
    assert table_rows(md)["sharder"][3:5] == ["vs best heuristic (95% CI)", "win rate vs best heuristic"]


def test_generalisation_table_splits_each_trained_sharders_ratios_by_what_is_new():
    from dreamshard.evaluation.report import generalisation_markdown
    from dreamshard.evaluation.summary import with_ratios

    test = pd.concat([results({"lookup_greedy": [10, 10, 10, 10], "dreamshard": [8, 9, 8, 9]}, "seen-4"),
                      results({"lookup_greedy": [10, 10, 10, 10], "dreamshard": [12, 11, 12, 11]}, "big-8")])
    train = results({"lookup_greedy": [10, 10, 10], "dreamshard": [9, 9, 9]}, "seen-4")
    families, train_families = family_summary(test, seed=1), family_summary(train, seed=1)
    gen = {"dreamshard": {"trained_on": ["seen-4"], "test_families": {
        "seen-4": {"unseen_tables": True, "unseen_table_count": False, "unseen_device_count": False},
        "big-8": {"unseen_tables": True, "unseen_table_count": True, "unseen_device_count": True}}}}
    table = with_ratios(gen, families, train_families)["dreamshard"]
    assert table["test_families"]["seen-4"]["vs_best_heuristic"]["mean_ratio"] == pytest.approx(0.85)
    assert table["test_families"]["big-8"]["vs_best_heuristic"]["worse"]
    assert table["training_tasks"]["seen-4"]["mean_ratio"] == pytest.approx(0.9)
    md = generalisation_markdown({**HEADER, "families": families, "train_families": train_families,
                                  "generalisation": gen})
    rows = [line for line in md.splitlines() if line.startswith("| dreamshard")]
    assert [r.split(" | ")[2:4] for r in rows] == [["seen-4 (training tasks)", "nothing"], ["seen-4", "tables"],
                                                   ["big-8", "tables, table count, device count"]]
    assert "0.900" in rows[0] and "0.850" in rows[1] and "1.150" in rows[2]
    assert generalisation_markdown({**HEADER, "families": families}) == ""
    # a page split by family (report --families): the other family's rows are gone from both tables
    from dreamshard.evaluation.report import only_families, summary_markdown

    split = summary_markdown(only_families({**HEADER, "families": families, "train_families": train_families,
                                            "generalisation": gen}, ["big-8"]))
    lines = split.splitlines()
    assert any(line.startswith("| big-8 |") for line in lines) and not any(line.startswith("| seen-4 |") for line in lines)
    assert "seen-4 (training tasks)" in split and "| seen-4 | tables |" not in split
    with pytest.raises(SystemExit, match="--families: nope not in"):
        only_families({"families": families}, ["nope"])
