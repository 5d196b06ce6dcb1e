"""How `dreamshard plan` scales: time and peak memory from 1k to 1M tables on 8, 128 and 1024 devices.

    python -m benchmarks.planning_scale [--out results/planning-scale] [--tables 1000,10000,100000,1000000]
                                        [--devices 8,128,1024] [--sharders size_greedy,...] [--timeout 180]
                                        [--full-timeout 600] [--update] [--no-goals]

Each case runs `dreamshard plan` in a child process of its own, on a generated tables file (`name, rows, dim,
pooling_factor`: rows log-uniform in [100, 1M], dim 16 to 128, pooling factor 1 to 40, seeded) and devices sized so
that the tables fill half their memory as TorchRec counts it (batch 512 per device, 15% reserved), with the default
`--sharding table,column,row`. Its time is the whole command's wall time (start-up, reading the file, planning,
checking and writing the plan); its memory the child's peak resident set (VmHWM). After a timeout, the larger
sizes of that sharder, on as many devices or more, are skipped. The sharders are those that need no measurement and
no trained model: the heuristics and TorchRec's planners (`torchrec_full` given `--full-timeout`, 10 minutes). Besides,
the goals of issue 53: 1M tables on 1024 devices with `--sharding table`, and at 1% of memory; 100k tables on 128
devices with cuts. Writes summary.json, README.md (its first line the answer) and planning_scale.png (log-log time
and memory against tables); `--update` replaces the cases run again and keeps the others (and the goals, with
`--no-goals`), each case with the run that made it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.run_info import commit, machine

SHARDERS = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy", "random", "torchrec", "torchrec_model",
            "torchrec_full")
FULL = "torchrec_full"  # TorchRec's planner searching every proposal: timed where it finishes in --full-timeout
TABLES = (1_000, 10_000, 100_000, 1_000_000)
DEVICES = (8, 128, 1024)
FILL = 0.5  # share of the devices' usable memory the tables take
BATCH, RESERVATION = 512, 0.15  # the `plan` defaults
GOAL_SECONDS = 60.0
GOAL_GB = 8.0
GOAL_GROWTH = 15.0  # 10k -> 100k tables


def write_tables(n: int, path: Path, seed: int = 0) -> None:
    """A tables file of `n` tables (module docstring)."""
    rng = np.random.default_rng([seed, n])
    rows = np.exp(rng.uniform(np.log(100), np.log(1e6), n)).astype(np.int64)
    dims = rng.choice([16, 32, 64, 128], n)
    pooling = np.round(rng.uniform(1, 40, n), 2)
    with open(path, "w") as f:
        f.write("name,rows,dim,pooling_factor\n")
        f.writelines(f"t{i},{r},{d},{p}\n" for i, (r, d, p) in enumerate(zip(rows, dims, pooling)))


def memory_gb(path: Path, devices: int, fill: float) -> float:
    """GB per device for the tables of `path` to fill `fill` of the devices' usable memory."""
    from dreamshard.project.domain import MemoryModel, Task, read_tables_file, table_sizes

    task = Task.uniform("probe", read_tables_file(path), devices, 1.0, MemoryModel(batch_size=BATCH,
                                                                                   reservation=RESERVATION))
    need = float(table_sizes(task).astype(np.float64).sum())
    return round(need / devices / (1 - RESERVATION) / fill / 2**30, 3)


# runs `dreamshard plan` and writes its peak resident set (VmHWM, kB) to argv[1] at exit: the child's own, where
# getrusage's ru_maxrss also counts the parent's pages at the fork before exec
CHILD = """import atexit, sys
def peak():
    with open("/proc/self/status") as f:
        kb = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(sys.argv[1], "w") as out:
        out.write(kb)
atexit.register(peak)
from dreamshard.cli import main
sys.exit(main(["plan", *sys.argv[2:]]))
"""


def run_case(argv: list[str], timeout: float) -> dict[str, Any]:
    """`dreamshard plan argv` in a child: wall seconds, the child's peak RSS in MB, and how it ended."""
    start = time.monotonic()
    errors = tempfile.TemporaryFile("w+")
    peak_file = Path(tempfile.mkstemp(suffix=".kb")[1])
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(peak_file), *argv], stdout=subprocess.DEVNULL,
                             stderr=errors, text=True)
    status = "ok"
    while True:
        pid, code, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - start > timeout:
            child.kill()
            pid, code, usage = os.wait4(child.pid, 0)
            status = "timeout"
            break
        time.sleep(0.05)
    seconds = time.monotonic() - start
    child.returncode = os.waitstatus_to_exitcode(code)
    errors.seek(0)
    err = errors.read().strip()
    errors.close()
    if status == "ok" and child.returncode != 0:
        status = "error"
    peak_kb = int(peak_file.read_text() or 0) if peak_file.exists() and peak_file.stat().st_size else usage.ru_maxrss
    peak_file.unlink(missing_ok=True)
    return {"status": status, "seconds": round(seconds, 2), "peak_mb": round(peak_kb / 1024, 1),
            "error": err.splitlines()[-1] if status == "error" and err else ""}


def plan_argv(path: Path, devices: int, gb: float, algo: str, out: Path, sharding: str | None = None) -> list[str]:
    from dreamshard.project.domain import MAX_TIME_LIMIT, SEARCH_SCALE

    argv = ["--tables", str(path), "--devices", str(devices), "--memory-gb", str(gb), "--algo", algo, "-o", str(out)]
    argv += ["--seed", "0"] if algo == "random" else []
    # the searches run to their end, where the tool asks for a time limit past SEARCH_SCALE: the case's own limit
    # stops them (a time-out), and the table shows where they stop finishing
    argv += ["--time-limit", str(MAX_TIME_LIMIT)] if algo in SEARCH_SCALE else []
    return argv + (["--sharding", sharding] if sharding else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/planning-scale"))
    parser.add_argument("--tables", default=",".join(map(str, TABLES)))
    parser.add_argument("--devices", default=",".join(map(str, DEVICES)))
    parser.add_argument("--sharders", default=",".join(SHARDERS))
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per case")
    parser.add_argument("--full-timeout", type=float, default=600.0, help=f"seconds per case of {FULL}")
    parser.add_argument("--no-goals", action="store_true", help="skip the issue's goal cases")
    parser.add_argument("--update", action="store_true",
                        help="keep the cases of the sharders not run (and the goals with --no-goals) of --out")
    args = parser.parse_args()
    run = {"command": " ".join(["python -m benchmarks.planning_scale", *sys.argv[1:]]), "machine": machine(),
           "commit": commit(), "date": time.strftime("%Y-%m-%d"), "timeout_s": args.timeout,
           "full_timeout_s": args.full_timeout}
    sizes = [int(x) for x in args.tables.split(",")]
    device_counts = [int(x) for x in args.devices.split(",")]
    sharders = args.sharders.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    cases: list[dict[str, Any]] = []
    goals: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for n in sizes:
            files[n] = Path(tmp) / f"tables_{n}.csv"
            write_tables(n, files[n])
        plan_file = Path(tmp) / "plan.json"
        baseline = run_case(["--help"], 60)  # start-up alone: importing the tool (--help exits: no peak file)
        for devices in device_counts:
            for n in sizes:
                gb = memory_gb(files[n], devices, FILL)
                for algo in sharders:
                    skipped = any(c["status"] == "timeout" and c["sharder"] == algo and c["devices"] <= devices
                                  and c["tables"] <= n for c in cases)
                    case = {"sharder": algo, "tables": n, "devices": devices, "memory_gb": gb, "fill": FILL,
                            "sharding": "table,column,row", "run": run["command"]}
                    if skipped:
                        case.update(status="skipped", seconds=None, peak_mb=None, error="")
                    else:
                        limit = args.full_timeout if algo == FULL else args.timeout
                        case.update(run_case(plan_argv(files[n], devices, gb, algo, plan_file), limit))
                    cases.append(case)
                    print(json.dumps(case), flush=True)
        if not args.no_goals:
            for name, n, devices, fill, sharding in [("1M tables, 1024 devices, --sharding table", 1_000_000, 1024, FILL,
                                                      "table"),
                                                     ("1M tables, 1024 devices, --sharding table, 1% of memory",
                                                      1_000_000, 1024, 0.01, "table"),
                                                     ("100k tables, 128 devices, cuts allowed", 100_000, 128, FILL,
                                                      None)]:
                if n not in files:
                    continue
                gb = memory_gb(files[n], devices, fill)
                goal = {"goal": name, "sharder": "size_lookup_greedy", "tables": n, "devices": devices,
                        "memory_gb": gb, "fill": fill, "sharding": sharding or "table,column,row",
                        "run": run["command"]}
                goal.update(run_case(plan_argv(files[n], devices, gb, "size_lookup_greedy", plan_file, sharding),
                                     max(args.timeout, 120)))
                goals.append(goal)
                print(json.dumps(goal), flush=True)
    run.update(startup_seconds=baseline["seconds"], total_seconds=round(time.monotonic() - started, 1),
               sharders=sharders)
    runs = [run]
    if args.update and (args.out / "summary.json").exists():
        cases, goals, runs = merged(json.loads((args.out / "summary.json").read_text()), cases, goals, run,
                                    keep_goals=args.no_goals)
    summary = {"fill": FILL, "runs": runs, "growth_10k_to_100k": growth(cases), "cases": cases, "goals": goals}
    from dreamshard.project.domain import write_text

    write_text(json.dumps(summary, indent=2) + "\n", args.out / "summary.json")
    figure(cases, args.out / "planning_scale.png")
    write_text(readme(summary), args.out / "README.md")
    print(f"wrote {args.out}/summary.json, README.md, planning_scale.png")


def merged(old: dict[str, Any], cases: list[dict[str, Any]], goals: list[dict[str, Any]], run: dict[str, Any],
           keep_goals: bool) -> tuple[list, list, list]:
    """The cases of `old` (a summary.json) that `cases` do not run again (sharder, devices, tables), then `cases`;
    old goals when `keep_goals`; the runs whose cases or goals are still there, then `run`."""
    again = {(c["sharder"], c["devices"], c["tables"]) for c in cases}
    kept = [c for c in old["cases"] if (c["sharder"], c["devices"], c["tables"]) not in again] + cases
    goals = old.get("goals", []) if keep_goals else goals
    used = {c.get("run") for c in kept} | {g.get("run") for g in goals}
    runs = [r for r in old.get("runs", []) if r["command"] in used and r["command"] != run["command"]] + [run]
    return kept, goals, runs


def growth(cases: list[dict[str, Any]]) -> dict[str, float]:
    """Time at 100k tables over time at 10k, per sharder and device count, where both finished."""
    done = {(c["sharder"], c["devices"], c["tables"]): c["seconds"] for c in cases if c["status"] == "ok"}
    return {f"{s}/{d}": round(done[(s, d, 100_000)] / done[(s, d, 10_000)], 2)
            for (s, d, n) in done if n == 10_000 and (s, d, 100_000) in done}


def figure(cases: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    colours = dict(zip(SHARDERS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    styles = {8: ("o", ":"), 128: ("s", "--"), 1024: ("^", "-")}
    for (s, d) in sorted({(c["sharder"], c["devices"]) for c in cases}):
        done = sorted((c["tables"], c["seconds"], c["peak_mb"]) for c in cases
                      if c["sharder"] == s and c["devices"] == d and c["status"] == "ok")
        if not done:
            continue
        marker, line = styles.get(d, ("x", "-"))
        for ax, k in zip(axes, (1, 2)):
            ax.plot([x[0] for x in done], [x[k] if k == 1 else x[k] / 1024 for x in done], marker=marker,
                    linestyle=line, color=colours.get(s), label=f"{s}, {d} devices", alpha=0.8)
    n = np.array([1e3, 1e6])
    axes[0].plot(n, 1.0 * n / 1e3, color="grey", linewidth=0.8, label="linear (slope 1)")
    axes[0].axhline(GOAL_SECONDS, color="red", linewidth=0.8, label=f"{GOAL_SECONDS:g} s")
    axes[1].axhline(GOAL_GB, color="red", linewidth=0.8, label=f"{GOAL_GB:g} GB")
    for ax, label in zip(axes, ("seconds, whole `dreamshard plan` command", "peak memory, GB (RSS)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tables")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_title("time against tables (log-log)")
    axes[1].set_title("peak memory against tables (log-log)")
    axes[1].legend(fontsize=6, ncol=2, loc="upper left")
    fig.tight_layout()
    from dreamshard.project.domain import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def short(error: str, width: int = 90) -> str:
    """An error line without the tool's prefix, cut at `width` characters."""
    text = error.removeprefix("dreamshard: error: ")
    return text if len(text) <= width else text[:width - 3] + "..."


def readme(summary: dict[str, Any]) -> str:
    cases, goals = summary["cases"], summary["goals"]
    done = [c for c in cases if c["status"] == "ok"]
    worst = max(done, key=lambda c: c["seconds"]) if done else None
    growth_worst = max(summary["growth_10k_to_100k"].values(), default=float("nan"))
    failed = [c for c in cases if c["status"] not in ("ok",)]
    met = [g for g in goals if g["status"] == "ok" and g["seconds"] <= GOAL_SECONDS
           and (g["tables"] < 1_000_000 or g["peak_mb"] / 1024 <= GOAL_GB)]
    largest = {s: max((c["tables"] for c in done if c["sharder"] == s), default=0)
               for s in dict.fromkeys(c["sharder"] for c in cases)}
    reach = ", ".join(f"{s} {n:,}" for s, n in largest.items() if n < max(largest.values()))
    answer = (f"**Answer: {len(done)} of {len(cases)} cases plan (up to {max(c['tables'] for c in done):,} tables), "
              f"the slowest in {worst['seconds']:.0f} s and the largest peak {max(c['peak_mb'] for c in done) / 1024:.1f}"
              f" GB; time grows at most {growth_worst:.1f}x from 10k to 100k tables; {len(met)} of {len(goals)} goals "
              f"met{'; within the time limits, only up to ' + reach + ' tables' if reach else ''}.**"
              if worst else "**Answer: no case planned.**")
    lines = [answer, "", "# How `dreamshard plan` scales with the tables and devices", ""]
    for run in summary["runs"]:
        full = f", {FULL} {run['full_timeout_s']:g} s" if FULL in run.get("sharders", ()) else ""
        lines.append(f"- `{run['command']}`: commit {run['commit']}, {run['date']}, {run['machine']} "
                     f"(shared with other work: times are upper bounds); sharders {', '.join(run['sharders'])}; "
                     f"{run['total_seconds']:.0f} s in all, start-up alone {run['startup_seconds']:.1f} s; time limit "
                     f"per case {run['timeout_s']:g} s{full}.")
    lines += ["- Each case a child process running `dreamshard plan`, timed whole, peak memory its resident set "
              "(VmHWM); after a time-out the larger sizes of that sharder, on as many devices or more, are skipped.",
              f"- Tasks: generated tables (benchmarks/planning_scale.py), devices sized for the tables to fill "
             f"{summary['fill']:.0%} of usable memory (batch {BATCH}, {RESERVATION:.0%} reserved), default sharding "
             "`table,column,row`.", "", "## Goals", "",
             "| goal | seconds | peak GB | status |", "|---|---:|---:|---|"]
    for g in goals:
        lines.append(f"| {g['goal']} | {g['seconds']:.1f} | {g['peak_mb'] / 1024:.2f} | {g['status']} "
                     f"{g['error']} |")
    lines += ["", f"Growth from 10k to 100k tables (goal <= {GOAL_GROWTH:g}x): "
              + ", ".join(f"{k} {v:.1f}x" for k, v in sorted(summary["growth_10k_to_100k"].items())), "",
              "## Cases (seconds / peak GB)", ""]
    sizes = sorted({c["tables"] for c in cases})
    lines += ["| sharder | devices | " + " | ".join(f"{n:,} tables" for n in sizes) + " |",
              "|---|---:|" + "---:|" * len(sizes)]
    for s, d in sorted({(c["sharder"], c["devices"]) for c in cases}, key=lambda x: (x[1], x[0])):
        cells = []
        for n in sizes:
            c = next((c for c in cases if (c["sharder"], c["devices"], c["tables"]) == (s, d, n)), None)
            if c is None:
                cells.append("")
            elif c["status"] == "ok":
                cells.append(f"{c['seconds']:.1f} / {c['peak_mb'] / 1024:.2f}")
            else:
                cells.append(c["status"])
        lines.append(f"| {s} | {d} | " + " | ".join(cells) + " |")
    if failed:
        errors = [c for c in failed if c["status"] == "error"]
        lines += ["", "Errors (the full message in summary.json): " + "; ".join(
            f"{c['sharder']} {c['tables']:,} x {c['devices']}: {short(c['error'])}" for c in errors)] if errors else []
        lines += ["", "Timed out: " + ", ".join(f"{c['sharder']} {c['tables']:,} x {c['devices']}"
                                                for c in failed if c["status"] == "timeout")]
    lines += ["", "![time and memory against tables](planning_scale.png)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
