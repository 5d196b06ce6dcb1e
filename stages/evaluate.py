"""evaluate: plan every test task with every sharder, measure the plans, compare with lower bounds.

Resumable: each task's rows are journaled as soon as they are measured
(dreamshard/evaluation/journal.py, folder `paths.eval_journal`, a persisted DVC output), so
an interrupted run continues where it stopped; the fingerprint of the journal holds every
setting and model that decides the rows, so changed settings measure afresh.

Also measures the backend's additivity (which decides the lower bound, see
dreamshard/evaluation/bounds.py) and checks the bound against the true optimum of small tasks,
found by measuring every plan. The summaries come from dreamshard/evaluation/summary.py.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from tqdm import tqdm

from dreamshard.project.domain import Task, write_parquet, write_text
from dreamshard.project.evaluation import (
    BOUND_USED,
    SEARCH,
    FusionProbe,
    ImproveConfig,
    PlannedTask,
    ProbeCache,
    best_known_check,
    best_known_summary,
    bootstrap_meta,
    bound_regime,
    cost_ratio_figure,
    cost_ratio_table,
    estimated_bins_check,
    estimated_bins_summary,
    evaluate_task,
    evaluation_setup,
    exhaustive_check,
    family_summary,
    first_per_family,
    fusion_probe,
    generalisation,
    make_sharders,
    plan_with,
    regime_of,
    result_row,
    with_ratios,
    with_table_groups,
)
from dreamshard.project.params import ParamsError, build, section
from dreamshard.project.sharders import Sharder, spec


def planning_settings(params: dict[str, Any]) -> tuple[int, int]:
    """params `orchestration.evaluate`: `planning_workers`, processes that plan tasks while nothing is measured,
    and `planning_chunk`, tasks planned together before they are measured (what an interruption can lose)."""
    cfg = (params.get("orchestration") or {}).get("evaluate") or {}
    values = []
    for name in ("planning_workers", "planning_chunk"):
        value = cfg.get(name, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ParamsError(f"params.yaml: orchestration.evaluate.{name}: expected an integer >= 1, got {value!r}")
        values.append(value)
    return values[0], values[1]


_PLANNER: dict[str, list[Sharder]] = {}  # a planning worker's sharders (its process only; see Planner)


def _start_planner(params: dict[str, Any]) -> None:
    import torch
    from threadpoolctl import threadpool_limits

    # A worker is a program: one thread per planning process, set once at its start. torch's count does not
    # reach NumPy's BLAS (OpenBLAS starts a thread per core), and the decoders' NumPy steps use it: two
    # workers then ran a BLAS thread per core each, oversubscribing the cores and slowing planning
    # (results/paper-today).
    torch.set_num_threads(1)
    threadpool_limits(1)
    _PLANNER["sharders"] = make_sharders(params, int(section(params, "backend.batch_size")))


def _plan_in_worker(task: Task) -> list[PlannedTask]:
    return plan_with(_PLANNER["sharders"], task)


class Planner:
    """Every sharder's plan of tasks (plan_with): in `workers` processes when more than 1, here otherwise.

    The stage plans a chunk of tasks, then measures them: planning never runs beside a measurement, and
    the processes share the machine's cores with each other only. They are started once (spawned, not
    forked: the stage runs Prefect's threads) and wait idle while the stage measures. Each builds the
    sharders from `params` like the stage (the same seeds and models), so the plans equal those planned
    here; planning times are each process's own.
    """

    def __init__(self, params: dict[str, Any], sharders: list[Sharder], workers: int) -> None:
        self.params, self.sharders, self.workers = params, sharders, workers
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Planner:
        if self.workers > 1:
            self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_start_planner, initargs=(self.params,))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def plan(self, tasks: Sequence[Task]) -> list[list[PlannedTask]]:
        if self.pool is None or len(tasks) <= 1:
            return [plan_with(self.sharders, t) for t in tasks]
        return list(self.pool.map(_plan_in_worker, tasks))


def run(params: dict[str, Any]) -> None:
    cfg = section(params, "evaluate")
    batch_size = int(section(params, "backend.batch_size"))
    setup = evaluation_setup(params)
    backend, sharders, journal, tasks, splits = setup.backend, setup.sharders, setup.journal, setup.tasks, setup.splits

    probe_tasks = tasks[: int(cfg["additivity_probes"])]
    # the regime is measured and reported; the bounds assume neither direction (EITHER), so that they hold on
    # processors where fusion costs more and where it saves, and drop the per-table term where a probe saw
    # tables fused cheaper than one of them alone (NON_MONOTONE; bounds.py). Journaled: measured once per run
    fusion = [FusionProbe.from_dict(d) for d in
              journal.once("fusion_probes", lambda: [fusion_probe(backend, t).to_dict() for t in probe_tasks])]
    ratios = [p.additivity for p in fusion]
    regime, bound = regime_of(ratios), bound_regime(fusion)
    print(f"evaluate: {backend.name} on {backend.device_name()}: fused / sum of singles = "
          f"{', '.join(f'{r:.3f}' for r in ratios)} -> {regime}; fused / costliest single = "
          f"{', '.join(f'{p.monotone:.3f}' for p in fusion)} -> bound {bound}")

    column_splits = any(spec(s.name).splits_tables for s in sharders)

    # the bounds' probes: each the least of `rounds` readings, a single-table probe once per table and width
    probes = ProbeCache(backend, int(cfg["rounds"]))

    planned: dict[str, list[PlannedTask]] = {}  # by journal key: the chunk's plans, until measured

    def evaluate(split: str, task) -> list[dict]:
        return [{"split": split, **result_row(r)}
                for r in evaluate_task(backend, task, sharders, bound, int(cfg["rounds"]),
                                       column_splits=column_splits, probes=probes,
                                       row_probe_ratio=float(cfg["row_probe_ratio"]),
                                       planned=planned.pop(journal.key(split, task)))]

    done = journal.journaled_count(splits)
    if done:
        print(f"evaluate: {done} of {len(splits)} tasks already journaled in {journal.folder}: continuing")
    workers, chunk = planning_settings(params)
    rows: list[dict] = []
    with Planner(params, sharders, workers) as planner, \
            tqdm(total=len(splits), initial=done, desc="evaluate", unit="task") as bar:
        for start in range(0, len(splits), chunk):  # plan a chunk, then measure it: journaled task by task
            part = splits[start:start + chunk]
            pending = [(split, t) for split, t in part if not journal.has(split, t)]
            planned.update(zip([journal.key(split, t) for split, t in pending],
                               planner.plan([t for _, t in pending])))
            rows += journal.run(part, evaluate, lambda _s, _t, reused: None if reused else bar.update())
    results = with_table_groups(pd.DataFrame(rows), tasks)  # intervals resample test tasks that share tables together
    out = Path(section(params, "paths.eval"))
    write_parquet(pa.Table.from_pandas(results, preserve_index=False), out / "results.parquet")

    ex = cfg["exhaustive"]
    exhaustive = exhaustive_check(backend, tasks, sharders, int(ex["num_tasks"]), int(ex["num_tables"]),
                                  int(ex["num_devices"]), bound, int(ex["top_plans"]),
                                  int(ex["rounds"]))
    bk = cfg["best_known"]  # distance to the best plan a measured search finds (dreamshard/evaluation/improve.py)
    search = {k: v for k, v in bk.items() if k not in ("tasks_per_family", "seeds")}
    improve_config = build(ImproveConfig, {**search, "seed": int(cfg["seed"])}, "evaluate.best_known")
    searched = first_per_family(tasks, int(bk["tasks_per_family"]))
    test_results = results[results["split"] == "test"]
    # journaled per task and search settings: a changed budget or seed count searches again, as do a journal's
    # searches from before candidates were read beside the incumbent and the found plan rechecked (SEARCH)
    settings = hashlib.sha1(json.dumps([bk, SEARCH], sort_keys=True).encode()).hexdigest()[:12]
    best_known = [journal.once(f"best_known-{settings}-{journal.key('test', t)}",
                               lambda t=t: best_known_check(backend, [t], test_results, improve_config,
                                                            bk["seeds"])[0])
                  for t in tqdm(searched, desc="best known", unit="task")]
    eb = cfg["estimated_bins"]  # what planning without histograms costs (dreamshard.data.bins)
    learned = [s for s in sharders if spec(s.name).needs_model]
    comparisons = estimated_bins_check(backend, first_per_family(tasks, int(eb["tasks_per_family"])), learned,
                                       int(eb["rounds"]))
    families = family_summary(results[results["split"] == "test"], seed=int(cfg["seed"]))
    train_families = family_summary(results[results["split"] == "train"], seed=int(cfg["seed"]))
    metrics = {
        "backend": backend.name,
        "device": backend.device_name(),
        "measured": backend.measured,
        "versions": backend.versions(),
        "batch_size": batch_size,
        "additivity": {"fused_over_sum_of_singles": ratios, "regime": regime,
                       "fused_over_costliest_single": [p.monotone for p in fusion], "bound": bound,
                       "lower_bound": BOUND_USED[bound]},
        "rounds": int(cfg["rounds"]),
        # this run's probes: a task read from the journal measures none ("tasks_from_journal" of them)
        "bound_probes": {"measured": len(probes.costs), "reused": probes.hits, "tasks_from_journal": done},
        "bootstrap": bootstrap_meta(int(cfg["seed"]), grouped=True),
        "families": families,
        "train_families": train_families,
        "generalisation": with_ratios(generalisation(sharders, tasks), families, train_families),
        "exhaustive": exhaustive,
        "best_known": best_known_summary(best_known, improve_config),
        "estimated_bins": estimated_bins_summary(comparisons),
    }
    write_text(json.dumps(metrics, indent=2) + "\n", section(params, "paths.eval_metrics"))
    plot = results[results["split"] == "test"].groupby(["family", "algorithm"], sort=False)["cost_over_lb"].mean().reset_index()
    plot["family_algorithm"] = plot["family"] + " / " + plot["algorithm"]
    write_parquet(pa.Table.from_pandas(plot, preserve_index=False), out / "summary.parquet")
    plot_path = Path(section(params, "paths.eval_plot"))
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    write_text(plot[["family_algorithm", "cost_over_lb"]].to_csv(index=False), plot_path)
    plots = Path(section(params, "paths.plots"))
    write_text(cost_ratio_table(metrics["families"]).to_csv(index=False), plots / "eval_cost_ratio.csv")
    cost_ratio_figure(metrics["families"], plots / "eval_cost_ratio.png", backend=backend.name,
                      device=backend.device_name(), measured=backend.measured)
    print(f"evaluate: {len(tasks)} tasks x {len(sharders)} sharders -> {out}, {section(params, 'paths.eval_metrics')}")


