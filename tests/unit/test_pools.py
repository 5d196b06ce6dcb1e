"""Design never sees the test pool: only the evaluation reads the test tasks (docs/tasks.md).

The tasks stage draws train, validation and test tasks from disjoint table pools. Models learn from train;
benchmarks, experiments and any tuning read train and validation; the test tasks are the evaluate stage's alone.
A static scan finds every way a module could name the test pool (the split "test", the file test.parquet, the
evaluation's task readers) outside the modules that evaluate; a behavioural test runs the design tools' task
readers on a project whose test file is gone.
"""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from helpers import PROJECT_ROOT as ROOT

SCANNED = ("dreamshard", "stages", "pipeline", "benchmarks", "experiments", "tools")
# the modules that may name the test pool, each with why: the evaluation and the runners of its stage
EVALUATION = {
    "dreamshard/project/evaluation.py": "evaluated_tasks: the one reader of the test tasks",
    "stages/evaluate.py": "the evaluate stage: its results' test split",
    "dreamshard/data/sampling.py": "draws the pools (POOLS, GROUPED_SPLITS): reads no task file",
    "tools/paper_cpu.py": "the evaluate stage for the paper profile, journal by journal",
    "tools/journal_summary.py": "summarises an evaluate journal's test rows as the stage does",
    "tools/model_error.py": "rates the evaluate stage's measured test plans by each cost model",
    "tools/comm_reprice.py": "reprices the evaluate stage's measured test plans under two comm models",
}
READERS = {"evaluated_tasks"}  # functions that return test tasks
SETUP = "evaluation_setup"  # returns test tasks unless called with test=False


def offences(tree: ast.AST) -> list[str]:
    """Every place in `tree` that names the test pool: a string "test" or "...test.parquet", a call of a test
    reader, or evaluation_setup without test=False."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value == "test" or node.value.endswith("test.parquet"):
                found.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in READERS:
                found.append(f"line {node.lineno}: {name}()")
            elif name == SETUP and not any(k.arg == "test" and isinstance(k.value, ast.Constant)
                                           and k.value.value is False for k in node.keywords):
                found.append(f"line {node.lineno}: {SETUP}() without test=False")
    return found


def test_no_module_but_the_evaluation_names_the_test_pool():
    bad = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in EVALUATION:
                continue
            found = offences(ast.parse(path.read_text(), rel))
            if found:
                bad[rel] = found
    assert not bad, f"modules outside the evaluation that name the test pool: {bad}"


def test_the_scan_finds_each_way_of_naming_the_test_pool():
    code = ("read_tasks(folder / 'test.parquet', t)\npools['test']\nevaluated_tasks(p)\n"
            "x.evaluation_setup(p)\nevaluation_setup(p, test=True)\nevaluation_setup(p, measuring=False, test=False)\n")
    assert sorted(f.split(":")[0] for f in offences(ast.parse(code))) == [f"line {i}" for i in (1, 2, 3, 4, 5)]


def test_every_listed_evaluation_module_exists():
    assert all((ROOT / rel).is_file() for rel in EVALUATION)


def test_design_readers_work_without_the_test_file(tmp_path):
    """The validation and training readers the benchmarks and experiments use never open test.parquet: they run
    on a project whose test file is gone; asking read_split for the test split is refused."""
    from benchmarks.cut_designs import validation_tasks
    from dreamshard.io import write_parquet
    from dreamshard.project.evaluation import reported_train_tasks
    from dreamshard.project.tasks import read_split
    from dreamshard.tables import BIN_COLUMNS, TABLE_STATS_SCHEMA
    from stages import tasks as tasks_stage

    rng = np.random.default_rng(0)
    records = [{"table_id": i, "name": f"synthetic_t40_bs64/t{i:04d}", "source": "synthetic",
                "source_file": "synthetic_t40_bs64.pt.gz", "file_table_index": i, "rows": 1000,
                "pooling_factor": 2.0, "batch_size": 64, "num_lookups": 1000, "num_unique": 100,
                **dict(zip(BIN_COLUMNS, rng.dirichlet(np.ones(len(BIN_COLUMNS))).tolist()))} for i in range(40)]
    write_parquet(pa.Table.from_pylist(records, schema=TABLE_STATS_SCHEMA), tmp_path / "tables.parquet")
    family = {"name": "f-4-2", "num_tables": 4, "num_devices": 2, "memory_gb": 0.5, "num_train": 3, "num_test": 2,
              "num_validation": 2}
    params = {"paths": {"tables": str(tmp_path / "tables.parquet"), "tasks": str(tmp_path / "tasks")},
              "memory": {"weights_precision": "fp32", "optimizer": "exact_sgd"},
              "tasks": {"seed": 0, "test_fraction": 0.5, "validation_fraction": 0.2, "dims": [4],
                        "profile": "p", "profiles": {"p": [family]}},
              "evaluate": {"train_tasks_per_family": 1}}
    tasks_stage.run(params)
    test_file = Path(params["paths"]["tasks"]) / "test.parquet"
    assert test_file.is_file()
    test_file.unlink()
    assert [t.name for t in validation_tasks(params)] == ["validation/f-4-2/0000", "validation/f-4-2/0001"]
    assert [t.name for t in read_split(params, "train")] == [f"train/f-4-2/{k:04d}" for k in range(3)]
    assert [t.name for t in reported_train_tasks(params)] == ["train/f-4-2/0000"]
    with pytest.raises(ValueError, match="evaluate stage's alone"):
        read_split(params, "test")
