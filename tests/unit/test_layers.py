"""The library's layers hold: no module imports from a layer above its own (ARCHITECTURE.md).

Every import counts, at module level and inside functions (a lazy import is still a dependency). The
package `dreamshard` itself is the core: its lazy exports name modules as strings, never by import.
The library never imports the pipeline, the stages, the benchmarks, the experiments, the tools or the tests.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import PROJECT_ROOT as ROOT

# lowest first; a module belongs to the longest prefix listed
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("dreamshard", "dreamshard.caching", "dreamshard.errors", "dreamshard.io", "dreamshard.limits",
              "dreamshard.memory", "dreamshard.tables", "dreamshard.tasks", "dreamshard.plan", "dreamshard.placement")),
    ("data", ("dreamshard.data",)),
    ("hardware", ("dreamshard.hardware", "dreamshard.interop", "dreamshard.interop.torchrec")),
    ("learning", ("dreamshard.learning",)),
    ("sharders", ("dreamshard.sharders",)),
    ("evaluation", ("dreamshard.evaluation",)),
    ("application", ("dreamshard.cli", "dreamshard.interop.planner", "dreamshard.provenance", "dreamshard.project")),
)
OUTSIDE = ("stages", "pipeline", "benchmarks", "experiments", "tools", "tests")  # never imported by the library


def layer_of(module: str) -> int:
    """The rank of `module`'s layer (0: core); KeyError for a module no layer lists."""
    best, rank = "", -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            exact = p == "dreamshard"
            if (module == p or (not exact and module.startswith(p + "."))) and len(p) > len(best):
                best, rank = p, i
    if rank < 0:
        raise KeyError(f"{module}: in no layer of tests/unit/test_layers.py LAYERS; add it where it belongs")
    return rank


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(module: str, source: str) -> list[str]:
    """The modules `source` (the text of `module`) imports, relative imports resolved; `from a import b` names
    a.b where that is a module, else a."""
    package = module if source_is_package(module) else module.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append(sub if is_module(sub) else base)
    return found


def is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def source_is_package(module: str) -> bool:
    return (ROOT.joinpath(*module.split(".")) / "__init__.py").is_file()


def violations(module: str, source: str) -> list[str]:
    """Each import of `source` that reaches above `module`'s layer, or outside the library."""
    own = layer_of(module)
    out = []
    for target in imports_of(module, source):
        root = target.split(".")[0]
        if root in OUTSIDE:
            out.append(f"{module} ({LAYERS[own][0]}) imports {target}, outside the library")
        elif root == "dreamshard" and layer_of(target) > own:
            out.append(f"{module} ({LAYERS[own][0]}) imports {target} ({LAYERS[layer_of(target)][0]}), a layer above")
    return out


LIBRARY = sorted((ROOT / "dreamshard").rglob("*.py"))


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_from_a_layer_above_its_own(path):
    assert violations(module_name(path), path.read_text()) == []


def test_every_library_module_has_a_layer():
    for path in LIBRARY:
        layer_of(module_name(path))  # KeyError names the module


def test_the_check_sees_a_back_arrow_a_lazy_one_and_a_relative_one():
    lazy = "def f():\n    from dreamshard.sharders import make_sharder\n"
    assert violations("dreamshard.data.sampling", lazy) == [
        "dreamshard.data.sampling (data) imports dreamshard.sharders (sharders), a layer above"]
    assert violations("dreamshard.learning.rnn", "from ..sharders import learned\n") == [
        "dreamshard.learning.rnn (learning) imports dreamshard.sharders.learned (sharders), a layer above"]
    assert violations("dreamshard.hardware.fbgemm", "import stages.backend\n") == [
        "dreamshard.hardware.fbgemm (hardware) imports stages.backend, outside the library"]
    assert violations("dreamshard.sharders.cuts", "from dreamshard.learning import policy\n") == []  # downward
    with pytest.raises(KeyError, match="dreamshard.newthing"):
        layer_of("dreamshard.newthing")
