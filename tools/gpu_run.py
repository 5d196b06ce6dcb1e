"""The pipeline's measuring stages on FBGEMM's CUDA kernels, for a GPU machine without Prefect, DVC or TorchRec.

    python -m tools.gpu_run --root DIR --out DIR [--steps fusion,data,collect,train,evaluate]
                                 [--device cuda] [--set dotted.key=yaml-value ...]

Runs the stages' own `run(params)` functions (stages/), the same code `dvc repro` runs through
Prefect, on params.yaml with every path moved under --root and `backend.fbgemm.device` set to
--device. Steps, in order, each resumable from the files the previous ones left in --root:

  noise     each of 8 reference tables alone, and all 8 fused, measured `repeats` times (a new operator each
            time, as every probe and plan is): the spread of one measurement under backend.fbgemm's
            warmup and iterations
  fusion    one fused operator of the 20 reference tables (benchmarks/cpu_kernels.py's) against the
            sum of 20 single-table operators, 5 repeats, at backend.batch_size: the fusion regime of this device
  data      download, process, tasks (CPU work)
  collect   real plan measurements and single devices for the cost models (collect, collect_devices)
  train     train_cost, train_neuroshard, train_policy (DreamShard), train_autoshard, train_rnn
  evaluate  every sharder of evaluate.sharders on the test tasks, lower bounds, the exhaustive check
A step may also be one stage by name (e.g. `train_cost`), to run a subset of a step's stages; `collect` is the
step (both stages).

TorchRec is not installed on the GPU machines unless carried there, so `evaluate.sharders` drops torchrec
and torchrec_full unless `torchrec.distributed.planner` imports. Each step appends a record (seconds, device,
versions, batch size, this command) to OUT/gpu_run.json and copies the metrics and figures it wrote to OUT:
GPU figures, labelled with the GPU's name, never to be mixed with the CPU figures in metrics/.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import json
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

STAGES = {
    "data": ("download", "process", "tasks"),
    "collect": ("collect", "collect_devices"),
    "train": ("train_cost", "train_neuroshard", "train_policy", "train_autoshard", "train_rnn"),
    "evaluate": ("evaluate",),
}
for _stage in [s for stages in STAGES.values() for s in stages]:
    STAGES.setdefault(_stage, (_stage,))  # a stage by name (the step `collect` keeps both of its stages)
STEPS = ("noise", "fusion", *STAGES)
TORCHREC_SHARDERS = ("torchrec", "torchrec_full", "torchrec_full_min", "torchrec_calibrated", "torchrec_model")


def with_setting(params: dict[str, Any], dotted: str, value: Any) -> None:
    node = params
    *parents, leaf = dotted.split(".")
    for key in parents:
        if not isinstance(node.get(key), dict):
            raise SystemExit(f"--set {dotted}: params.yaml has no group {key!r} there")
        node = node[key]
    if leaf not in node:
        raise SystemExit(f"--set {dotted}: params.yaml has no key {leaf!r} there")
    node[leaf] = value


def torchrec_imports() -> bool:
    """Whether TorchRec's planner imports here (present is not enough: a wheel built for another torch fails)."""
    if importlib.util.find_spec("torchrec") is None:
        return False
    try:
        importlib.import_module("torchrec.distributed.planner")
    except Exception as exc:  # noqa: BLE001 - any import failure means the sharders cannot run
        print(f"gpu_run: torchrec does not import ({type(exc).__name__}: {exc}); torchrec sharders dropped", flush=True)
        return False
    return True


def gpu_params(params: dict[str, Any], root: Path, device: str, settings: list[str]) -> dict[str, Any]:
    """params.yaml with every path under `root`, the kernels on `device`, and the --set overrides."""
    out = copy.deepcopy(params)
    out["paths"] = {k: str(root / v) for k, v in params["paths"].items()}
    out["backend"]["name"] = "fbgemm"
    out["backend"]["fbgemm"]["device"] = device
    if not torchrec_imports():
        out["evaluate"]["sharders"] = [s for s in out["evaluate"]["sharders"] if s not in TORCHREC_SHARDERS]
    for item in settings:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected dotted.key=value")
        with_setting(out, key, yaml.safe_load(raw))
    return out


def reference_backend(device: str, batch_size: int, warmup: int, iterations: int, tables: int, seed: int, name: str):
    """A one-device task of `tables` reference tables (benchmarks/cpu_kernels.py's, drawn with `seed`) and the
    fbgemm backend that measures them on `device`, thread count pinned, under the process's huge-page setting
    (main sets it from params before torch is imported)."""
    from dreamshard.project.data import GeneratedLookups
    from dreamshard.project.domain import Task
    from dreamshard.project.hardware import FbgemmBackend, FbgemmConfig, huge_pages_enabled, pin_threads
    from dreamshard.project.kernels import reference_tables

    task = Task.uniform(name, reference_tables(tables, seed), 1, 64.0)
    backend = FbgemmBackend(GeneratedLookups(seed=0), FbgemmConfig(batch_size=batch_size, device=device, warmup=warmup,
                                                                   iterations=iterations, memory_budget_gb=16.0,
                                                                   huge_pages=huge_pages_enabled()))
    pin_threads(backend)
    return task, backend


def fusion_regime(device: str, batch_size: int, warmup: int, iterations: int, repeats: int = 5,
                  tables: int = 20) -> dict[str, Any]:
    """Fused operator of the reference tables vs the sum of single-table operators, `repeats` times."""
    from dreamshard.project.evaluation import fusion_probe, regime_of

    task, backend = reference_backend(device, batch_size, warmup, iterations, tables, 0, "fusion")
    probes = [fusion_probe(backend, task, tables) for _ in range(repeats)]
    fused, singles = [p.fused_ms for p in probes], [sum(p.single_ms) for p in probes]
    ratios = [p.additivity for p in probes]
    return {"tables": tables, "repeats": repeats, "batch_size": batch_size, "warmup": warmup, "iterations": iterations,
            "fused_ms": fused, "sum_of_singles_ms": singles, "ratios": ratios,
            "median_ratio": statistics.median(fused) / statistics.median(singles), "regime": regime_of(ratios)}


def measurement_noise(device: str, batch_size: int, warmup: int, iterations: int, repeats: int = 5,
                      tables: int = 8) -> dict[str, Any]:
    """Coefficient of variation (std / mean) over `repeats` fresh measurements of each single table and of all fused."""
    from dreamshard.project.evaluation import whole_shards
    from dreamshard.project.kernels import cv

    task, backend = reference_backend(device, batch_size, warmup, iterations, tables, 1, "noise")
    shards = whole_shards(task)
    singles = [[backend.compute_cost(task, [s]).total_ms for _ in range(repeats)] for s in shards]
    fused = [backend.compute_cost(task, shards).total_ms for _ in range(repeats)]
    return {"tables": tables, "repeats": repeats, "batch_size": batch_size, "warmup": warmup, "iterations": iterations,
            "single_ms": singles, "fused_ms": fused, "single_cv_median": statistics.median(cv(v) for v in singles),
            "fused_cv": cv(fused), "fused_over_max_single_median": statistics.median(fused) /
            max(statistics.median(v) for v in singles)}


def device_record(device: str) -> dict[str, Any]:
    import torch

    from dreamshard.project.hardware import fbgemm_version

    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine()
    return {"device": name, "torch": torch.__version__, "fbgemm_gpu": fbgemm_version(),
            "cuda": str(torch.version.cuda), "python": platform.python_version()}


def copy_outputs(params: dict[str, Any], out: Path, step: str) -> list[str]:
    """The metrics and figures a step wrote, into out/<step>/ (two folders down at most)."""
    copied = []
    for key in ("metrics", "plots"):
        folder = Path(params["paths"][key])
        if not folder.is_dir():
            continue
        for f in sorted(folder.iterdir()):
            if f.is_file() and f.suffix in (".json", ".csv", ".png"):
                dest = out / step / f.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dest)
                copied.append(str(dest.relative_to(out)))
    return copied


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gpu_run", description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, type=Path, help="working folder for the stages' files")
    ap.add_argument("--out", required=True, type=Path, help="where the record and copied metrics go")
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--params", default="params.yaml", type=Path)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a params.yaml value, e.g. evaluate.rounds=3 (repeatable)")
    args = ap.parse_args(argv)
    from dreamshard.project.backend import huge_pages_from_params

    huge_pages_from_params(str(args.params))  # as `python -m pipeline` does, before anything imports torch
    steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        ap.error(f"--steps: unknown {unknown}; expected some of {', '.join(STEPS)}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            ap.error("--device cuda: torch.cuda.is_available() is False here")
    params = gpu_params(yaml.safe_load(args.params.read_text()), args.root, args.device, args.set)
    args.out.mkdir(parents=True, exist_ok=True)
    args.root.mkdir(parents=True, exist_ok=True)
    record_path = args.out / "gpu_run.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"runs": []}
    record.update(device_record(args.device))
    record["batch_size"] = params["backend"]["batch_size"]
    record["evaluate_sharders"] = params["evaluate"]["sharders"]
    for step in steps:
        start = time.perf_counter()
        entry: dict[str, Any] = {"step": step, "command": "python -m tools.gpu_run " + " ".join(argv or sys.argv[1:])}
        if step == "noise":
            fb = params["backend"]["fbgemm"]
            entry["noise"] = measurement_noise(args.device, int(params["backend"]["batch_size"]), int(fb["warmup"]),
                                               int(fb["iterations"]))
            print(f"noise (warmup {fb['warmup']}, iterations {fb['iterations']}): median CV of a single table "
                  f"{entry['noise']['single_cv_median']:.3f}, fused {entry['noise']['fused_cv']:.3f}, fused / "
                  f"largest single {entry['noise']['fused_over_max_single_median']:.3f}", flush=True)
        elif step == "fusion":
            fb = params["backend"]["fbgemm"]
            entry["fusion"] = fusion_regime(args.device, int(params["backend"]["batch_size"]), int(fb["warmup"]),
                                            int(fb["iterations"]))
            print(f"fusion: fused / sum of singles {entry['fusion']['median_ratio']:.3f} "
                  f"({entry['fusion']['regime']})", flush=True)
        else:
            for stage in STAGES[step]:
                t0 = time.perf_counter()
                importlib.import_module(f"stages.{stage}").run(params)
                entry.setdefault("stage_seconds", {})[stage] = round(time.perf_counter() - t0, 1)
                print(f"{stage}: {entry['stage_seconds'][stage]} s", flush=True)
            entry["copied"] = copy_outputs(params, args.out, step)
        entry["seconds"] = round(time.perf_counter() - start, 1)
        record["runs"].append(entry)
        record_path.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
