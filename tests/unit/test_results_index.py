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
