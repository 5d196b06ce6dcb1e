"""Helpers shared by several test modules of tests/unit and tests/integration (imported as `helpers`: pytest puts
tests/, the folder of conftest.py, on sys.path)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from dreamshard.hardware.analytic import AnalyticBackend, AnalyticConfig
from dreamshard.hardware.comm import Topology
from dreamshard.sharders import SHARDERS
from dreamshard.tables import Table


def seeded(name: str, seed: int) -> dict[str, Any]:
    """`seed=seed` for a sharder that takes a seed, nothing for one that does not (the greedy ones)."""
    return SHARDERS[name].taken_from({"seed": seed})


# ---------------------------------------------------------------- tiny pipeline configurations

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the repository (tests/helpers.py)
TINY_TABLES = 24
FAMILIES = [
    {"name": "tiny-6-2", "num_tables": 6, "num_devices": 2, "memory_gb": 0.01, "num_train": 3, "num_test": 2,
     "num_validation": 2},
    {"name": "tiny-8-4", "num_tables": 8, "num_devices": 4, "memory_gb": 0.01, "num_train": 2, "num_test": 2},
]


def tiny_params(paths_root: Path | None = None) -> dict:
    """The project's params.yaml scaled down so that each stage takes seconds: 24 synthetic tables, two tiny
    task families (pools of 8 train, 6 validation, 10 test tables), the analytic backend, short training.
    `paths_root`: every path under that folder."""
    p = yaml.safe_load((PROJECT_ROOT / "params.yaml").read_text())
    if paths_root is not None:
        p["paths"] = {key: str(paths_root / value) for key, value in p["paths"].items()}
    p["data"]["source"] = "synthetic"
    p["data"]["synthetic"].update(num_tables=TINY_TABLES, batch_size=256, max_rows=5000, seed=0, heavy_tables=0)
    p["process"]["sample_batch"] = 64
    p["tasks"].update(seed=0, test_fraction=0.4, validation_fraction=0.25, dims=[4, 8, 16], profile="tiny",
                      profiles={"tiny": FAMILIES})
    p["tasks"]["holdout"]["pooling_above"] = 1000.0  # above every table: the tiny pools keep all 24
    p["backend"].update(name="analytic", batch_size=512)
    p["backend"]["analytic"] = {"regime": "super_additive"}
    p["collect"].update(seed=0, num_plans=12, perturb_fraction=0.5, chunk_size=5)
    p["collect_devices"].update(seed=0, samples=20, max_tables=4, chunk_size=8)
    p["train_cost"].update(steps=30, batch_plans=8, batch_devices=8)
    p["train_policy"]["families"] = ["tiny-6-2"]
    p["train_policy"]["common"].update(cost_steps=10, cost_batch_plans=8, episodes=2)
    p["train_policy"]["dreamshard"].update(iterations=2, plans_per_iteration=2, policy_updates=2)
    p["train_policy"]["autoshard"].update(measurement_budget=4, refit_steps=2)
    p["train_neuroshard"].update(comm_samples=40,
                                 fit={"steps": 20, "lr": 0.001, "batch": 16, "comm_batch": 16})
    p["neuroshard"].update(beams=1, depth=2, candidates=2, scale_steps=2)
    p["evaluate"].update(train_tasks_per_family=0, additivity_probes=1, estimated_bins={"tasks_per_family": 1, "rounds": 1},
                         best_known={"tasks_per_family": 1, "seeds": None, "budget": 12, "rounds": 1, "min_gain": 0.0,
                                     "max_neighbours": 4},
                         exhaustive={"num_tasks": 0, "num_tables": 4, "num_devices": 2, "top_plans": 2,
                                                               "rounds": 1})
    # planned in the stage's own process: spawning planning processes takes longer than planning a tiny task
    # (test_eval_journal runs two)
    p["orchestration"]["evaluate"].update(planning_workers=1)
    return p


TINY_EXTRA = {"batch_size": 512, "seed": 0}  # what tiny_params gives the collect stages (backend batch, seed)


# ---------------------------------------------------------------- commands (dvc, git, prefect)


def sh(cmd: list[str], cwd: Path, env: dict, timeout: int = 600, ok: bool = True) -> subprocess.CompletedProcess:
    """Run a command; with `ok`, fail the test (showing its output) unless it exits 0."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if ok:
        assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def out(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def ran(output: str) -> set[str]:
    """The DVC stages a `dvc repro` / `dvc exp run` output says it ran."""
    return set(re.findall(r"Running stage '([^']+)'", output))


def skipped(output: str) -> set[str]:
    return set(re.findall(r"Stage '([^']+)' didn't change, skipping", output))


# ---------------------------------------------------------------- small hand-made tables, analytic backend

# Large enough working sets (touched rows x dim x 4 B, several MiB each against the 8 MiB
# cache) that the super-additive regime's cache pressure outweighs the launch cost fusion saves.
BIG = [
    Table("big0", 100_000, 64, 20.0),
    Table("big1", 50_000, 128, 10.0),
    Table("big2", 200_000, 32, 30.0),
    Table("big3", 80_000, 64, 5.0),
]
# Tiny tables: the cache is no issue, the per-operator launch dominates.
SMALL = [
    Table("s0", 100, 4, 1.0),
    Table("s1", 500, 8, 2.0),
    Table("s2", 1_000, 16, 0.5),
]


def analytic(regime: str = "super_additive", batch_size: int = 2048, topology: Topology | None = None) -> AnalyticBackend:
    """The deterministic analytic backend (a model, never a measurement)."""
    return AnalyticBackend(AnalyticConfig(regime=regime, batch_size=batch_size, topology=topology or Topology()))


def brute_force_feasible(task) -> bool:
    """Whether some assignment of whole tables to devices fits every device's usable memory (tried exhaustively),
    each table on its pinned device when it has one (a cut task pins its row-wise blocks). Every assignment is
    tried, but a partial one that already overflows a device is not extended: the answer of trying them all."""
    pinned = task.pinned_device()
    items = sorted(((task.table_bytes(i), [pinned[t.name]] if t.name in pinned else range(task.num_devices))
                    for i, t in enumerate(task.tables)), key=lambda item: -item[0])  # the largest first: prunes sooner
    free = task.capacities()

    def place(k: int) -> bool:
        if k == len(items):
            return True
        size, devices = items[k]
        for d in devices:
            if size <= free[d]:
                free[d] -= size
                found = place(k + 1)
                free[d] += size
                if found:
                    return True
        return False

    return place(0)


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def one_line_error(argv: list[str], capsys) -> str:
    """Run `dreamshard ARGV`: it must fail with exit code 1, one line on stderr, no traceback, nothing on stdout;
    returns that line."""
    from dreamshard.cli import main

    rc = main(argv)
    captured = capsys.readouterr()
    assert rc == 1
    assert "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("dreamshard: error: ")
    assert captured.out == ""
    return lines[0]
