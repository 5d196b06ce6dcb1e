"""Shared fixtures of the foundation test suite.

The suite uses small real data written to tmp_path (no mocks). The one slow test,
the `dvc repro` integration test, is marked `integration` and runs by default;
deselect it with `-m "not integration"`.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "integration: runs the DVC pipeline through Prefect in a temporary git repo (slow, run by default)"
    )
    config.addinivalue_line("markers", "slow: takes over 10 s; runs by default")


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


@pytest.fixture(scope="session")
def prefect_env(tmp_path_factory: pytest.TempPathFactory):
    """Environment for subprocesses that run Prefect flows against ONE shared test server.

    Without it every `python -m pipeline STAGE` would start its own temporary Prefect
    server (about 10 s each). The server is Prefect's own test harness (a temporary
    SQLite database); its URL is handed to the subprocesses as PREFECT_API_URL.
    """
    home = tmp_path_factory.mktemp("prefect_home")
    settings = {
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "DVC_NO_ANALYTICS": "1",
    }
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)  # before Prefect is imported: it reads its settings then
    try:
        import prefect.settings
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=120):
            api_url = prefect.settings.PREFECT_API_URL.value()
            assert api_url, "the Prefect test harness did not set PREFECT_API_URL"
            env = dict(os.environ)
            env.update(settings)
            env["PREFECT_API_URL"] = api_url
            env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
            # the temporary repo's own copies of dreamshard/stages/pipeline must be imported
            env.pop("PYTHONPATH", None)
            yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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


@pytest.fixture(scope="module")
def costed_project(tmp_path_factory):
    """(root, params) of a tiny project run through the stages up to train_cost (helpers.costed_project), once
    per test module."""
    from helpers import costed_project as build

    root = tmp_path_factory.mktemp("costed")
    return root, build(root)
