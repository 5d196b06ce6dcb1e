"""What the evaluate stage evaluates: the tasks in its order, the sharders of `evaluate.sharders` with their trained
models, the fingerprint of everything that decides an evaluated task's rows, and all of it set up at once
(`evaluation_setup`: the stage, and the tools and experiments that read its journal). Also the evaluation's
parts the stages, benchmarks, experiments and tools use: bounds, measuring plans, the measured search, the
journal, summaries, figures, reports (dreamshard.evaluation; collecting the cost data: project.collection)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreamshard.data.lookups import RecordedLookups
from dreamshard.evaluation.bounds import BOUND_USED, FusionProbe, bound_regime, fusion_probe, regime_of, whole_shards
from dreamshard.evaluation.evaluate import PlannedTask, ProbeCache, estimated_bins_check, evaluate_task, plan_with
from dreamshard.evaluation.figures import cost_ratio_figure, cost_ratio_table
from dreamshard.evaluation.improve import SEARCH, ImproveConfig
from dreamshard.evaluation.journal import EvalJournal, file_digest
from dreamshard.evaluation.report import eval_markdown, replace_block, summary_markdown
from dreamshard.evaluation.summary import (
    best_heuristics,
    best_known_check,
    best_known_summary,
    bootstrap_ci,
    bootstrap_meta,
    estimated_bins_summary,
    exhaustive_check,
    family_summary,
    first_per_family,
    generalisation,
    interleave_families,
    pooled_summary,
    result_row,
    torchrec_peers,
    with_ratios,
    with_table_groups,
)
from dreamshard.hardware.base import PROBE_READING, REDUCTION, CostBackend
from dreamshard.hardware.comm import MODEL_VERSION as COMM_MODEL_VERSION
from dreamshard.hardware.topology import Topology
from dreamshard.interop.torchrec import ENUMERATION_ORDER
from dreamshard.learning.features import FOLDED
from dreamshard.project.backend import backend_of
from dreamshard.project.params import ParamsError, build, section
from dreamshard.sharders import Sharder, load_model, make_sharder, spec
from dreamshard.sharders.cuts import CutConfig
from dreamshard.sharders.search import DEVICE_RATING, SearchConfig
from dreamshard.tasks import Task, read_tasks

__all__ = [
    "BOUND_USED", "SEARCH", "EvalJournal", "Evaluation", "FusionProbe", "ImproveConfig", "PlannedTask", "ProbeCache",
    "best_heuristics", "best_known_check", "best_known_summary", "bootstrap_ci", "bootstrap_meta", "bound_regime",
    "cost_ratio_figure",
    "cost_ratio_table", "estimated_bins_check", "estimated_bins_summary", "eval_markdown", "evaluate_task",
    "evaluated_tasks", "evaluation_setup", "exhaustive_check", "family_summary", "first_per_family", "fusion_probe",
    "generalisation", "journal_fingerprint", "make_sharders", "model_paths_of", "plan_with", "pooled_summary",
    "regime_of", "reported_train_tasks",
    "replace_block", "result_row", "summary_markdown", "torchrec_peers", "whole_shards", "with_ratios",
    "with_table_groups",
]


def model_paths_of(params: dict[str, Any]) -> dict[str, str]:
    """The checkpoint of each sharder that needs a trained model."""
    return {"dreamshard": section(params, "paths.dreamshard_model"),
            "dreamshard_cut": section(params, "paths.dreamshard_model"),  # DreamShard's model, searching cuts
            "autoshard": section(params, "paths.autoshard_model"),
            "rnn": section(params, "paths.rnn_model"),
            "neuroshard": section(params, "paths.neuroshard_model"),
            "neuroshard_tw": section(params, "paths.neuroshard_model")}  # the same model, table-wise


def _hbm_gbps(params: dict[str, Any]) -> float | None:
    value = section(params, "backend").get("hbm_gbps")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
        raise ParamsError(f"params.yaml: backend.hbm_gbps: expected a positive number of GB/s or null, got {value!r}")
    return None if value is None else float(value)


def torchrec_calibration(params: dict[str, Any], batch_size: int, links: Any = None, hbm_gbps: float | None = None):
    """`torchrec_calibrated`'s factors, fitted to the collect stage's measured devices (`paths.costs`) of the
    training tasks (interop.calibration)."""
    import pandas as pd

    from dreamshard.interop.calibration import fit_calibration

    costs = Path(section(params, "paths.costs"))
    for name in ("plans.parquet", "devices.parquet"):
        if not (costs / name).exists():
            raise ParamsError(f"params.yaml: evaluate.sharders: torchrec_calibrated is fitted to {costs / name}, which "
                              "does not exist: run the collect stage first")
    tasks = read_tasks(Path(section(params, "paths.tasks")) / "train.parquet", section(params, "paths.tables"))
    return fit_calibration({t.name: t for t in tasks}, pd.read_parquet(costs / "plans.parquet"),
                           pd.read_parquet(costs / "devices.parquet"), batch_size, links, hbm_gbps)


def make_sharders(params: dict[str, Any], batch_size: int, names: list[str] | None = None,
                  model_paths: dict[str, Any] | None = None, seed: int | None = None) -> list[Sharder]:
    """`evaluate.sharders` (or `names`), each given the options it takes and its `evaluate.decoding`; trained models
    from their `paths` (or `model_paths`); `seed`: `evaluate.seed` by default."""
    cfg = section(params, "evaluate")
    evaluated = cfg.get("sharders")
    if not evaluated or not isinstance(evaluated, list):
        raise ParamsError("params.yaml: evaluate.sharders: expected a list of sharder names")
    names = evaluated if names is None else names
    model_paths = model_paths_of(params) if model_paths is None else model_paths
    # TorchRec's planners are told the cluster the backend prices: hosts, links, memory bandwidth
    links, hbm_gbps = build(Topology, section(params, "backend.topology"), "backend.topology"), _hbm_gbps(params)
    settings = {"seed": int(cfg["seed"]) if seed is None else seed, "batch_size": batch_size,
                "search": build(SearchConfig, section(params, "neuroshard"), "neuroshard"),
                "cuts": build(CutConfig, section(params, "cut_search"), "cut_search"),
                "links": links, "hbm_gbps": hbm_gbps}
    if "torchrec_calibrated" in names:  # TorchRec's compute fitted to the collected measurements, once
        settings["calibration"] = torchrec_calibration(params, batch_size, links, hbm_gbps)
    fallback = cfg.get("fallback")  # learned sharders' plans beyond their training range (sharders/fallback.py)
    if fallback not in (None, *FALLBACKS):
        raise ParamsError(f"params.yaml: evaluate.fallback: expected one of {', '.join(FALLBACKS)} or null, "
                          f"got {fallback!r}")
    if fallback:
        settings["fallback"] = make_sharder(fallback, **spec(fallback).taken_from(settings))
    decoding = cfg.get("decoding") or {}  # per sharder: options beyond the shared settings (policy decoding)
    if not isinstance(decoding, dict) or any(not isinstance(v, dict) for v in decoding.values()):
        raise ParamsError(f"params.yaml: evaluate.decoding: expected a mapping of sharder name to options, "
                          f"got {decoding!r}")
    unused = sorted(set(decoding) - set(evaluated))
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
    tasks = read_tasks(Path(section(params, "paths.tasks")) / "test.parquet", section(params, "paths.tables"))
    return tasks, ([("test", t) for t in interleave_families(tasks)]
                   + [("train", t) for t in reported_train_tasks(params)])


def reported_train_tasks(params: dict[str, Any]) -> list[Task]:
    """The training tasks the evaluate stage reports beside the test tasks, in its order: the first
    `evaluate.train_tasks_per_family` of each family, the families in turns (reads no test task)."""
    return interleave_families(first_per_family(read_tasks(Path(section(params, "paths.tasks")) / "train.parquet",
                                                           section(params, "paths.tables")),
                                                int(section(params, "evaluate.train_tasks_per_family"))))


FALLBACKS = ("torchrec_full", "torchrec", "torchrec_model")  # evaluate.fallback: sharders that plan and rate plans
# the rule the fallback keeps a plan by (sharders/fallback.py): changing it changes plans beyond the training range
FALLBACK_RULE = "none where every feature beyond the range is folded, else judged by the analytic sharder's model"


def journal_fingerprint(params: dict[str, Any], backend, sharders: list[Sharder]) -> str:
    """Everything that decides an evaluated task's rows besides the task: the backend (kind, device, versions,
    settings), how readings reduce to a cost, which features the learned models fold, the evaluation settings, the
    order TorchRec's planner enumerates in, both searches' settings (NeuroShard's, dreamshard_cut's), how
    NeuroShard's rates a device and the bytes of every model the sharders load."""
    cfg = section(params, "evaluate")
    models = model_paths_of(params)
    evaluate = {k: cfg[k] for k in ("seed", "sharders", "rounds", "additivity_probes", "row_probe_ratio")}
    evaluate["decoding"] = cfg.get("decoding") or {}  # absent: no options
    evaluate["fallback"] = cfg.get("fallback")
    evaluate["fallback_rule"] = FALLBACK_RULE
    return json.dumps({
        "backend": [backend.name, backend.device_name(), backend.versions(), section(params, "backend")],
        "comm_model": COMM_MODEL_VERSION,
        "reduction": REDUCTION,
        "probe_reading": PROBE_READING,
        "torchrec_enumeration": ENUMERATION_ORDER,
        "fold": list(FOLDED),
        "evaluate": evaluate,
        "neuroshard": section(params, "neuroshard"),
        "neuroshard_rating": DEVICE_RATING,
        "cut_search": section(params, "cut_search"),
        "models": {s.name: file_digest(models[s.name]) for s in sharders if spec(s.name).needs_model},
    }, sort_keys=True, default=str)


@dataclass
class Evaluation:
    """What the evaluate stage evaluates with, built from params (`evaluation_setup`)."""

    backend: CostBackend
    sharders: list[Sharder]  # evaluate.sharders, with their trained models
    journal: EvalJournal  # paths.eval_journal, under the fingerprint of backend, settings and models
    tasks: list[Task]  # the test tasks in file order
    splits: list[tuple[str, Task]]  # every (split, task) evaluated, in the stage's order (evaluated_tasks)


def evaluation_setup(params: dict[str, Any], measuring: bool = True, test: bool = True) -> Evaluation:
    """The evaluate stage's backend, sharders, journal and tasks for `params`, as the stage builds them; with
    `measuring` false the backend gets no lookups (to read a journal, plan again, fingerprint: nothing measured);
    with `test` false no test task is read (tasks empty, splits the reported training tasks): design tools reading
    the stage's journal (tests/unit/test_pools.py holds that only evaluation reads the test pool)."""
    backend = backend_of(params) if measuring else backend_of(params, lookups=RecordedLookups({}))
    tasks, splits = evaluated_tasks(params) if test else \
        ([], [("train", t) for t in reported_train_tasks(params)])
    sharders = make_sharders(params, int(section(params, "backend.batch_size")))
    journal = EvalJournal(section(params, "paths.eval_journal"), journal_fingerprint(params, backend, sharders))
    return Evaluation(backend, sharders, journal, tasks, splits)
