"""results/README.md is the index of results/: every folder listed, every module it cites there to run."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "results" / "README.md"
MODULE = re.compile(r"`(?:python -m )?((?:dreamshard|benchmarks|experiments|tools|stages|pipeline)(?:\.\w+)+)")


def cited_modules(text: str) -> set[str]:
    return set(MODULE.findall(text)) | set(re.findall(r"python -m ((?:benchmarks|experiments|tools|pipeline)"
                                                      r"(?:\.\w+)*)", text))


def exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_module_the_index_cites_exists():
    missing = sorted(m for m in cited_modules(INDEX.read_text()) if not exists(m))
    assert not missing, f"results/README.md cites modules that do not exist: {missing}"


def test_every_results_folder_is_in_the_index():
    text = INDEX.read_text()
    folders = sorted(p.name for p in INDEX.parent.iterdir() if p.is_dir())
    assert folders and not [f for f in folders if f"[{f}/]({f}/README.md)" not in text]


def test_the_check_finds_a_module_that_is_gone():
    assert cited_modules("`python -m experiments.no_such_thing`") == {"experiments.no_such_thing"}
    assert not exists("experiments.no_such_thing") and exists("benchmarks.planner_coverage")


def test_docs_layout_names_every_module():
    text = (ROOT / "docs" / "layout.md").read_text()
    modules = [p for folder in ("dreamshard", "benchmarks", "experiments", "tools") for p in (ROOT / folder).rglob("*.py")
               if p.stem not in ("__init__", "__main__")]
    missing = sorted(str(p.relative_to(ROOT)) for p in modules if not re.search(rf"\b{re.escape(p.stem)}\b", text))
    assert not missing, f"docs/layout.md does not name: {missing}"


# ---------------------------------------------------------------- results/ as findings (issue 54)

PAGE_LIMIT = 12 * 1024  # bytes: a page a reader reads whole
RESULTS_LIMIT = 8_000_000  # bytes of results/ in git
# a count of work periods as a time marker ("the eighth session", "this session", "issue 35's pass"); a
# measurement pass ("pass 2", "a second pass of the same plans") is not one
WORK_PERIOD = re.compile(
    r"\b(?:(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|this|that|next|"
    r"previous|last|earlier|later|one|a|another)\s+(?:work(?:ing)?\s+)?(?:session|work\s+period)s?"
    r"|(?:sixth|seventh|eighth|ninth|tenth|eleventh|twelfth)\s+pass(?:es)?"
    r"|pass(?:es)?\s+of\s+work"
    r"|issue\s+\d+'s\s+(?:pass|session|work))\b", re.I)


def markdown_pages() -> list[Path]:
    return sorted([*(ROOT / "results").rglob("*.md"), *(ROOT / "docs").glob("*.md")])


def results_files() -> list[Path]:
    """results/'s files in git, or to be added (tracked or not ignored: `git ls-files`), else every file there."""
    import subprocess

    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "results"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return [p for p in (ROOT / "results").rglob("*") if p.is_file()]
    return [ROOT / n for n in out.decode().split("\0") if n and (ROOT / n).is_file()]


def work_periods(text: str) -> list[str]:
    return [m.group(0) for m in WORK_PERIOD.finditer(text)]


def test_no_results_or_docs_page_is_over_12_kb():
    over = {str(p.relative_to(ROOT)): p.stat().st_size for p in markdown_pages() if p.stat().st_size > PAGE_LIMIT}
    assert not over, f"markdown pages over {PAGE_LIMIT} bytes (split or fold them): {over}"


def test_results_in_git_are_at_most_8_mb():
    files = results_files()
    total = sum(p.stat().st_size for p in files)
    largest = sorted(files, key=lambda p: p.stat().st_size)[-5:]
    assert total <= RESULTS_LIMIT, (f"results/ holds {total} bytes in git (limit {RESULTS_LIMIT}); largest: "
                                    f"{[(str(p.relative_to(ROOT)), p.stat().st_size) for p in largest]}")


def test_no_journal_folder_is_kept_in_results():
    big = [p for p in (ROOT / "results").rglob("eval_journal") if p.is_dir()
           and sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) > 1_000_000]
    assert not big, f"journals over 1 MB are kept as one archive (tools.paper_cpu.pack_journal): {big}"


def test_no_page_names_a_work_period():
    found = {str(p.relative_to(ROOT)): work_periods(p.read_text()) for p in markdown_pages()}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"dates and commits say when, not a count of work periods: {found}"


def test_the_work_period_check_finds_them_and_spares_measurement_passes():
    assert work_periods("as in the eighth session's run; this session; issue 35's pass; the ninth pass") == [
        "eighth session", "this session", "issue 35's pass", "ninth pass"]
    assert work_periods("longer than one working session") == ["one working session"]
    assert not work_periods("pass 2 of the evaluation; a second pass of the same plans; the first pass read 0.9; "
                            "Prefect's sessions; a tenth of the time")
