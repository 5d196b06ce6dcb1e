"""Shared fixtures of the foundation test suite.

The suite uses small real data written to tmp_path (no mocks). tests/unit/ holds the tests of the library's
parts; tests/integration/ those that run stages, subprocesses, the DVC pipeline, Prefect, TorchRec's
distributed model or FBGEMM's kernels (`pytest tests/unit` for the quick half). Both import tests/helpers.py
as `helpers` (this folder is on sys.path: pytest puts the folder of a conftest.py there). The tests that start
from the tiny project share one, built once per session (the `tiny_project` fixture, tests/project.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "integration: runs the DVC pipeline through Prefect in a temporary git repo (slow, run by default)"
    )
    config.addinivalue_line("markers", "slow: takes over 10 s; runs by default")


# The files that take the longest, longest first (pytest --durations, summed per file): collected first. With
# `make test`'s two workers (pytest-xdist, a file per worker at a time, --no-loadscope-reorder: xdist would
# otherwise queue files by their number of tests) the longest start at once and the short files fill in.
LONGEST_FILES = ("integration/test_orchestration.py", "unit/test_learning.py", "integration/test_torchrec.py",
                 "unit/test_improve.py", "integration/test_torchrec_model.py",
                 "integration/test_torchrec_planner.py", "unit/test_sharders_property.py", "unit/test_figures.py",
                 "unit/test_bounds_rows.py", "unit/test_search_rows.py", "integration/test_dmp_fidelity.py",
                 "integration/test_mlperf_benchmark.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.path.as_posix()
        return next((k for k, f in enumerate(LONGEST_FILES) if path.endswith(f"tests/{f}")), len(LONGEST_FILES))

    items.sort(key=rank)  # stable: the order within a file, and of the other files, is kept


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """The suite is a program: like the stages, it pins torch to the 1 thread the CPU kernels measure with
    (FbgemmConfig.threads; the backend refuses to measure with another count and never sets it itself)."""
    import torch

    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="session")
def project_root() -> Path:
    return PROJECT_ROOT


@pytest.fixture
def big_task():
    from dreamshard.tasks import Task
    from helpers import BIG

    return Task.uniform("big", BIG, 2, 1.0)


@pytest.fixture
def small_task():
    from dreamshard.tasks import Task
    from helpers import SMALL

    return Task.uniform("small", SMALL, 2, 1.0)


@pytest.fixture(scope="session")
def tiny_project(tmp_path_factory):
    """tiny_project(LEVEL): the tiny project up to LEVEL (processed, tasks, costed, trained), built once per
    session from the level below; read-only (tests/project.py)."""
    from project import TinyProject

    return TinyProject(tmp_path_factory)


@pytest.fixture(scope="session")
def costed_project(tiny_project):
    """(root, params) of the tiny project run through the stages up to train_cost (level `costed`)."""
    level = tiny_project("costed")
    return level.root, level.params
