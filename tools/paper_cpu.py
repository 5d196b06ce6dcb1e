"""The paper-scale run on the CPU kernels, kept in results/paper-cpu/: read where it stands, and continue it.

The DreamShard paper's ten families, 50 test tasks each (`tasks.profile: paper`, 856 synthetic tables), take
hours to evaluate on a 2-core machine, more than one session. The evaluate stage journals every task as soon
as it is measured (dreamshard/evaluation/journal.py). But the journal's keys hold the bytes of the trained
models and the processor's name, and the models learn from measurements, so a fresh clone cannot rebuild the
same ones. This script keeps in git what a continuation needs, beside what a reader wants:

    python -m tools.paper_cpu save [--root DIR] [--out results/paper-cpu] [--readme results/paper-cpu/README.md]

        In the run's workspace, while evaluate runs or after it stopped (it reads, it measures nothing):
        params.yaml; the checkpoints evaluate loads; the journal, as one archive (state/eval_journal.tar.xz:
        its Parquet files stored uncompressed, so that xz compresses across tasks; names sorted, times and
        owners fixed, so the same journal gives the same bytes); the training metrics; digests of the
        deterministic data; provenance.json (processor, versions, commit, every stage's Prefect flow runs with
        their wall times, progress); eval.json, summary.txt (the generated Markdown table of eval.json:
        over 12 KB at paper scale, so kept as text beside the folder's README) and eval_cost_ratio.png over
        the tasks journaled so far (partial: true), or the stage's own metrics once it finished. --readme
        replaces a README's paper-cpu block with the summary.

    python -m tools.paper_cpu restore [--root DIR] [--from results/paper-cpu]

        In a fresh clone, on the same processor: params.yaml into place, the deterministic stages rebuilt
        (`dvc repro tasks`) and checked against the saved digests, one journaled task of each family planned
        again by every sharder and checked against the journal's plans (code that plans otherwise is
        refused), the journaled plans of two tasks measured again (a machine that times them beyond 1.3x
        either way is refused: --timing-tasks, --timing-tolerance), then the checkpoints, training metrics
        and the journal into place. Then

            python -m pipeline.serve -- dvc repro -s evaluate

        continues the evaluation where it stopped; `save` again records the progress. Each refusal (other
        plans, other processor or timings, other data) says why: the journal would not match, and the run would start
        over or, worse, mix plans of other code into it.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from dreamshard.project.domain import DreamShardError, atomic_path
from dreamshard.project.params import load_params, section

PROFILE_KEYS = ("tasks.profile", "data.synthetic.num_tables", "data.source")
CODE = ("dreamshard", "stages", "pipeline")  # what decides the rows besides params and models
MODEL_PATHS = ("dreamshard_model", "autoshard_model", "rnn_model", "neuroshard_model")  # params paths evaluate loads
DATA = ("paths.tables", "paths.requests", "paths.tasks")  # rebuilt by `dvc repro tasks`, checked by digest
STAGES = ("download", "process", "tasks", "collect", "collect_devices", "train_cost", "train_policy",
          "train_autoshard", "train_rnn", "train_neuroshard", "evaluate")
TRAINING_METRICS = ("cost_model.json", "train_dreamshard.json", "train_autoshard.json", "train_rnn.json",
                    "neuroshard.json")
JOURNAL_ARCHIVE = "eval_journal.tar.xz"  # under the kept folder's state/
SUMMARY = "summary.txt"
BEGIN = "<!-- paper-cpu:begin (python -m tools.paper_cpu save --readme README.md) -->"
END = "<!-- paper-cpu:end -->"


class RunError(DreamShardError):
    pass


# ---------------------------------------------------------------- what the run's journal holds


def evaluation_of(params: dict[str, Any]):
    """The evaluate stage's backend, sharders, journal and (split, task) list for `params`, as the stage builds
    them (project.evaluation's evaluation_setup; nothing measured: the backend gets no lookups)."""
    from dreamshard.project.evaluation import evaluation_setup

    setup = evaluation_setup(params, measuring=False)
    return setup.backend, setup.sharders, setup.journal, setup.splits


def progress_of(journal, splits) -> dict[str, Any]:
    """Tasks journaled of all the run evaluates, in all and per split and family."""
    done = Counter((s, t.family) for s, t in splits if journal.has(s, t))
    total = Counter((s, t.family) for s, t in splits)
    return {"journaled": sum(done.values()), "total": sum(total.values()),
            "per_family": {f"{s}/{f}": [done[(s, f)], n] for (s, f), n in total.items()}}


def journal_metrics(params: dict[str, Any], backend, sharders, journal, splits,
                    progress: dict[str, Any]) -> dict[str, Any]:
    """metrics/eval.json's comparisons over the tasks journaled so far (`partial`: true): families and
    training families with their bootstrap intervals, the fusion regime the run measured. The checks that run
    after the last task (exhaustive, best known, estimated bins) are not in it."""
    import pandas as pd

    from dreamshard.project.evaluation import (
        BOUND_USED,
        FusionProbe,
        bootstrap_meta,
        bound_regime,
        family_summary,
        generalisation,
        regime_of,
        with_ratios,
        with_table_groups,
    )

    cfg = section(params, "evaluate")
    rows = [r for s, t in splits if journal.has(s, t) for r in journal.read(s, t)]
    results = pd.DataFrame(rows)
    if len(results):  # test tasks sharing tables resample together, as the evaluate stage's intervals do
        results = with_table_groups(results, [t for s, t in splits if s == "test"])
    seed = int(cfg["seed"])
    probes = journal.peek("fusion_probes")
    fusion = [FusionProbe.from_dict(d) for d in probes] if probes else []
    ratios = [p.additivity for p in fusion]
    bound = bound_regime(fusion) if fusion else None
    test = results[results["split"] == "test"] if len(results) else results
    train = results[results["split"] == "train"] if len(results) else results
    families = family_summary(test, seed=seed) if len(test) else {}
    train_families = family_summary(train, seed=seed) if len(train) else {}
    return {
        "partial": True,
        "progress": progress,
        "backend": backend.name, "device": backend.device_name(), "measured": backend.measured,
        "versions": backend.versions(), "batch_size": int(section(params, "backend.batch_size")),
        "additivity": {"fused_over_sum_of_singles": ratios, "regime": regime_of(ratios) if ratios else "not measured",
                       "fused_over_costliest_single": [p.monotone for p in fusion], "bound": bound,
                       "lower_bound": BOUND_USED[bound] if bound else "not measured"},
        "rounds": int(cfg["rounds"]),
        "bootstrap": bootstrap_meta(seed, grouped=True),
        "families": families,
        "train_families": train_families,
        "generalisation": with_ratios(generalisation(sharders, [t for s, t in splits if s == "test"]),
                                      families, train_families),
    }


# ---------------------------------------------------------------- the journal as one archive


def _stored(path: Path) -> bytes:
    """A journal file's bytes as the archive keeps them: Parquet rewritten uncompressed (the same rows and
    types; its readers take any codec), so that the archive's xz finds what tasks share; JSON as it is."""
    if path.suffix != ".parquet":
        return path.read_bytes()
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pq.read_table(path), out, compression="NONE", use_dictionary=False)
    return out.getvalue()


def journal_members(archive: Path) -> dict[str, bytes]:
    """The files of a journal archive, by name (empty when there is no archive)."""
    if not archive.exists():
        return {}
    out = {}
    with tarfile.open(archive, "r:xz") as tar:
        for m in tar.getmembers():
            name = Path(m.name).name
            if m.isfile() and name and name == m.name.removeprefix("eval_journal/"):
                f = tar.extractfile(m)
                if f is not None:
                    out[name] = f.read()
    return out


def pack_journal(files: list[Path], archive: Path) -> int:
    """Add the journal files `files` to `archive` (made if absent; a name already there is kept, as a
    journaled task never changes); deterministic: sorted names, mtime 0, owner root, mode 0644. Returns how
    many files the archive holds."""
    members = journal_members(archive)
    added = {f.name: _stored(f) for f in sorted(files) if f.is_file() and f.name not in members}
    if not added and archive.exists():
        return len(members)
    members.update(added)
    with atomic_path(archive) as tmp, \
            tarfile.open(tmp, "w:xz", preset=9 | lzma.PRESET_EXTREME, format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(f"eval_journal/{name}")
            info.size, info.mtime, info.mode, info.uid, info.gid = len(members[name]), 0, 0o644, 0, 0
            tar.addfile(info, io.BytesIO(members[name]))
    return len(members)


def unpack_journal(archive: Path, folder: Path) -> int:
    """Write the archive's journal files into `folder`, leaving files already there; returns how many it wrote."""
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    for name, data in sorted(journal_members(archive).items()):
        if not (folder / name).exists():
            (folder / name).write_bytes(data)
            written += 1
    return written


# ---------------------------------------------------------------- provenance


def file_sha1(path: Path) -> str:
    h = hashlib.sha1()
    for f in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode() if f != path else b"")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def data_digests(params: dict[str, Any]) -> dict[str, str]:
    """sha1 of each deterministic artifact (a folder: of its files' names and bytes)."""
    out = {}
    for key in DATA:
        path = Path(section(params, key))
        if not path.exists():
            raise RunError(f"{path} ({key}): not found; run `dvc repro tasks` first")
        out[key] = file_sha1(path)
    return out


def _utc(stamp: str) -> datetime:
    """A Prefect database time (UTC, written without a zone)."""
    t = datetime.fromisoformat(stamp)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def flow_runs(prefect_db: Path, journal_folder: Path | None = None) -> list[dict[str, Any]]:
    """Every stage's Prefect flow runs in the database at `prefect_db` (Prefect's own record): id, stage, state,
    start, end and wall seconds. A run with no end (still running, or killed with its server) gets the time of
    the last file it journaled in `journal_folder` as its end, marked `"end_from": "journal"`. Empty when there
    is no database."""
    if not prefect_db.exists():
        return []
    con = sqlite3.connect(f"file:{prefect_db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT fr.id, f.name, fr.state_type, fr.start_time, fr.end_time FROM flow_run fr "
                           "JOIN flow f ON f.id = fr.flow_id ORDER BY fr.start_time").fetchall()
    finally:
        con.close()
    written = sorted(f.stat().st_mtime for f in journal_folder.glob("*")) if journal_folder else []
    out = []
    for run_id, stage, state, start, end in rows:
        if stage not in STAGES or not start:
            continue  # subflows (collect-measure) are inside their stage's time
        run = {"id": run_id, "stage": stage, "state": state, "start": start, "end": end, "wall_s": None}
        if end:
            run["wall_s"] = round((_utc(end) - _utc(start)).total_seconds(), 1)
        else:
            began = _utc(start).timestamp()
            mine = [t for t in written if t >= began]
            if mine:
                run.update(end=datetime.fromtimestamp(mine[-1], UTC).strftime("%Y-%m-%d %H:%M:%S.%f"),
                           end_from="journal", wall_s=round(mine[-1] - began, 1))
        out.append(run)
    return out


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------- save


def save(params_file: Path, out: Path, root: Path, readme: Path | None = None,
         prefect_db: Path | None = None) -> dict[str, Any]:
    """Keep the run of `params_file` (paths relative to the working directory) in `out`; returns the provenance."""
    from dreamshard.project.domain import write_text
    from dreamshard.project.evaluation import cost_ratio_figure, model_paths_of, replace_block, summary_markdown

    params = load_params(params_file)
    backend, sharders, journal, splits = evaluation_of(params)
    progress = progress_of(journal, splits)
    stage_metrics = Path(section(params, "paths.eval_metrics"))
    newest = max((p.stat().st_mtime for p in journal.folder.glob("*")), default=0.0)
    finished = (progress["journaled"] == progress["total"] and stage_metrics.exists()
                and stage_metrics.stat().st_mtime >= newest)
    if finished:
        metrics = {**json.loads(stage_metrics.read_text()), "partial": False, "progress": progress}
    else:
        metrics = journal_metrics(params, backend, sharders, journal, splits, progress)

    out.mkdir(parents=True, exist_ok=True)
    state = out / "state"
    shutil.copyfile(params_file, out / "params.yaml")
    models = {name: Path(path) for name, path in model_paths_of(params).items()
              if any(s.name == name for s in sharders)}
    for path in models.values():
        (state / "models").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, state / "models" / path.name)
    legacy = state / "eval_journal"  # the journal as a folder, as runs were kept before the archive
    pack_journal([*legacy.glob("*"), *journal.folder.glob("*")], state / JOURNAL_ARCHIVE)
    if legacy.is_dir():
        shutil.rmtree(legacy)
    metrics_dir = Path(section(params, "paths.metrics"))
    (out / "metrics").mkdir(exist_ok=True)
    for name in TRAINING_METRICS:
        if (metrics_dir / name).exists():
            shutil.copyfile(metrics_dir / name, out / "metrics" / name)

    previous = json.loads((out / "provenance.json").read_text()) if (out / "provenance.json").exists() else {}
    runs = {r["id"]: r for r in previous.get("flow_runs", [])}
    commit = _git(root, "rev-parse", "HEAD")
    for r in flow_runs(prefect_db if prefect_db is not None else root / ".prefect" / "prefect.db", journal.folder):
        runs[r["id"]] = {**r, "commit": commit, "device": backend.device_name()}
    ordered = sorted(runs.values(), key=lambda r: r["start"] or "")
    completed: dict[str, float] = {}
    for r in ordered:
        if r["wall_s"] is not None:
            completed[r["stage"]] = round(completed.get(r["stage"], 0.0) + r["wall_s"], 1)
    provenance = {
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "processor": backend.device_name(),
        "measured": backend.measured,
        "versions": {**backend.versions(), "python": sys.version.split()[0],
                     **{d: _version(d) for d in ("torchrec", "prefect", "dvc")}},
        "commit": commit,
        "code_dirty": bool(_git(root, "status", "--porcelain", "--", *CODE)),
        "profile": {k: section(params, k) for k in PROFILE_KEYS},
        "finished": finished,
        "progress": progress,
        # summed over the stage's flow runs: a continued evaluate runs more than once, and a failed run counts too
        "stage_wall_s": completed,
        "flow_runs": ordered,
        "data_digests": data_digests(params),
        "model_digests": {name: file_sha1(path) for name, path in models.items()},
    }
    write_text(json.dumps(provenance, indent=2) + "\n", out / "provenance.json")
    write_text(json.dumps(metrics, indent=2) + "\n", out / "eval.json")
    done, total = progress["journaled"], progress["total"]
    head = ("Finished" if finished else f"Partial: {done} of {total} tasks journaled") + \
        f" (commit {commit[:10]}, {backend.device_name()}, saved {provenance['saved_at']})."
    summary = f"{head}\n\n{summary_markdown(metrics) if metrics['families'] else 'No task journaled yet.'}\n"
    write_text(summary, out / SUMMARY)
    if metrics["families"]:
        cost_ratio_figure(metrics["families"], out / "eval_cost_ratio.png", backend=backend.name,
                          device=f"{backend.device_name()}; paper scale" + ("" if finished else f", {done}/{total} tasks"),
                          measured=backend.measured)
    if readme is not None:
        replace_block(readme, summary, BEGIN, END)
    return provenance


# ---------------------------------------------------------------- restore


def saved_run_params(params: dict[str, Any], src: Path, journal: Path) -> dict[str, Any]:
    """`params` reading the checkpoints saved in `src` and the journal unpacked in `journal` (before they are
    put in place)."""
    import copy

    saved = copy.deepcopy(params)
    for key in MODEL_PATHS:
        saved["paths"][key] = str(src / "state" / "models" / Path(section(params, f"paths.{key}")).name)
    saved["paths"]["eval_journal"] = str(journal)
    return saved


def saved_journal(src: Path, folder: Path) -> None:
    """The journal kept in `src` unpacked into `folder`: its archive, or the folder a run was kept in before."""
    archive, legacy = src / "state" / JOURNAL_ARCHIVE, src / "state" / "eval_journal"
    if archive.exists():
        unpack_journal(archive, folder)
    elif legacy.is_dir():
        shutil.copytree(legacy, folder, dirs_exist_ok=True)
    else:
        raise RunError(f"{archive}: not found (expected the run's journal, kept by `python -m tools.paper_cpu save`)")


def journaled_test_tasks(journal, splits, per_family: int) -> list:
    """The first `per_family` journaled test tasks of each family, in the run's order."""
    taken: Counter = Counter()
    out = []
    for split, task in splits:
        if split == "test" and taken[task.family] < per_family and journal.has(split, task):
            taken[task.family] += 1
            out.append(task)
    return out


def replay_check(sharders, journal, splits, per_family: int = 1) -> int:
    """Plan journaled tasks again, with this clone's code and the saved checkpoints (`sharders`, `journal`,
    `splits`: evaluation_of the saved run; the first `per_family` of each family's journaled test tasks), and
    refuse if any sharder's plan differs from the journal's: code that plans otherwise would mix its plans into
    the run. Returns how many tasks were replayed."""
    from dreamshard.project.evaluation import plan_with

    tasks = journaled_test_tasks(journal, splits, per_family)
    for task in tasks:
        journaled = {r["algorithm"]: json.loads(r["shards"]) for r in journal.read("test", task)}
        for p in plan_with(sharders, task):
            if json.loads(json.dumps(p.plan.to_dict()["shards"])) != journaled.get(p.algorithm):
                raise RunError(f"{journal.folder}: task {task.name!r}: this clone's {p.algorithm} plans it otherwise "
                               f"than the journal holds; continue from a checkout of the run's commit "
                               f"(provenance.json: commit), whose code made the journaled plans")
    return len(tasks)


def timing_check(params: dict[str, Any], journal, splits, tasks: int, tolerance: float) -> dict[str, Any]:
    """Measure again, on this machine, the journaled plans of the run's first journaled test task of each of
    the first `tasks` families (each plan the median of the run's `evaluate.rounds`, in turns as evaluate
    measures them), and refuse if the median over plans of this machine's cost over the journal's is beyond
    `tolerance` either way. A machine that reports the run's processor name can still run the kernels at
    another speed (seen: a KVM guest named "AMD EPYC" measured a run's plans at 2.3-5.3x their journaled
    cost), and its timings must not join the run's. Returns the ratio and the tasks measured."""
    import statistics

    from dreamshard.project.backend import backend_of
    from dreamshard.project.domain import Plan
    from dreamshard.project.hardware import measure_rounds, median_cost

    if tasks < 1 or not tolerance > 1:
        raise ValueError(f"timing check: expected tasks >= 1 and tolerance > 1, got {tasks} and {tolerance}")
    backend = backend_of(params)
    rounds = int(section(params, "evaluate.rounds"))
    measured = journaled_test_tasks(journal, splits, 1)[:tasks]
    ratios: list[float] = []
    for task in measured:
        rows = journal.read("test", task)
        plans = [Plan.from_dict({"num_devices": task.num_devices, "shards": json.loads(r["shards"])},
                                f"{journal.folder}: task {task.name!r}") for r in rows]
        for row, cost in zip(rows, measure_rounds(backend, task, plans, rounds, median_cost), strict=True):
            ratios.append(cost.cost_ms / float(row["cost_ms"]))
    if not ratios:
        raise RunError(f"{journal.folder}: no journaled test task to measure again")
    ratio = statistics.median(ratios)
    names = ", ".join(t.name for t in measured)
    if not 1 / tolerance <= ratio <= tolerance:
        raise RunError(f"{journal.folder}: this machine ({backend.device_name()}) measures the run's journaled plans "
                       f"of {names} at {ratio:.2f}x their journaled cost (median of {len(ratios)} plans; allowed "
                       f"1/{tolerance:g}..{tolerance:g}x): its timings would not match the run's; continue on a "
                       f"machine that runs the kernels as the run's did")
    return {"tasks": [t.name for t in measured], "plans": len(ratios), "median_ratio": round(ratio, 3),
            "tolerance": tolerance}


def rebuild_with_dvc(root: Path) -> None:
    """The deterministic stages (download, process, tasks) through DVC, with one Prefect server."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run([sys.executable, "-m", "pipeline.serve", "--", str(bin_dir / "dvc"), "repro", "tasks"],
                   cwd=root, env=env, check=True)


def restore(src: Path, params_file: Path, root: Path,
            rebuild: Callable[[dict[str, Any]], None] | None = None,
            timing_tasks: int = 2, timing_tolerance: float = 1.3) -> dict[str, Any]:
    """Put the saved run in `src` back in place for `python -m pipeline.serve -- dvc repro -s evaluate`:
    params, checkpoints, the training stages' metrics and the journal. The metrics too, since `save` copies
    the workspace's: a fresh clone holds the checked-in `make run` metrics, which a continued run's save
    would otherwise keep as the run's. Before anything is put in place: the data's digests, the replay check
    and the timing check (`timing_tasks`, `timing_tolerance`: timing_check's). `rebuild(params)`: makes the
    deterministic data (default: `dvc repro tasks` in `root`)."""
    from dreamshard.project.evaluation import model_paths_of
    from dreamshard.project.hardware import cpu_model_name

    prov_path = src / "provenance.json"
    if not prov_path.exists():
        raise RunError(f"{prov_path}: not found (expected a run saved by `python -m tools.paper_cpu save`)")
    provenance = json.loads(prov_path.read_text())
    processor = cpu_model_name()
    if provenance["measured"] and f"cpu: {processor} (" not in provenance["processor"]:
        raise RunError(f"{prov_path}: processor: the run measured on {provenance['processor']!r}, this machine is "
                       f"{processor!r}; its journal would not match (and timings of two processors must not mix)")
    shutil.copyfile(src / "params.yaml", params_file)
    params = load_params(params_file)
    (rebuild or (lambda _p: rebuild_with_dvc(root)))(params)
    digests = data_digests(params)
    for key, digest in provenance["data_digests"].items():
        if digests.get(key) != digest:
            raise RunError(f"{section(params, key)} ({key}): rebuilt data differs from the run's (sha1 {digest[:12]}, "
                           f"here {digests.get(key, 'none')[:12]}); the journal's tasks would not match")
    with tempfile.TemporaryDirectory(prefix="eval_journal-") as unpacked:
        saved_journal(src, Path(unpacked))
        _backend, sharders, journal, splits = evaluation_of(saved_run_params(params, src, Path(unpacked)))
        provenance["replayed_tasks"] = replay_check(sharders, journal, splits)
        provenance["timing_check"] = timing_check(params, journal, splits, timing_tasks, timing_tolerance)
        for name, path in model_paths_of(params).items():
            saved = src / "state" / "models" / Path(path).name
            if name in provenance["model_digests"]:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(saved, path)
        metrics_dir = Path(section(params, "paths.metrics"))
        for name in TRAINING_METRICS:
            if (src / "metrics" / name).exists():
                metrics_dir.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src / "metrics" / name, metrics_dir / name)
        journal_dir = Path(section(params, "paths.eval_journal"))
        journal_dir.mkdir(parents=True, exist_ok=True)
        for f in sorted(Path(unpacked).glob("*")):
            if not (journal_dir / f.name).exists():
                shutil.copyfile(f, journal_dir / f.name)
    return provenance


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.paper_cpu", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("save", "restore"))
    ap.add_argument("--root", type=Path, default=Path("."), help="the run's workspace (a clone of this project)")
    ap.add_argument("--out", "--from", dest="folder", type=Path, default=None,
                    help="where the run is kept (default: ROOT/results/paper-cpu)")
    ap.add_argument("--readme", type=Path, default=None, help="save: replace this README's paper-cpu block")
    ap.add_argument("--timing-tasks", type=int, default=2,
                    help="restore: journaled test tasks (one per family) measured again on this machine")
    ap.add_argument("--timing-tolerance", type=float, default=1.3,
                    help="restore: refuse if this machine's cost over the journal's (median over their plans) "
                         "is beyond this factor either way")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    folder = (args.folder or root / "results" / "paper-cpu").resolve()
    readme = args.readme.resolve() if args.readme else None
    from dreamshard.project.backend import huge_pages_from_params

    # the backend's allocator setting, before torch starts: the saved run's for restore (its timing check measures)
    huge_pages_from_params(str(folder / "params.yaml" if args.command == "restore" else root / "params.yaml"))
    os.chdir(root)  # params' paths are relative to the workspace, as in the stages
    try:
        if args.command == "save":
            prov = save(root / "params.yaml", folder, root, readme)
            p = prov["progress"]
            print(f"saved to {folder}: {p['journaled']} of {p['total']} tasks journaled"
                  f"{' (finished)' if prov['finished'] else ''}; stage wall times {prov['stage_wall_s']}")
        else:
            prov = restore(folder, root / "params.yaml", root, timing_tasks=args.timing_tasks,
                           timing_tolerance=args.timing_tolerance)
            p, t = prov["progress"], prov["timing_check"]
            print(f"restored the run of {prov['commit'][:10]} ({p['journaled']} of {p['total']} tasks journaled; "
                  f"its plans of {', '.join(t['tasks'])} measured here at {t['median_ratio']}x their journaled "
                  "cost); continue it with: python -m pipeline.serve -- dvc repro -s evaluate")
    except DreamShardError as exc:
        print(f"paper_cpu {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
