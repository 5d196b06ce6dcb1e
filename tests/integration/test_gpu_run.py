"""tools/gpu_run.py, the GPU machine's driver of the stages: its params, its refusals, and one real step.

The CUDA runs themselves happen only on a GPU machine (results/gpu/); here the same code runs with device cpu."""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import yaml

from tools import gpu_run

PARAMS = yaml.safe_load(Path("params.yaml").read_text())


@pytest.fixture(autouse=True)
def _own_allocator_setting(monkeypatch):
    """main sets the huge-page variable from params, as `python -m pipeline` does; here it runs in the test
    process, so the variable is put back after each test (other tests' backends check it)."""
    from dreamshard.hardware.allocator import HUGE_PAGES_ENV

    monkeypatch.setenv(HUGE_PAGES_ENV, os.environ.get(HUGE_PAGES_ENV, "0"))


def test_params_move_every_path_under_root_and_set_the_device(tmp_path):
    params = gpu_run.gpu_params(PARAMS, tmp_path, "cuda", ["evaluate.rounds=3", "evaluate.exhaustive={num_tasks: 6}"])
    assert all(Path(v).is_relative_to(tmp_path) for v in params["paths"].values())
    assert params["backend"]["fbgemm"]["device"] == "cuda" and params["backend"]["name"] == "fbgemm"
    assert params["evaluate"]["rounds"] == 3 and params["evaluate"]["exhaustive"] == {"num_tasks": 6}
    assert PARAMS["backend"]["fbgemm"]["device"] == "cpu"  # the loaded params are not changed


def test_torchrec_sharders_dropped_only_where_torchrec_is_missing(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchrec" else real(name, *a))
    kept = gpu_run.gpu_params(PARAMS, tmp_path, "cuda", [])["evaluate"]["sharders"]
    assert kept == [s for s in PARAMS["evaluate"]["sharders"] if s not in ("torchrec", "torchrec_full")]
    monkeypatch.setattr(importlib.util, "find_spec", real)
    if real("torchrec") is not None:
        assert gpu_run.gpu_params(PARAMS, tmp_path, "cuda", [])["evaluate"]["sharders"] == PARAMS["evaluate"]["sharders"]


@pytest.mark.parametrize("setting, message", [("evaluate.no_such_key=1", "no key 'no_such_key'"),
                                              ("nogroup.rounds=1", "no group 'nogroup'"),
                                              ("evaluate.rounds", "expected dotted.key=value")])
def test_bad_settings_are_named(tmp_path, setting, message):
    with pytest.raises(SystemExit, match=message):
        gpu_run.gpu_params(PARAMS, tmp_path, "cuda", [setting])


def test_noise_step_measures_and_records_provenance(tmp_path):
    out = tmp_path / "out"
    argv = ["--root", str(tmp_path / "work"), "--out", str(out), "--device", "cpu", "--steps", "noise",
            "--set", "backend.batch_size=16", "--set", "backend.fbgemm.warmup=0", "--set", "backend.fbgemm.iterations=1"]
    assert gpu_run.main(argv) == 0
    record = json.loads((out / "gpu_run.json").read_text())
    assert record["batch_size"] == 16 and record["fbgemm_gpu"] and record["torch"]
    (entry,) = record["runs"]
    noise = entry["noise"]
    assert entry["command"].endswith(" ".join(argv[-6:]))
    assert len(noise["single_ms"]) == noise["tables"] == 8 and all(len(v) == noise["repeats"] for v in noise["single_ms"])
    assert all(x > 0 for v in noise["single_ms"] for x in v) and noise["single_cv_median"] >= 0


def test_unknown_steps_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        gpu_run.main(["--root", str(tmp_path), "--out", str(tmp_path), "--device", "cpu", "--steps", "fusion,bogus"])
