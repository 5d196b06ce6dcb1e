"""The library's layers hold: no module imports from a layer above its own (ARCHITECTURE.md).

Every import counts, at module level, inside functions and under TYPE_CHECKING (a lazy import is still a
dependency). The package `dreamshard` itself is the core: its lazy exports name modules as strings, never by
import. The library never imports the pipeline, the stages, the benchmarks, the experiments, the tools or the tests.

The folders outside the library reach it only through its API, dreamshard.project, and import each other only
downward: project < stages < pipeline; project < benchmarks < experiments; project < tools (OUTSIDE_IMPORTS).
tests/ may import anything. No modules import each other in a circle, directly or through others, across the
library and those folders.
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
    ("hardware", ("dreamshard.hardware", "dreamshard.interop")),
    ("learning", ("dreamshard.learning",)),
    ("sharders", ("dreamshard.sharders",)),
    ("evaluation", ("dreamshard.evaluation",)),
    ("application", ("dreamshard.cli", "dreamshard.planner", "dreamshard.provenance", "dreamshard.project")),
)
OUTSIDE = ("stages", "pipeline", "benchmarks", "experiments", "tools", "tests")  # never imported by the library
API = "dreamshard.project"  # the library as the folders outside it see it
# each folder outside the library (tests/ aside): the folders it may import besides the API, its own among them
OUTSIDE_IMPORTS: dict[str, tuple[str, ...]] = {
    "stages": ("stages",),
    "pipeline": ("pipeline", "stages"),
    "benchmarks": ("benchmarks",),
    "experiments": ("experiments", "benchmarks"),
    "tools": ("tools",),  # code that runs elsewhere (a GPU machine, a kept run): the API only
}


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


def outside_violations(module: str, source: str) -> list[str]:
    """Each import of `source` (the text of `module`, in a folder outside the library) that reaches the library
    other than through the API, or a folder OUTSIDE_IMPORTS does not allow."""
    folder = module.split(".")[0]
    out = []
    for target in imports_of(module, source):
        root = target.split(".")[0]
        if root == "dreamshard" and not (target == API or target.startswith(API + ".")):
            out.append(f"{module} imports {target}, not through {API}")
        elif root in OUTSIDE and root not in OUTSIDE_IMPORTS[folder]:
            out.append(f"{module} ({folder}) imports {target} ({root}), which {folder} may not import")
    return out


def import_circles(sources: dict[str, str]) -> list[list[str]]:
    """The circles among the modules of `sources` (module name -> text): each set of modules that reach each
    other through their imports (a strongly connected component of more than one module), sorted."""
    graph = {m: sorted({t for t in imports_of(m, text) if t in sources and t != m}) for m, text in sources.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []
    for start in sorted(graph):  # Tarjan's algorithm, iteratively
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
            if i < len(graph[node]):
                work.append((node, i + 1))
                nxt = graph[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(circles)


LIBRARY = sorted((ROOT / "dreamshard").rglob("*.py"))
OUTSIDE_CODE = sorted(p for folder in OUTSIDE_IMPORTS for p in (ROOT / folder).rglob("*.py"))


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


@pytest.mark.parametrize("path", OUTSIDE_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_folders_outside_the_library_reach_it_through_its_api_and_import_downward(path):
    assert outside_violations(module_name(path), path.read_text()) == []


def test_no_modules_import_each_other_in_a_circle():
    sources = {module_name(p): p.read_text() for p in LIBRARY + OUTSIDE_CODE}
    assert import_circles(sources) == []


def test_the_checks_see_a_way_around_the_api_an_upward_folder_and_a_circle():
    assert outside_violations("stages.evaluate", "from dreamshard.evaluation.journal import EvalJournal\n") == [
        "stages.evaluate imports dreamshard.evaluation.journal, not through dreamshard.project"]
    assert outside_violations("tools.gpu_run", "def f():\n    from benchmarks.cpu_kernels import cv\n") == [
        "tools.gpu_run (tools) imports benchmarks.cpu_kernels (benchmarks), which tools may not import"]
    assert outside_violations("benchmarks.cut_designs", "import experiments.model_ab\n") == [
        "benchmarks.cut_designs (benchmarks) imports experiments.model_ab (experiments), which benchmarks may not import"]
    assert outside_violations("experiments.cut_gain", "from benchmarks.cut_designs import project_at\n"
                              "from dreamshard.project.backend import backend_of\n") == []  # downward
    assert outside_violations("pipeline.collect", "from stages import collect\n") == []
    # a circle closed by a lazy import, one by an import under TYPE_CHECKING, and modules that merely share one
    lazy = {"dreamshard.tasks": "from dreamshard.caching import hit_rate\n",
            "dreamshard.caching": "def f():\n    from dreamshard.plan import Plan\n",
            "dreamshard.plan": "from dreamshard.tasks import Task\n",
            "dreamshard.memory": "from dreamshard.tasks import Task\n"}
    assert import_circles(lazy) == [["dreamshard.caching", "dreamshard.plan", "dreamshard.tasks"]]
    typed = {"dreamshard.hardware.base": "if TYPE_CHECKING:\n    from dreamshard.hardware.comm import Topology\n",
             "dreamshard.hardware.comm": "from dreamshard.hardware.base import PlanCost\n"}
    assert import_circles(typed) == [["dreamshard.hardware.base", "dreamshard.hardware.comm"]]
    assert import_circles({"dreamshard.plan": "from dreamshard.tasks import Task\n", "dreamshard.tasks": ""}) == []
