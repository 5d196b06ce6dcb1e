"""Do two groups of trained DreamShard models, or two decodings of one model, plan differently well? An A/B
measured in one interleaved pass, or a decoding's A/B read off an evaluation's journal.

    python -m experiments.model_ab --a models/dreamshard.pt,A1.pt,A2.pt --b B0.pt,B1.pt,B2.pt \
        [--sharder dreamshard_cut] [--a-decoding JSON] [--b-decoding JSON] \
        [--root .] [--rivals lookup_greedy,size_lookup_greedy] [--rounds 3] [--out ab.json] \
        [--families dlrm-80-4:80:4:2.0:12,...] [--splits validation,train] [--only dlrm-80-4,...] [--tasks-per-family N]
    python -m experiments.model_ab --rows ab.jsonl [--rivals ...] [--root .] [--out ab.json]
    python -m experiments.model_ab --journal [--root RUN] [--sharder dreamshard] [--b-decoding JSON] [--out F]

Two pipeline runs measured an hour apart differ by machine state as much as by code (the fusion ratio of
one 2-core AMD EPYC read 1.03-1.54 in one run, 0.74-1.17 in the next), so comparing their metrics/eval.json
cannot say what a training change did. This plans the tasks stage's validation tasks and the training tasks
the evaluate stage reports (`reported_train_tasks`; the test pool is evaluate's alone) with every model of both
groups (each group: models of one setting, e.g. policy seeds) and with the `rivals` heuristics, measures all
those plans of a task in `rounds` interleaved rounds on the project's backend (`measure_rounds`: medians), and reports per
family the groups' mean cost over the best rival, each model's, and the paired ratio group A / group B
(per task: the mean over A's models over the mean over B's) with a 95% bootstrap interval over tasks.
Each task's row is written to `--out` as measured (JSON lines beside the summary), labelled with the
backend's device. The checkpoints plan as `--sharder` (dreamshard, or dreamshard_cut: DreamShard's model
searching cuts), the rivals (any sharder, e.g. torchrec_full) as the evaluate stage makes them. Each group's
models decode with the options of its `--a-decoding` / `--b-decoding`
(evaluate.decoding's options of a sharder, e.g. '{"rivals": ["size_greedy", "lookup_greedy"]}'; default
none): the same checkpoints in both groups measure what a decoding does.

`--families` adds validation-only families (name:tables:devices:memory_gb:tasks) drawn from the project's
validation pool as the tasks stage draws a family (`sample_family`: its seed, dims and memory model), e.g.
more tables per device than any family of the profile; `--splits validation` leaves the training tasks out.
`--only` and `--tasks-per-family` measure part of the stage's tasks (a few families, the first N tasks of
each), e.g. the paper profile's, whose whole set takes hours. The summary also gives each group over each
rival (paired per task, with its interval): e.g. DreamShard over TorchRec's planner with `--rivals ...,torchrec`.

`--journal` measures nothing: with `rivals` decoding a policy sharder keeps whichever of its own plan and the
greedy heuristics' plans its cost network rates cheapest, and each of those plans was planned and measured by
the evaluation (the heuristics are sharders of evaluate.sharders), so the variant's measured cost on a task is
the measured cost of the plan it picks, read from the journal: the same measurement the other sharders are
compared on. For every journaled training task (never a test task: design does not read the test pool) of the
run in ROOT (params.yaml, its models, its evaluate journal), this
plans the task with `--sharder` decoding with `--b-decoding` (default: rivals, every greedy heuristic), finds
its plan among the evaluated ones, and reports per family the paired ratio to the best heuristic (95%
bootstrap interval, win rate) of the sharder as evaluated and of the variant, and how often the variant kept
the sharder's own plan. A decoding whose plans the evaluation never measured (e.g. `samples`) needs the
measured A/B.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


def group_rows(rows: list[dict[str, Any]], a: list[str], b: list[str], rivals: list[str],
               seed: int) -> dict[str, dict[str, Any]]:
    """Per family (training tasks under "train:<family>", and every validation task under "validation"): tasks, each
    model's mean cost over the best rival, the groups' means, the paired ratio A / B, and each group over
    each rival, every paired ratio with its 95% bootstrap interval over tasks."""
    from dreamshard.project.evaluation import bootstrap_ci

    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        key = r["family"] if r["split"] == "validation" else f"train:{r['family']}"
        groups.setdefault(key, []).append(r)
        if r["split"] == "validation":
            groups.setdefault("validation", []).append(r)
    out = {}
    for key, rs in groups.items():
        best = np.array([r["best_rival_ms"] for r in rs])
        per_model = {m: np.array([r["cost_ms"][m] for r in rs]) / best for m in a + b}
        mean_a = np.mean([per_model[m] for m in a], axis=0)
        mean_b = np.mean([per_model[m] for m in b], axis=0)
        paired = mean_a / mean_b
        low, high = bootstrap_ci(paired, seed)
        over_rival = {}
        for group, mean in (("a", mean_a), ("b", mean_b)):
            for r in rivals:  # the group's mean cost over this rival's, per task: (mean * best) / rival
                ratio = mean * best / np.array([x["cost_ms"][r] for x in rs])
                over_rival[f"{group}_over_{r}"] = [float(ratio.mean()), *bootstrap_ci(ratio, seed)]
        out[key] = {"tasks": len(rs), "a_over_best_rival": float(mean_a.mean()),
                    "b_over_best_rival": float(mean_b.mean()),
                    "models_over_best_rival": {m: float(v.mean()) for m, v in per_model.items()},
                    "a_over_b": float(paired.mean()), "a_over_b_ci": [low, high],
                    "over_each_rival": over_rival}
    return out


def parse_families(text: str) -> list[Any]:
    """TaskFamily objects (validation only) from "name:tables:devices:memory_gb:tasks,..."; ValueError naming the bad
    one."""
    from dreamshard.project.tasks import TaskFamily

    out = []
    for item in (x for x in text.split(",") if x):
        parts = item.split(":")
        try:
            name, tables, devices, memory_gb, count = parts
            fam = TaskFamily(name, int(tables), int(devices), float(memory_gb), 0, 0, int(count))
        except ValueError:
            raise ValueError(f"--families: {item!r}: expected name:tables:devices:memory_gb:tasks, e.g. "
                             "dlrm-80-4:80:4:2.0:12") from None
        if min(fam.num_tables, fam.num_devices, fam.num_validation) < 1 or not fam.memory_gb > 0:
            raise ValueError(f"--families: {item!r}: tables, devices and tasks must be >= 1 and memory_gb > 0")
        out.append(fam)
    return out


def select_tasks(stage_splits: list[tuple[str, Any]], splits: set[str], only: set[str],
                 per_family: int | None) -> list[tuple[str, Any]]:
    """Of the evaluate stage's (split, task) pairs, those of `splits` and (if `only`) of those families, the first
    `per_family` (None: all) of each family and split, in the stage's order. ValueError naming a family of
    `only` that has no such task."""
    missing = only - {t.family for sp, t in stage_splits if sp in splits}
    if missing:
        raise ValueError(f"--only: no {'/'.join(sorted(splits))} tasks of {', '.join(sorted(missing))} among the "
                         "validation and reported training tasks")
    seen: dict[tuple[str, str], int] = {}
    out = []
    for sp, t in stage_splits:
        if sp not in splits or (only and t.family not in only):
            continue
        n = seen[(sp, t.family)] = seen.get((sp, t.family), 0) + 1
        if per_family is None or n <= per_family:
            out.append((sp, t))
    return out


def extra_tasks(params: dict[str, Any], families: list[Any]) -> list[Any]:
    """The validation tasks of `families`, drawn from the project's validation pool as the tasks stage draws a
    family."""
    from dreamshard.project.tasks import sample_family, sampling_inputs

    stats, pools, dims, memory, seed = sampling_inputs(params)
    return [t for fam in families
            for t in sample_family(stats, pools, fam, "validation", dims, memory, seed)]


def report(summary: dict[str, Any], out: Path | None) -> None:
    """Print the summary's families (each group over the best rival, A / B, each group over each rival) and write
    it to `out` (JSON), if given."""
    for key, v in summary["families"].items():
        low, high = v["a_over_b_ci"]
        print(f"{key}: {v['tasks']} tasks, A {v['a_over_best_rival']:.3f}, B {v['b_over_best_rival']:.3f} of the best "
              f"rival; A / B {v['a_over_b']:.3f} [{low:.3f}, {high:.3f}]; "
              + ", ".join(f"{k} {m:.3f} [{lo:.3f}, {hi:.3f}]" for k, (m, lo, hi) in v["over_each_rival"].items()))
    if out:
        out.write_text(json.dumps(summary, indent=2) + "\n")


def summarise_rows(path: Path, rivals: list[str], seed: int) -> dict[str, Any]:
    """The summary of a rows file written by an earlier pass (its groups' models A0.., B0.. and `rivals` as
    measured); ValueError naming the file and what is missing."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{path}: no rows")
    keys = set(rows[0]["cost_ms"])
    missing = [r for r in rivals if r not in keys]
    a = sorted(k for k in keys if k[:1] == "A" and k[1:].isdigit())
    b = sorted(k for k in keys if k[:1] == "B" and k[1:].isdigit())
    if missing or not a or not b:
        raise ValueError(f"{path}: cost_ms: expected models A0.., B0.. and the rivals {rivals}; "
                         f"has {sorted(keys)}")
    devices = sorted({r["device"] for r in rows})
    return {"device": devices[0] if len(devices) == 1 else devices, "rows": str(path), "rivals": rivals,
            "families": group_rows(rows, a, b, rivals, seed)}


def parse_decoding(text: str, flag: str) -> dict[str, Any]:
    """A group's decoding options from JSON (an object: evaluate.decoding's options of one sharder)."""
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag}: not JSON ({exc})") from None
    if not isinstance(options, dict):
        raise ValueError(f"{flag}: expected a JSON object of decoding options, e.g. "
                         '\'{"rivals": ["size_greedy", "lookup_greedy"]}\', got ' + text)
    return options


def sharder_of(params: dict[str, Any], name: str, decoding: dict[str, Any], checkpoint: Path | None = None) -> Any:
    """Sharder `name` as the evaluate stage makes it from `params` (its settings, its trained model or, for
    DreamShard, `checkpoint`), decoding with `decoding` as evaluate.decoding would give it."""
    from dreamshard.project.evaluation import make_sharders
    from dreamshard.project.params import section

    paths = params["paths"] if checkpoint is None else {**params["paths"], "dreamshard_model": str(checkpoint)}
    one = {**params, "paths": paths,
           "evaluate": {**params["evaluate"], "sharders": [name], "decoding": {name: decoding} if decoding else {}}}
    return make_sharders(one, int(section(params, "backend.batch_size")))[0]


def greedy_rivals() -> list[str]:
    """Every greedy heuristic: the rivals a journal A/B's decoding picks among by default."""
    from dreamshard.project.sharders import GREEDY_KEYS  # imports torch: only a journal A/B, which measures nothing

    return list(GREEDY_KEYS)


def variant_name(sharder: str, decoding: dict[str, Any]) -> str:
    """The journal A/B's label of `sharder` decoding with `decoding`, e.g. dreamshard+rivals."""
    return "+".join([sharder, *sorted(decoding)])


def counterfactual(params: dict[str, Any], sharder: str,
                   decoding: dict[str, Any]) -> tuple[pd.DataFrame, dict[str, int]]:
    """The journaled rows plus one row per task for `sharder` decoding with `decoding` (the evaluated row of the
    plan it picks, renamed), and counts: tasks, kept (the sharder's own plan), picked per heuristic, missing (its
    plan not evaluated). A DreamShardError names the sharders the run did not evaluate."""
    import pandas as pd

    from dreamshard.project.domain import DreamShardError, Plan
    from dreamshard.project.evaluation import evaluation_setup

    setup = evaluation_setup(params, measuring=False, test=False)  # design never reads the test pool
    sharders, journal, splits = setup.sharders, setup.journal, setup.splits
    rivals = list(decoding.get("rivals") or [])
    missing = sorted({sharder, *rivals} - {s.name for s in sharders})
    if missing:
        raise DreamShardError(f"params.yaml: evaluate.sharders: the variant needs {sharder} and the rivals "
                              f"{', '.join(rivals)} evaluated; missing: {', '.join(missing)}")
    variant = sharder_of(params, sharder, decoding)
    name = variant_name(sharder, decoding)
    rows: list[dict[str, Any]] = []
    counts = {"tasks": 0, "kept": 0, "missing": 0, **{r: 0 for r in rivals}}
    for split, task in splits:
        if not journal.has(split, task):
            continue
        mine = journal.read(split, task)
        rows += mine
        keys = [Plan.from_dict({"num_devices": task.num_devices, "shards": json.loads(r["shards"])}).key()
                for r in mine]
        key = variant.shard(task).key()
        counts["tasks"] += 1
        if key not in keys:
            counts["missing"] += 1
            continue
        picked = mine[keys.index(key)]
        own = next(k for k, r in zip(keys, mine) if r["algorithm"] == sharder)
        if own == key:
            counts["kept"] += 1
        else:
            counts[picked["algorithm"]] = counts.get(picked["algorithm"], 0) + 1
        rows.append({**picked, "algorithm": name, "planning_ms": float("nan")})
    return pd.DataFrame(rows), counts


def decoding_summary(frame: pd.DataFrame, sharder: str, variant: str, seed: int) -> dict[str, Any]:
    """Per split and family, the sharder's and the variant's paired ratio to the best heuristic."""
    from dreamshard.project.evaluation import family_summary

    out: dict[str, Any] = {}
    for split in ("train",):
        part = frame[frame["split"] == split]
        if part.empty:
            continue
        fams = family_summary(part, seed=seed)
        out[split] = {f: {a: algos[a].get("vs_best_heuristic") for a in (sharder, variant) if a in algos}
                      for f, algos in fams.items()}
    return out


def decoding_markdown(result: dict[str, Any], sharder: str, variant: str) -> str:
    """The journal A/B's table: per split and family, each one's ratio to the best heuristic and win rate."""
    lines = [f"| split | family | {sharder} vs best heuristic | {variant} vs best heuristic | tasks |",
             "|---|---|---:|---:|---:|"]

    def cell(c: dict | None) -> str:
        return f"{c['mean_ratio']:.3f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}], wins {100 * c['win_rate']:.0f}%" if c else "–"

    for split, fams in result["families"].items():
        for family, v in fams.items():
            tasks = (v.get(sharder) or {}).get("tasks", "–")
            lines.append(f"| {split} | {family} | {cell(v.get(sharder))} | {cell(v.get(variant))} | {tasks} |")
    return "\n".join(lines) + "\n"


def journal_ab(params: dict[str, Any], sharder: str, decoding: dict[str, Any], out: Path | None) -> int:
    """The journal A/B of `sharder` as evaluated against it decoding with `decoding`: printed, and written to
    `out` (JSON) if given."""
    from dreamshard.project.params import section

    frame, counts = counterfactual(params, sharder, decoding)
    variant = variant_name(sharder, decoding)
    rivals = list(decoding.get("rivals") or [])
    result = {"sharder": sharder, "decoding": decoding, "rivals": rivals, "counts": counts,
              "families": decoding_summary(frame, sharder, variant, int(section(params, "evaluate.seed")))}
    picked = ", ".join(f"{r} {counts.get(r, 0)}" for r in rivals)
    print(f"{counts['tasks']} journaled tasks: {variant} kept {sharder}'s plan on {counts['kept']}, "
          f"picked {picked or 'none other'}; {counts['missing']} plans not among the evaluated\n")
    print(decoding_markdown(result, sharder, variant))
    if out:
        out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.model_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", default="", help="comma-separated DreamShard checkpoints of group A")
    ap.add_argument("--b", default="", help="comma-separated DreamShard checkpoints of group B")
    ap.add_argument("--a-decoding", default=None, help="group A's decoding options, a JSON object (default: none)")
    ap.add_argument("--b-decoding", default=None,
                    help="group B's decoding options, a JSON object (default: none; with --journal: "
                         '{"rivals": [every greedy heuristic]})')
    ap.add_argument("--root", type=Path, default=Path("."), help="the project whose params and tasks are used")
    ap.add_argument("--rivals", default=None, help="the heuristics measured beside the groups, comma-separated "
                                                   "(default: lookup_greedy,size_lookup_greedy)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write the rows (JSON lines) and the summary (JSON) here")
    ap.add_argument("--families", default="",
                    help="extra validation-only families, name:tables:devices:memory_gb:tasks,...")
    ap.add_argument("--splits", default="validation,train",
                    help="which splits to measure: validation tasks, the training tasks evaluate reports")
    ap.add_argument("--only", default="", help="of those tasks, only these families (comma-separated; "
                                               "default: all)")
    ap.add_argument("--rows", type=Path, default=None,
                    help="summarise this rows file (JSON lines of an earlier pass) instead of measuring (with "
                         "--rivals, --root for evaluate.seed, --out)")
    ap.add_argument("--tasks-per-family", type=int, default=None,
                    help="of those tasks, the first N of each family and split (default: all)")
    ap.add_argument("--journal", action="store_true",
                    help="measure nothing: --sharder as evaluated (A) against it with --b-decoding (B), each plan's "
                         "cost read off ROOT's evaluate journal (with --root, --sharder, --b-decoding, --out)")
    ap.add_argument("--sharder", default=None, help="the sharder the checkpoints plan as (default: dreamshard; e.g. "
                                                    "dreamshard_cut); --journal: the evaluated sharder whose decoding "
                                                    "is compared")
    args = ap.parse_args(argv)
    rivals = [r for r in (args.rivals or "lookup_greedy,size_lookup_greedy").split(",") if r]
    measuring = [f"--{k.replace('_', '-')}" for k in ("a", "b", "a_decoding", "families", "only", "tasks_per_family")
                 if getattr(args, k)]
    if args.journal:
        given = measuring + [f"--{k}" for k in ("rivals", "rows") if getattr(args, k) is not None]
        if given:
            ap.error(f"--journal reads the run's evaluation; {', '.join(given)} only apply to a measured A/B")
    elif args.sharder is not None and args.sharder not in ("dreamshard", "dreamshard_cut"):
        ap.error(f"--sharder: a measured A/B plans with DreamShard checkpoints, as dreamshard or dreamshard_cut; "
                 f"got {args.sharder!r}")
    try:
        a_decoding = parse_decoding(args.a_decoding or "{}", "--a-decoding")
        b_decoding = (parse_decoding(args.b_decoding, "--b-decoding") if args.b_decoding is not None
                      else {"rivals": greedy_rivals()} if args.journal else {})
    except ValueError as exc:
        ap.error(str(exc))
    if args.rows is not None:
        from dreamshard.project.params import load_params, section

        measuring += ["--b-decoding"] if args.b_decoding is not None else []
        if measuring:
            ap.error(f"--rows summarises measured rows; {', '.join(measuring)} only apply to a measuring pass")
        try:
            seed = int(section(load_params(str(args.root / "params.yaml")), "evaluate.seed"))
            summary = summarise_rows(args.rows, rivals, seed)
        except (ValueError, OSError, KeyError) as exc:
            print(f"model_ab: error: {exc}", file=sys.stderr)
            return 1
        report(summary, args.out.resolve() if args.out else None)
        return 0
    splits_wanted = {x for x in args.splits.split(",") if x}
    if not splits_wanted <= {"validation", "train"}:
        ap.error(f"--splits: expected validation and/or train, got {args.splits!r}")
    try:
        families = parse_families(args.families)
    except ValueError as exc:
        ap.error(str(exc))
    a, b = [Path(p).resolve() for p in args.a.split(",") if p], [Path(p).resolve() for p in args.b.split(",") if p]
    if not args.journal and (not a or not b or not rivals or args.rounds < 1):
        ap.error("--a, --b and --rivals need at least one entry each, --rounds at least 1")
    if args.tasks_per_family is not None and args.tasks_per_family < 1:
        ap.error(f"--tasks-per-family: expected an integer >= 1, got {args.tasks_per_family}")
    only = {x for x in args.only.split(",") if x}
    from dreamshard.project.backend import huge_pages_from_params

    root = args.root.resolve()
    out = args.out.resolve() if args.out else None
    huge_pages_from_params(str(root / "params.yaml"))  # before torch is imported
    os.chdir(root)
    from dreamshard.project.backend import backend_of
    from dreamshard.project.domain import DreamShardError
    from dreamshard.project.evaluation import interleave_families, reported_train_tasks
    from dreamshard.project.hardware import measure_rounds, median_cost
    from dreamshard.project.params import load_params, section
    from dreamshard.project.tasks import read_split

    if args.journal:
        try:
            return journal_ab(load_params("params.yaml"), args.sharder or "dreamshard", b_decoding, out)
        except DreamShardError as exc:
            print(f"model_ab: error: {exc}", file=sys.stderr)
            return 1
    try:
        params = load_params("params.yaml")
        backend = backend_of(params)
        stage_splits = [("validation", t) for t in interleave_families(read_split(params, "validation"))] + \
            [("train", t) for t in reported_train_tasks(params)]
        splits = select_tasks(stage_splits, splits_wanted, only, args.tasks_per_family)
        splits += [("validation", t) for t in extra_tasks(params, families)]
        names = [f"A{i}" for i in range(len(a))] + [f"B{i}" for i in range(len(b))]
        learned = args.sharder or "dreamshard"  # e.g. dreamshard_cut: DreamShard's checkpoints, searching cuts
        sharders = {name: sharder_of(params, learned, a_decoding if name[0] == "A" else b_decoding, path)
                    for name, path in zip(names, a + b)}  # as the evaluate stage makes it, from this checkpoint
        sharders.update({r: sharder_of(params, r, {}) for r in rivals})  # e.g. torchrec_full at the backend's batch
    except (DreamShardError, ValueError, OSError) as exc:
        print(f"model_ab: error: {exc}", file=sys.stderr)
        return 1
    rows = []
    lines = out.with_suffix(".jsonl").open("w") if out else None
    for split, task in splits:
        keys = list(sharders)
        costs = measure_rounds(backend, task, [sharders[k].shard(task) for k in keys], args.rounds, median_cost)
        cost = {k: c.cost_ms for k, c in zip(keys, costs)}
        row = {"split": split, "task": task.name, "family": task.family, "device": backend.device_name(),
               "cost_ms": cost, "best_rival_ms": min(cost[r] for r in rivals)}
        rows.append(row)
        if lines:
            lines.write(json.dumps(row) + "\n")
            lines.flush()
        print(f"{split} {task.name}: " + ", ".join(f"{k} {cost[k] / row['best_rival_ms']:.3f}" for k in names),
              flush=True)
    if lines:
        lines.close()
    summary = {"device": backend.device_name(), "measured": backend.measured, "rounds": args.rounds,
               "a": [str(p) for p in a], "b": [str(p) for p in b], "rivals": rivals,
               **{f"{g}_decoding": d for g, d in (("a", a_decoding), ("b", b_decoding)) if d},
               "families": group_rows(rows, names[:len(a)], names[len(a):], rivals,
                                      int(section(params, "evaluate.seed")))}
    report(summary, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
