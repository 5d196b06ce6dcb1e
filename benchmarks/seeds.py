"""Does the headline hold on fresh draws of the data? The whole pipeline, rerun for several seeds (issue 52).

    python -m benchmarks.seeds [--seeds 0,1,2] [--work .seeds] [--out results/seeds] [--commit HEAD]

For each seed, a clone of the repository at --commit in --work/seed-N runs the pipeline as a user's `make run`
does (`python -m pipeline.serve -- dvc repro`, with this checkout's environment), on its params.yaml with every
`seed` key set to the seed: fresh tables (`data.synthetic.seed`), pools and tasks (`tasks.seed`), plan
measurements and single devices, and trained models. Everything else is the commit's params.yaml; the models
are the clone's own. Resumable: a rerun finds each clone where it stopped (`dvc repro` skips the finished
stages; collect and evaluate continue from their journals), and a seed already summarised costs the seconds of
an up-to-date `dvc repro`.

Per seed and default family, from each clone's metrics/eval.json: `dreamshard_cut`'s (and `dreamshard`'s) paired
ratio to the TorchRec peer and to the best heuristic, with its interval; across seeds, their mean, least and
greatest. Writes seeds.json (every seed's figures, the command, commit and machine) and README.md (the answer
first) to --out. Run it alone on the machine: every figure is a CPU timing ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.run_info import machine
from dreamshard.project.domain import write_text

REPO = Path(__file__).resolve().parents[1]
SHARDERS = ("dreamshard_cut", "dreamshard")  # reported against the references
REFERENCES = (("vs_torchrec_peer", "torchrec_peer"), ("vs_best_heuristic", "best_heuristic"))


def with_seed(params: Any, seed: int) -> Any:
    """`params` with every key named `seed`, at any depth, set to `seed`."""
    if isinstance(params, dict):
        return {k: seed if k == "seed" else with_seed(v, seed) for k, v in params.items()}
    if isinstance(params, list):
        return [with_seed(v, seed) for v in params]
    return params


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, log: Path | None = None) -> None:
    """Run `cmd` in `cwd`; a failure exits naming the command and where its output is."""
    out = open(log, "a") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    try:
        code = subprocess.call(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT if log else None)
    finally:
        if log:
            out.close()
    if code:
        raise SystemExit(f"benchmarks.seeds: `{' '.join(cmd)}` in {cwd} exited {code}" + (f"; see {log}" if log else ""))


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def prepare(clone: Path, commit: str, seed: int) -> None:
    """A clone of the repository at `commit` in `clone` with every seed of its params.yaml set to `seed`; an
    existing clone must hold `commit` (a clone of another commit is an error, never overwritten)."""
    if not clone.exists():
        clone.parent.mkdir(parents=True, exist_ok=True)
        run(["git", "clone", "-q", "--no-checkout", str(REPO), str(clone)], REPO)
        run(["git", "checkout", "-q", commit], clone)
    elif not (clone / ".git").is_dir():
        raise SystemExit(f"benchmarks.seeds: {clone} exists and is not a clone: remove it or give another --work")
    elif git("rev-parse", "HEAD", cwd=clone) != commit:
        raise SystemExit(f"benchmarks.seeds: {clone} holds commit {git('rev-parse', '--short', 'HEAD', cwd=clone)}, "
                         f"not {commit[:7]}: remove it or give another --work")
    committed = yaml.safe_load(git("show", f"{commit}:params.yaml", cwd=clone))
    wanted = yaml.safe_dump(with_seed(committed, seed), sort_keys=False)
    params = clone / "params.yaml"
    if params.read_text() != wanted:
        write_text(wanted, params)
    if not (clone / ".dvc").is_dir():
        run([str(Path(sys.executable).with_name("dvc")), "init", "-q"], clone)
    run([str(Path(sys.executable).with_name("dvc")), "config", "core.analytics", "false"], clone)


def pipeline(clone: Path) -> float:
    """`dvc repro` in `clone` under one local Prefect server, as `make run` runs it; its minutes."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "PREFECT_HOME": str(clone / ".prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DVC_NO_ANALYTICS": "1"}
    env.pop("PREFECT_API_URL", None)
    start = time.perf_counter()
    run([sys.executable, "-m", "pipeline.serve", "--", str(Path(bin_dir) / "dvc"), "repro"], clone, env,
        clone / "seeds-repro.log")
    return (time.perf_counter() - start) / 60


def seed_figures(metrics: dict[str, Any]) -> dict[str, Any]:
    """Per family, each of SHARDERS against each reference (mean ratio, interval, tasks, groups) and which
    planner the reference was, from one run's metrics/eval.json."""
    out = {}
    for family, algos in metrics["families"].items():
        entry: dict[str, Any] = {"torchrec_peer": algos.get("torchrec_peer"),
                                 "best_heuristic": algos.get("best_heuristic")}
        for sharder in SHARDERS:
            for key, _ in REFERENCES:
                c = algos.get(sharder, {}).get(key)
                if c:
                    entry[f"{sharder}/{key}"] = {k: c[k] for k in ("mean_ratio", "ci_low", "ci_high", "tasks")
                                                  if k in c} | {"groups": c.get("groups", c["tasks"])}
        out[family] = entry
    return out


def across(seeds: dict[str, Any], key: str) -> dict[str, dict[str, float]]:
    """Per family, the mean, least and greatest over seeds of `key`'s mean ratio, and the greatest upper end."""
    families = dict.fromkeys(f for s in seeds.values() for f in s["families"])
    out = {}
    for family in families:
        cells = [s["families"][family][key] for s in seeds.values() if key in s["families"].get(family, {})]
        if cells:
            means = [c["mean_ratio"] for c in cells]
            out[family] = {"seeds": len(cells), "mean": statistics.fmean(means), "min": min(means), "max": max(means),
                           "sd": statistics.stdev(means) if len(means) > 1 else 0.0,
                           "max_ci_high": max(c["ci_high"] for c in cells)}
    return out


def readme(summary: dict[str, Any]) -> str:
    seeds = summary["seeds"]
    peer = across(seeds, "dreamshard_cut/vs_torchrec_peer")
    best = across(seeds, "dreamshard_cut/vs_best_heuristic")
    below = [f for f in peer if peer[f]["max_ci_high"] < 1 and best.get(f, {}).get("max_ci_high", 2) < 1]
    answer = (f"**Answer: over {len(seeds)} seeds (fresh tables, tasks and models each), `dreamshard_cut` / "
              f"TorchRec peer averages " + ", ".join(f"{f} {v['mean']:.3f} [{v['min']:.3f}-{v['max']:.3f}]"
                                                     for f, v in peer.items()) +
              f" (mean of the seeds' means, [least-greatest]); below both the peer and the best heuristic with "
              f"every seed's upper end under 1 on {len(below)} of {len(peer)} families"
              + (f" ({', '.join(below)})" if below else "") + "; the mean over seeds at most 0.90 on "
              f"{sum(v['mean'] <= 0.90 for v in peer.values())} of {len(peer)} (issue 52's bar: all of them, both).**")
    lines = [answer, "", "# The headline on fresh draws of the data: the whole pipeline per seed", "",
             f"- `{summary['command']}`: commit {summary['commit']}, {summary['machine']}; each seed's run in "
             "seeds.json (its minutes, its device and versions as metrics/eval.json records them).",
             "- Each seed: a clone of the commit running `dvc repro` (as `make run`) with every `seed` of params.yaml "
             "set to it; intervals are each run's own (95%, over groups of test tasks that share tables).", "",
             "| family | ratio to | " + " | ".join(f"seed {s}" for s in seeds) + " | mean over seeds | least | greatest |",
             "|---|---|" + "---:|" * (len(seeds) + 3)]
    for sharder in SHARDERS:
        for key, name in REFERENCES:
            spread = across(seeds, f"{sharder}/{key}")
            for family, v in spread.items():
                cells = []
                for s in seeds.values():
                    c = s["families"].get(family, {}).get(f"{sharder}/{key}")
                    cells.append(f"{c['mean_ratio']:.3f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]" if c else "-")
                lines.append(f"| {family} | `{sharder}` / {name} | " + " | ".join(cells) +
                             f" | {v['mean']:.3f} | {v['min']:.3f} | {v['max']:.3f} |")
    lines += ["", "Which planner was each run's reference, per family:", "",
              "| seed | " + " | ".join(peer) + " |", "|---|" + "---|" * len(peer)]
    for s, entry in seeds.items():
        lines.append(f"| {s} | " + " | ".join(
            f"{entry['families'].get(f, {}).get('torchrec_peer', '-')}, "
            f"{entry['families'].get(f, {}).get('best_heuristic', '-')}" for f in peer) + " |")
    lines += ["", "(peer, best heuristic) per cell. Minutes per seed: " +
              ", ".join(f"seed {s}: {e['minutes']:.1f}" for s, e in seeds.items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.seeds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated data seeds, at least 3 for the issue's claim")
    ap.add_argument("--work", type=Path, default=REPO / ".seeds", help="where the clones run (one folder per seed)")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "seeds")
    ap.add_argument("--commit", default="HEAD", help="the commit each clone runs (committed work only)")
    ap.add_argument("--report", action="store_true", help="run nothing: write README.md again from --out's seeds.json")
    args = ap.parse_args(argv)
    if args.report:
        path = args.out / "seeds.json"
        if not path.is_file():
            ap.error(f"--report: {path}: no such file (a run writes it)")
        write_text(readme(json.loads(path.read_text())), args.out / "README.md")
        return 0
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        ap.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    if not seeds or len(set(seeds)) < len(seeds):
        ap.error(f"--seeds: expected distinct seeds, got {args.seeds!r}")
    commit = git("rev-parse", args.commit)
    out = args.out.resolve()
    summary_path = out / "seeds.json"
    previous = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    if previous and previous.get("commit") != commit[:7]:
        previous = {}  # another commit's figures: this run replaces them, never mixes commits
    summary: dict[str, Any] = {"commit": commit[:7], "machine": machine(),
                               "command": "python -m benchmarks.seeds " + " ".join(argv if argv is not None
                                                                                  else sys.argv[1:]),
                               "seeds": previous.get("seeds", {})}
    for seed in seeds:
        clone = args.work.resolve() / f"seed-{seed}"
        prepare(clone, commit, seed)
        print(f"seeds: seed {seed}: dvc repro in {clone}", flush=True)
        minutes = pipeline(clone)
        metrics = json.loads((clone / "metrics" / "eval.json").read_text())
        earlier = summary["seeds"].get(str(seed), {})
        summary["seeds"][str(seed)] = {
            "minutes": earlier.get("minutes", minutes) if minutes < 0.5 else minutes,  # an up-to-date rerun: seconds
            "device": metrics.get("device"), "versions": metrics.get("versions"),
            "families": seed_figures(metrics)}
        out.mkdir(parents=True, exist_ok=True)
        summary["seeds"] = dict(sorted(summary["seeds"].items(), key=lambda kv: int(kv[0])))
        write_text(json.dumps(summary, indent=2) + "\n", summary_path)
        write_text(readme(summary), out / "README.md")
        print(f"seeds: seed {seed} done in {minutes:.1f} min -> {summary_path}", flush=True)
    print(readme(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
