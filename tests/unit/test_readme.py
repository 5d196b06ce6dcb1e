"""README is an entry point, not a lab notebook (issue 35): at most 12 KB, its one results table generated from
metrics/eval.json, and every relative link in README and docs/ pointing to a file that exists."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dreamshard.evaluation.readme_table import END, START, headline_markdown, headline_table, main, readme_block
from helpers import PROJECT_ROOT as ROOT

README = ROOT / "README.md"
METRICS = ROOT / "metrics" / "eval.json"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "results").glob("**/*.md"))]

# [text](target) and ![alt](target), target up to a space or ')'; reference definitions `[x]: target`
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s*\[[^\]]+\]:\s*(\S+)", re.M)


def relative_links(text: str) -> list[str]:
    """Targets of a Markdown page's links that point into the repository (no scheme, no pure anchor);
    links inside fenced or indented code are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("    "))
    targets = [a or b for a, b in LINK.findall(text)]
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]


def test_readme_is_at_most_12_kb():
    assert README.stat().st_size <= 12 * 1024, README.stat().st_size


def test_readme_headline_table_is_generated_from_metrics():
    text = README.read_text()
    assert text.count(START) == 1 and text.count(END) == 1
    assert readme_block(text) == headline_table(METRICS), (
        "README's headline table differs from metrics/eval.json: paste the output of "
        "`python -m dreamshard.evaluation.readme_table` between the headline markers")


def test_readme_keeps_no_dated_measurement_outside_the_table():
    text = README.read_text()
    outside = text[:text.index(START)] + text[text.index(END):]
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", outside)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files(page: Path):
    missing = [t for t in relative_links(page.read_text())
               if not (page.parent / t.split("#", 1)[0]).exists()]
    assert not missing, f"{page.relative_to(ROOT)}: {missing}"


def test_relative_links_are_found():
    text = "[a](docs/x.md) ![b](plots/y.png) [c](https://e.org) [d](#here) [e](f.md#s)\n    [g](code.md)\n"
    assert relative_links(text) == ["docs/x.md", "plots/y.png", "f.md#s"]


def test_headline_table_per_family():
    metrics = json.loads(METRICS.read_text())
    table = headline_markdown(metrics)
    families = list(metrics["families"])
    rows = [line for line in table.splitlines() if line.split(" | ")[0].removeprefix("| ") in families]
    # two tables: over the best heuristic, then over torchrec_full
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows] == families + families
    first = families[0]
    c = metrics["families"][first]["dreamshard"]["vs_best_heuristic"]
    assert f"{c['mean_ratio']:.3f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]" in rows[0]
    key = "vs_torchrec_peer" if "torchrec_peer" in metrics["families"][first] else "vs_torchrec_full"
    c = metrics["families"][first]["dreamshard_cut"][key]
    assert f"{c['mean_ratio']:.3f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]" in rows[len(families)]
    best = metrics["families"][first]["best_heuristic"]
    c = metrics["families"][first][best][key]
    assert rows[len(families)].endswith(f"{c['mean_ratio']:.3f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}] |")
    assert metrics["device"] in table


def test_headline_table_marks_a_sharder_not_evaluated():
    metrics = {"backend": "analytic", "device": "cpu: Test", "measured": False, "batch_size": 512,
               "families": {"f-2-2": {"best_heuristic": "lookup_greedy",
                                      "dreamshard": {"num_tasks": 3, "vs_best_heuristic": {
                                          "mean_ratio": 0.9, "ci_low": 0.85, "ci_high": 0.95}}}}}
    table = headline_markdown(metrics)
    assert "| f-2-2 | 3 | `lookup_greedy` | 0.900 [0.85, 0.95] | – | – | – |" in table
    assert "| f-2-2 | – | – | – | – |" in table  # no torchrec_full: no ratios to it
    assert "modelled, not measured" in table
    # with a TorchRec peer named, the second table is against it
    fam = metrics["families"]["f-2-2"]
    fam["torchrec_peer"] = "torchrec"
    fam["dreamshard"]["vs_torchrec_peer"] = {"mean_ratio": 0.8, "ci_low": 0.7, "ci_high": 0.9}
    assert "| f-2-2 | 0.800 [0.70, 0.90] | – | – | – |" in headline_markdown(metrics)


def test_headline_table_command(capsys):
    assert main([str(METRICS)]) == 0
    assert capsys.readouterr().out == headline_table(METRICS)


def test_headline_table_command_writes_readme_between_the_markers_and_refuses_bad_input(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# T\n\n{START}\nold\n{END}\n\nafter\n")
    assert main([str(METRICS), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert readme_block(text) == headline_table(METRICS) and text.startswith("# T\n") and text.endswith("after\n")
    with pytest.raises(SystemExit, match="nope.json: no such file"):
        main([str(tmp_path / "nope.json")])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit, match="bad.json: not an evaluation's metrics"):
        main([str(tmp_path / "bad.json")])
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no <!-- headline:start --> ... <!-- headline:end --> markers"):
        main([str(METRICS), "--readme", str(readme)])
