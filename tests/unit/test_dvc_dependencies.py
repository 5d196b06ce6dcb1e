"""dvc.yaml cannot go stale: each stage depends on exactly the code and the params it uses.

The code a stage runs is found by following imports statically from the stage's module,
inside this repository (packages dreamshard, stages, pipeline):

- a module imported by name (`import a.b`, `from a.b import f`) is followed completely: its
  imports at module level and inside functions, since any of its functions may be called;
- a package that is only the parent of an imported module (`a` for `import a.b`) is followed
  at module level only: that is what Python runs when it imports `a.b`.

The roots of a stage are `stages/<stage>.py` and, where the stage's Prefect flow lives in a
module of its own (collect: pipeline/collect.py), that module. The runner that dispatches
stages (pipeline/__main__.py, pipeline/flows.py) is not a dependency: it chooses how a stage
runs, not what it computes, like the `orchestration` params group.

A stage's params are the groups or keys passed to `section(params, "...")` and
`params.get("...")` in the stage-side modules it reaches (stages, pipeline, dreamshard.project); `paths` are files (deps and outs)
and `orchestration` is how stages run, so neither is a param dependency.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from helpers import PROJECT_ROOT as ROOT

PACKAGES = ("dreamshard", "stages", "pipeline")
RUNNER = {"pipeline.flows", "pipeline.__main__"}
NOT_PARAMS = ("paths", "orchestration")


def module_path(module: str, root: Path = ROOT) -> Path | None:
    p = root.joinpath(*module.split("."))
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    if p.with_suffix(".py").is_file():
        return p.with_suffix(".py")
    return None


def imported_names(path: Path, complete: bool) -> list[str]:
    """Modules named by the imports of `path`: all of them, or those run at import time."""
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not complete:
                continue
            if isinstance(child, ast.Import):
                names.extend(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names.append(child.module)
                names.extend(f"{child.module}.{a.name}" for a in child.names)  # submodules, if they are
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return names


def reached_modules(roots: list[str], root: Path = ROOT) -> dict[str, Path]:
    """module name -> file, for every in-repo module the roots reach."""
    complete: dict[str, bool] = {}
    stack = [(r, True) for r in roots]
    while stack:
        module, whole = stack.pop()
        if module.split(".")[0] not in PACKAGES or module_path(module, root) is None:
            continue
        if complete.get(module) or (module in complete and not whole):
            continue
        complete[module] = whole or complete.get(module, False)
        parts = module.split(".")
        stack.extend((".".join(parts[:i]), False) for i in range(1, len(parts)))
        stack.extend((m, True) for m in imported_names(module_path(module, root), whole))
    return {m: module_path(m, root) for m in complete}


def stage_roots(stage: str) -> list[str]:
    from pipeline.flows import STAGE_FLOWS

    roots = [f"stages.{stage}"]
    flow_module = STAGE_FLOWS[stage].fn.__module__
    if flow_module not in RUNNER:
        roots.append(flow_module)
    return roots


def params_read(files: list[Path]) -> set[str]:
    keys = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name) and f.id == "section" and len(node.args) == 2:
                arg = node.args[1]
            elif (isinstance(f, ast.Attribute) and f.attr == "get" and isinstance(f.value, ast.Name)
                  and f.value.id == "params" and node.args):
                arg = node.args[0]
            else:
                continue
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), (
                f"{path.relative_to(ROOT)}:{node.lineno}: params read with a computed key; "
                "use a literal so the dependency test can see it")
            keys.add(arg.value)
    return {k for k in keys if k.split(".")[0] not in NOT_PARAMS}


def load_dvc(root: Path = ROOT) -> dict:
    return yaml.safe_load((root / "dvc.yaml").read_text())["stages"]


def code_deps(stage: dict) -> list[str]:
    return [d for d in stage.get("deps", []) if isinstance(d, str) and d.split("/")[0] in PACKAGES]


def covered(path: str, deps: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in deps)


def missing_code_deps(name: str, stage: dict, root: Path = ROOT) -> list[str]:
    files = sorted(str(p.relative_to(root)) for p in reached_modules(stage_roots(name), root).values())
    return [f for f in files if not covered(f, code_deps(stage))]


def unused_code_deps(name: str, stage: dict, root: Path = ROOT) -> list[str]:
    files = {str(p.relative_to(root)) for p in reached_modules(stage_roots(name), root).values()}
    unused = []
    for dep in code_deps(stage):
        listed = [dep] if dep.endswith(".py") else [str(p.relative_to(root)) for p in (root / dep).rglob("*.py")]
        unused += [f for f in listed if f not in files]
    return unused


STAGES = load_dvc()


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_depends_on_every_module_it_reaches(name):
    missing = missing_code_deps(name, STAGES[name])
    assert not missing, f"dvc.yaml: stage {name!r} runs {missing} but does not list them in deps"


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_lists_no_code_it_never_runs(name):
    unused = unused_code_deps(name, STAGES[name])
    assert not unused, f"dvc.yaml: stage {name!r} lists {unused} in deps (a directory: every file) but never imports them"


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_depends_on_the_params_it_reads(name):
    stage = STAGES[name]
    files = [p for m, p in reached_modules(stage_roots(name)).items()
             if m.split(".")[0] in ("stages", "pipeline") or m.startswith("dreamshard.project")]
    listed = [str(p) for p in stage.get("params", [])]
    read = params_read(files)
    missing = sorted(k for k in read if not any(k == p or k.startswith(p + ".") for p in listed))
    assert not missing, f"dvc.yaml: stage {name!r} reads params {missing} but does not list them"
    unread = sorted(p for p in listed if not any(k == p or k.startswith(p + ".") or p.startswith(k + ".") for k in read))
    assert not unread, f"dvc.yaml: stage {name!r} lists params {unread} it never reads"


def test_every_stage_has_a_flow_and_a_module():
    from pipeline.flows import STAGE_FLOWS

    assert set(STAGE_FLOWS) == set(STAGES)
    for name, stage in STAGES.items():
        assert stage["cmd"] == f"python -m pipeline {name}"
        assert module_path(f"stages.{name}") is not None


def test_the_checker_sees_a_missing_dependency(tmp_path):
    """The check fails where it should: a module reached only through a function-level import."""
    for pkg in ("stages", "dreamshard", "dreamshard/inner"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "dreamshard" / "__init__.py").write_text("def lazy():\n    import dreamshard.never_at_import\n")
    (tmp_path / "dreamshard" / "never_at_import.py").write_text("")
    (tmp_path / "dreamshard" / "inner" / "deep.py").write_text("X = 1\n")
    (tmp_path / "dreamshard" / "used.py").write_text("def f():\n    from dreamshard.inner.deep import X\n    return X\n")
    (tmp_path / "stages" / "s.py").write_text("from dreamshard.used import f\n")
    reached = {str(p.relative_to(tmp_path)) for p in reached_modules(["stages.s"], tmp_path).values()}
    assert reached == {"stages/__init__.py", "stages/s.py", "dreamshard/__init__.py", "dreamshard/used.py",
                       "dreamshard/inner/__init__.py", "dreamshard/inner/deep.py"}
    # the parent package's lazy import is not run by importing dreamshard.used
    assert "dreamshard/never_at_import.py" not in reached
