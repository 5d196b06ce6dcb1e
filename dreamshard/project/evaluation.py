"""What the evaluate stage evaluates: the tasks in its order, the sharders of `evaluate.sharders` with their trained
models, and the fingerprint of everything that decides an evaluated task's rows."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dreamshard.evaluation.journal import file_digest
from dreamshard.evaluation.summary import first_per_family, interleave_families
from dreamshard.project.params import ParamsError, build, section
from dreamshard.sharders import Sharder, load_model, make_sharder, spec
from dreamshard.sharders.cuts import CutConfig
from dreamshard.sharders.search import SearchConfig
from dreamshard.tasks import Task, read_tasks


def model_paths_of(params: dict[str, Any]) -> dict[str, str]:
    """The checkpoint of each sharder that needs a trained model."""
    return {"dreamshard": section(params, "paths.dreamshard_model"),
            "dreamshard_cut": section(params, "paths.dreamshard_model"),  # DreamShard's model, searching cuts
            "autoshard": section(params, "paths.autoshard_model"),
            "rnn": section(params, "paths.rnn_model"),
            "neuroshard": section(params, "paths.neuroshard_model"),
            "neuroshard_tw": section(params, "paths.neuroshard_model")}  # the same model, table-wise


def make_sharders(params: dict[str, Any], batch_size: int) -> list[Sharder]:
    """`evaluate.sharders`, each given the options it takes; trained models from their `paths`."""
    cfg = section(params, "evaluate")
    names = cfg.get("sharders")
    if not names or not isinstance(names, list):
        raise ParamsError("params.yaml: evaluate.sharders: expected a list of sharder names")
    model_paths = model_paths_of(params)
    settings = {"seed": int(cfg["seed"]), "batch_size": batch_size,
                "search": build(SearchConfig, section(params, "neuroshard"), "neuroshard"),
                "cuts": build(CutConfig, section(params, "cut_search"), "cut_search")}
    decoding = cfg.get("decoding") or {}  # per sharder: options beyond the shared settings (policy decoding)
    if not isinstance(decoding, dict) or any(not isinstance(v, dict) for v in decoding.values()):
        raise ParamsError(f"params.yaml: evaluate.decoding: expected a mapping of sharder name to options, "
                          f"got {decoding!r}")
    unused = sorted(set(decoding) - set(names))
    if unused:
        raise ParamsError(f"params.yaml: evaluate.decoding: {', '.join(unused)} not in evaluate.sharders")
    sharders = []
    for name in names:
        try:
            s = spec(name)
            options = {**s.taken_from(settings), **decoding.get(name, {})}
            if s.needs_model:
                options["model"] = load_model(name, model_paths[name])
            sharders.append(make_sharder(name, **options))
        except ValueError as exc:
            raise ParamsError(f"params.yaml: evaluate.sharders: {exc}") from None
    return sharders


def evaluated_tasks(params: dict[str, Any]) -> tuple[list[Task], list[tuple[str, Task]]]:
    """The test tasks in file order, and every (split, task) the stage evaluates in its order: the test tasks and
    `evaluate.train_tasks_per_family` training tasks of each family, each split with the families in turns (a
    long run stopped partway, journaled, has measured a like share of every family)."""
    tasks_dir, tables = Path(section(params, "paths.tasks")), section(params, "paths.tables")
    tasks = read_tasks(tasks_dir / "test.parquet", tables)
    train_tasks = first_per_family(read_tasks(tasks_dir / "train.parquet", tables),
                                   int(section(params, "evaluate.train_tasks_per_family")))
    return tasks, ([("test", t) for t in interleave_families(tasks)]
                   + [("train", t) for t in interleave_families(train_tasks)])


def journal_fingerprint(params: dict[str, Any], backend, sharders: list[Sharder]) -> str:
    """Everything that decides an evaluated task's rows besides the task: the backend (kind, device, versions,
    settings), the evaluation settings, both searches' settings (NeuroShard's, dreamshard_cut's) and the bytes of
    every model the sharders load."""
    cfg = section(params, "evaluate")
    models = model_paths_of(params)
    evaluate = {k: cfg[k] for k in ("seed", "sharders", "rounds", "additivity_probes", "row_probe_ratio")}
    evaluate["decoding"] = cfg.get("decoding") or {}  # absent: no options
    return json.dumps({
        "backend": [backend.name, backend.device_name(), backend.versions(), section(params, "backend")],
        "evaluate": evaluate,
        "neuroshard": section(params, "neuroshard"),
        "cut_search": section(params, "cut_search"),
        "models": {s.name: file_digest(models[s.name]) for s in sharders if spec(s.name).needs_model},
    }, sort_keys=True, default=str)
