"""Figures of the evaluation as PNG: each sharder's cost against the best heuristic, the learners' training
curves, the cost network's predictions on held-out plans.

Each figure function takes plain data and a path and writes the PNG atomically (`render_*` return it unsaved),
with matplotlib's object API: no pyplot, no global state. `write_all` and `python -m
dreamshard.evaluation.figures` render every figure whose inputs exist. Inputs and errors: docs/pipeline.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dreamshard.errors import DataFormatError, DreamShardError
from dreamshard.io import atomic_path

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 120
# colour-blind safe (Okabe-Ito)
BETTER = "#009E73"
WORSE = "#D55E00"
UNCLEAR = "#7F7F7F"
BEST = "#000000"
PREDICTED = "#0072B2"
MEASURED = "#E69F00"

# the files write_all reads (in plots_dir / metrics_dir) and writes (in out_dir)
EVAL_METRICS = "eval.json"
COST_MODEL_METRICS = "cost_model.json"
HOLDOUT_CSV = "cost_model_holdout.csv"
TRAIN_CSV_GLOB = "train_*.csv"
COST_RATIO_PNG = "eval_cost_ratio.png"
TRAINING_CURVES_PNG = "training_curves.png"
COST_MODEL_PNG = "cost_model_holdout.png"

CURVE_COLUMNS = ("iteration", "predicted_ms", "measured_ms")
RATIO_COLUMNS = ["family", "sharder", "family_sharder", "ratio", "ci_low", "ci_high", "verdict", "tasks", "better", "worse",
                 "win_rate"]
LEARNER_ORDER = ("dreamshard", "autoshard")


# ---------------------------------------------------------------- shared


def _wrap(text: str, width: int) -> str:
    """`text` in lines of at most `width` characters, never cut at a hyphen (family names have them)."""
    return textwrap.fill(text, width, break_on_hyphens=False)


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | os.PathLike) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    return Path(path)


def _no_data(ax: Axes, message: str) -> None:
    ax.text(0.5, 0.5, _wrap(message, 40), transform=ax.transAxes, ha="center", va="center", fontsize=11,
            color="#444444", bbox={"boxstyle": "round,pad=0.5", "facecolor": "#F2F2F2", "edgecolor": "#BBBBBB"})
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)


def _no_data_figure(title: str, message: str) -> Figure:
    fig = _figure(7.5, 3.4)
    fig.suptitle(_wrap(title, 80), fontsize=12)
    _no_data(fig.subplots(), message)
    return fig


def _number(value: Any, what: str) -> float:
    """A finite float, NaN for None; a DataFormatError naming `what` for anything else."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise DataFormatError(f"{what}: expected a number, got {value!r}")
    return float(value)


def sharder_order(names: Iterable[str]) -> list[str]:
    """The sharders in the order given, each once: metrics/eval.json keeps the order of `evaluate.sharders`
    (heuristics, learned, TorchRec by default). Not the registry's order: importing the sharders would make
    every stage that draws a figure depend on all of their code."""
    return list(dict.fromkeys(names))


# ---------------------------------------------------------------- cost against the best heuristic


@dataclass(frozen=True)
class RatioPoint:
    """One sharder in one family: its cost over the best heuristic's, with a 95% interval when known."""

    family: str
    sharder: str
    ratio: float
    ci_low: float  # NaN: no interval
    ci_high: float
    is_best: bool  # the best heuristic itself (1 by definition)
    tasks: int | None = None
    better: int | None = None  # tasks where it was cheaper than the best heuristic, when eval.json counts them
    worse: int | None = None
    win_rate: float = math.nan

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.ci_low) and math.isfinite(self.ci_high)

    @property
    def verdict(self) -> str:
        """better / worse when the 95% interval excludes 1, unclear when it does not; point_below / point_above
        (1 included) without an interval; best for the best heuristic."""
        if self.is_best:
            return "best"
        if not self.has_interval:
            return "point_below" if self.ratio < 1 else "point_above"
        return "better" if self.ci_high < 1 else "worse" if self.ci_low > 1 else "unclear"


def _count(value: Any, what: str) -> int | None:
    if value is None or isinstance(value, bool):  # a boolean verdict: the interval says the same
        return None
    number = _number(value, what)
    return int(number) if math.isfinite(number) else None


def family_ratios(family: str, algos: Mapping[str, Any]) -> tuple[list[RatioPoint], str | None]:
    """The ratio points of one family of metrics/eval.json, in sharder order, and why there are none (or None).

    With a sharder's "vs_best_heuristic" entry: its mean_ratio and ci_low / ci_high (and tasks, better, worse,
    win_rate). Without: the point value mean_cost_ms / the best heuristic's mean_cost_ms, no interval. A
    sharder without a finite ratio is left out.
    """
    if not isinstance(algos, Mapping):
        raise DataFormatError(f"families[{family!r}]: expected a dict of sharder -> summary, got {type(algos).__name__}")
    entries = {name: v for name, v in algos.items() if isinstance(v, Mapping)}
    best = algos.get("best_heuristic")
    if not best:
        return [], f"no best heuristic in this family (sharders: {', '.join(sharder_order(entries)) or 'none'})"
    if best not in entries:
        return [], f"the best heuristic {best!r} has no entry in this family"
    best_ms = _number(entries[best].get("mean_cost_ms"), f"families[{family!r}][{best!r}].mean_cost_ms")
    if not (math.isfinite(best_ms) and best_ms > 0):
        return [], f"the best heuristic {best!r} has no positive mean cost ({best_ms})"
    points = []
    for name in sharder_order(entries):
        entry, where = entries[name], f"families[{family!r}][{name!r}]"
        vs = entry.get("vs_best_heuristic")
        if isinstance(vs, Mapping):
            w = f"{where}.vs_best_heuristic"
            ratio = _number(vs.get("mean_ratio"), f"{w}.mean_ratio")
            if not math.isfinite(ratio):  # no ratio of its own: the point value
                ratio = _number(entry.get("mean_cost_ms"), f"{where}.mean_cost_ms") / best_ms
            low, high = _number(vs.get("ci_low"), f"{w}.ci_low"), _number(vs.get("ci_high"), f"{w}.ci_high")
            if math.isfinite(low) and math.isfinite(high) and low > high:
                raise DataFormatError(f"{w}: ci_low {low} is above ci_high {high}")
            point = RatioPoint(family, name, ratio, low, high, name == best, _count(vs.get("tasks"), f"{w}.tasks"),
                               _count(vs.get("better"), f"{w}.better"), _count(vs.get("worse"), f"{w}.worse"),
                               _number(vs.get("win_rate"), f"{w}.win_rate"))
        elif vs is not None:
            raise DataFormatError(f"{where}.vs_best_heuristic: expected a dict, got {vs!r}")
        else:
            mean = _number(entry.get("mean_cost_ms"), f"{where}.mean_cost_ms")
            tasks = _count(entry.get("num_tasks"), f"{where}.num_tasks")
            point = RatioPoint(family, name, mean / best_ms, math.nan, math.nan, name == best, tasks)
        if math.isfinite(point.ratio):
            points.append(point)
    return points, None


def cost_ratio_table(families: Mapping[str, Any]) -> pd.DataFrame:
    """One row per family and sharder: family, sharder, family_sharder ("family / sharder", as in
    plots/eval_cost_over_lb.csv), ratio, ci_low, ci_high (NaN without intervals), verdict, tasks, better, worse,
    win_rate (empty when eval.json has none). The data
    behind `cost_ratio_figure`, for a CSV that `dvc plots` can draw. Families without a best heuristic have
    no rows."""
    rows = [{"family": p.family, "sharder": p.sharder, "family_sharder": f"{p.family} / {p.sharder}", "ratio": p.ratio,
             "ci_low": p.ci_low, "ci_high": p.ci_high, "verdict": p.verdict, "tasks": p.tasks, "better": p.better,
             "worse": p.worse, "win_rate": p.win_rate}
            for family, algos in _families(families).items() for p in family_ratios(family, algos)[0]]
    return pd.DataFrame(rows, columns=RATIO_COLUMNS)


_VERDICT_STYLE = {  # colour, marker, filled, legend label
    "better": (BETTER, "o", True, "cheaper than the best heuristic (95% interval below 1)"),
    "worse": (WORSE, "o", True, "costlier (95% interval above 1)"),
    "unclear": (UNCLEAR, "o", True, "no clear difference (95% interval contains 1)"),
    "point_below": (BETTER, "o", False, "point value below 1 (no interval)"),
    "point_above": (WORSE, "o", False, "point value above 1 (no interval)"),
    "best": (BEST, "D", True, "the best heuristic (1 by definition)"),
}


def _measured_label(measured: bool | None) -> str:
    return "measured" if measured else "unknown whether measured" if measured is None else "modelled, not measured"


def cost_ratio_figure(families: Mapping[str, Any], path: str | os.PathLike, *, backend: str | None = None,
                      device: str | None = None, measured: bool | None = None) -> Path:
    """`render_cost_ratio` written to `path` (PNG, atomically); returns `path`."""
    return _save(render_cost_ratio(families, backend=backend, device=device, measured=measured), path)


def render_cost_ratio(families: Mapping[str, Any], *, backend: str | None = None, device: str | None = None,
                      measured: bool | None = None) -> Figure:
    """Per family (one panel each, panels sharing both axes), each sharder's cost over the best heuristic's
    cost: a point, its 95% interval as an error bar when metrics/eval.json has one ("vs_best_heuristic"), a
    dashed line at 1. Sharders in the registry's order, top to bottom. `families` is eval.json's "families";
    `backend`, `device`, `measured` (eval.json's top-level keys) go into the title."""
    title = (f"Cost relative to the best heuristic per test family: {backend or 'unknown'} backend on "
             f"{device or 'an unknown device'}, costs {_measured_label(measured)}")
    table = {family: family_ratios(family, algos) for family, algos in _families(families).items()}
    if not table:
        return _no_data_figure(title, "no data: eval.json has no families")
    points = [p for pts, _ in table.values() for p in pts]
    if not points:
        reasons = "; ".join(f"{f}: {why}" for f, (_, why) in table.items())
        return _no_data_figure(title, f"no data: no family has a ratio to draw ({reasons})")

    compared = [p for p in points if not p.is_best]
    with_ci = sum(p.has_interval for p in compared)
    if compared and with_ci == len(compared):
        kind = "points: mean ratio over tasks, bars: 95% intervals"
    elif with_ci == 0:
        kind = "no intervals: points are mean cost / best heuristic's mean cost"
    else:
        kind = f"95% intervals for {with_ci} of {len(compared)} points, the others are point values (no intervals)"
    order = sharder_order(p.sharder for p in points)
    y_of = {name: i for i, name in enumerate(order)}

    n = len(table)
    ncols = min(n, 4)
    nrows = math.ceil(n / ncols)
    fig = _figure(2.4 + 3.4 * ncols, 1.9 + nrows * (0.9 + 0.3 * len(order)))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)).ravel()
    fig.suptitle(_wrap(title, 150) + "\n" + kind, fontsize=12)

    lows = [p.ci_low if p.has_interval else p.ratio for p in points] + [1.0]
    highs = [p.ci_high if p.has_interval else p.ratio for p in points] + [1.0]
    span = max(highs) - min(lows) or 0.1
    x_left, x_right = min(lows) - 0.08 * span, max(highs) + 0.30 * span  # room right of the points for labels
    counts = any(p.better is not None and p.tasks for p in points)

    for ax, (family, (pts, why)) in zip(axes, table.items()):
        ax.set_ylim(len(order) - 0.4, -1.6)  # row -1: the better / worse arrows
        ax.set_yticks(range(len(order)), order, fontsize=10)
        ax.tick_params(axis="x", labelsize=9, labelbottom=True)
        ax.grid(axis="x", color="#E5E5E5", linewidth=0.8, zorder=0)
        ax.spines[["top", "right"]].set_visible(False)
        if why is not None:
            ax.set_title(_wrap(family, 40), fontsize=11)
            ax.text(0.5, 0.5, _wrap(f"no data: {why}", 34), transform=ax.transAxes, ha="center", va="center",
                    fontsize=10, color="#444444",
                    bbox={"boxstyle": "round,pad=0.4", "facecolor": "#F2F2F2", "edgecolor": "#BBBBBB"})
            continue
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1.1, zorder=1)
        best = next((p for p in pts if p.is_best), None)
        best_ms = _best_ms(families, family)
        tasks = max((p.tasks or 0 for p in pts), default=0)
        ax.set_title(f"{family}" + (f" ({tasks} tasks)" if tasks else "") +
                     (f"\nbest heuristic: {best.sharder}" if best else "") +
                     (f", {best_ms:.2f} ms" if best_ms else ""), fontsize=10.5)
        ax.text(1.0, -1, "\u2190 better  ", ha="right", va="center", fontsize=9.5, color=BETTER, style="italic")
        ax.text(1.0, -1, "  worse \u2192", ha="left", va="center", fontsize=9.5, color=WORSE, style="italic")
        for p in pts:
            colour, marker, filled, _ = _VERDICT_STYLE[p.verdict]
            y = y_of[p.sharder]
            if p.has_interval and not p.is_best:
                ax.errorbar(p.ratio, y, xerr=[[max(p.ratio - p.ci_low, 0.0)], [max(p.ci_high - p.ratio, 0.0)]],
                            fmt="none", ecolor=colour, elinewidth=1.6, capsize=3.5, zorder=2)
            ax.plot([p.ratio], [y], linestyle="none", marker=marker, markersize=7 if marker == "o" else 6.5,
                    markerfacecolor=colour if filled else "white", markeredgecolor=colour, markeredgewidth=1.5,
                    zorder=3)
            label = f"{p.ratio:.2f}"
            if counts and p.better is not None and p.tasks and not p.is_best:
                label += f" ({p.better}/{p.tasks})"
            right = p.ci_high if p.has_interval and not p.is_best else p.ratio
            ax.annotate(label, (right, y), xytext=(6, 0), textcoords="offset points", ha="left", va="center",
                        fontsize=8.5, color="#333333", zorder=4,
                        bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
    for ax in axes[n:]:
        ax.set_visible(False)
    axes[0].set_xlim(x_left, x_right)
    xlabel = "cost / best heuristic's cost" if with_ci else "mean cost / best heuristic's mean cost"
    for i, ax in enumerate(axes[:n]):
        if i + ncols >= n:  # the lowest panel of its column
            ax.set_xlabel(xlabel, fontsize=10)

    from matplotlib.lines import Line2D

    used = dict.fromkeys(p.verdict for p in points)
    handles = [Line2D([], [], linestyle="none", marker=_VERDICT_STYLE[v][1], markersize=7,
                      markerfacecolor=_VERDICT_STYLE[v][0] if _VERDICT_STYLE[v][2] else "white",
                      markeredgecolor=_VERDICT_STYLE[v][0], markeredgewidth=1.5, label=_VERDICT_STYLE[v][3])
               for v in ("better", "unclear", "worse", "point_below", "point_above", "best") if v in used]
    if counts:
        handles.append(Line2D([], [], linestyle="none", label="(b/n): cheaper on b of n tasks"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 3), fontsize=9.5, frameon=False)
    return fig


def _families(families: Any) -> Mapping[str, Any]:
    """`families` when it is a dict; a DataFormatError otherwise."""
    if not isinstance(families, Mapping):
        raise DataFormatError(f"families: expected a dict of family -> sharders (metrics/eval.json's \"families\"), "
                              f"got {type(families).__name__}")
    return families


def _best_ms(families: Mapping[str, Any], family: str) -> float | None:
    """The best heuristic's mean cost of `family`, when there is one."""
    algos = families.get(family)
    best = algos.get("best_heuristic") if isinstance(algos, Mapping) else None
    entry = algos.get(best) if best and isinstance(algos, Mapping) else None
    value = entry.get("mean_cost_ms") if isinstance(entry, Mapping) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# ---------------------------------------------------------------- training curves


def _learner_order(names: Iterable[str]) -> list[str]:
    seen = list(dict.fromkeys(names))
    return [n for n in LEARNER_ORDER if n in seen] + sorted(n for n in seen if n not in LEARNER_ORDER)


def _curve(name: str, frame: Any) -> pd.DataFrame:
    """The numeric columns of one learner's curve, sorted by iteration; DataFormatError naming what is wrong."""
    if not isinstance(frame, pd.DataFrame):
        raise DataFormatError(f"training curve {name!r}: expected a DataFrame, got {type(frame).__name__}")
    missing = [c for c in CURVE_COLUMNS if c not in frame.columns]
    if missing:
        got = ", ".join(map(str, frame.columns)) or "no columns"
        raise DataFormatError(f"training curve {name!r}: missing column(s) {', '.join(missing)}; expected "
                              f"{', '.join(CURVE_COLUMNS)} (and optionally measurements), got {got}")
    out = pd.DataFrame()
    for column in (*CURVE_COLUMNS, "measurements"):
        if column not in frame.columns:
            continue
        try:
            out[column] = pd.to_numeric(frame[column], errors="raise").astype(float)
        except (ValueError, TypeError) as e:
            raise DataFormatError(f"training curve {name!r}: column {column} is not numeric ({e})") from None
    return out.sort_values("iteration", kind="stable").reset_index(drop=True)


def training_curves_figure(curves: Mapping[str, pd.DataFrame], path: str | os.PathLike) -> Path:
    """`render_training_curves` written to `path` (PNG, atomically); returns `path`."""
    return _save(render_training_curves(curves), path)


def render_training_curves(curves: Mapping[str, pd.DataFrame]) -> Figure:
    """One column per learner (DreamShard, AutoShard, then others): on top, per iteration, the mean predicted
    (cost network) and measured cost of the plans it measured, with the real measurements so far on a top axis;
    below, the cost network's error on them, predicted / measured - 1. `curves` maps a learner to its frame
    (columns iteration, predicted_ms, measured_ms, optionally measurements: plots/train_*.csv)."""
    title = "Training: predicted (cost network) vs measured cost of the plans measured in each iteration"
    if not isinstance(curves, Mapping):
        raise DataFormatError(f"curves: expected a dict of learner -> DataFrame, got {type(curves).__name__}")
    if not curves:
        return _no_data_figure(title, "no data: no training curves given")
    names = _learner_order(curves)
    frames = {name: _curve(name, curves[name]) for name in names}
    width = 1.0 + 5.6 * len(names)
    fig = _figure(width, 6.6)
    grid = fig.subplots(2, len(names), squeeze=False, sharex="col", gridspec_kw={"height_ratios": [3, 1.5]})
    note = ("Each iteration's plans are for other, randomly drawn training tasks: the cost level follows the task; "
            "the gap between the lines is the cost network's error")
    fig.suptitle("\n".join(_wrap(t, int(width * 10.5)) for t in (title, note)), fontsize=11.5)
    for col, name in enumerate(names):
        ax, ax_err = grid[0, col], grid[1, col]
        df = frames[name]
        ok = df[["predicted_ms", "measured_ms"]].notna().all(axis=1)
        if df.empty or not ok.any():
            ax.set_title(name, fontsize=11.5)
            _no_data(ax, f"no data: {'no iterations logged' if df.empty else 'no iteration measured a plan'}")
            ax_err.set_visible(False)
            continue
        x = df["iteration"].to_numpy()
        ax.plot(x, df["predicted_ms"], color=PREDICTED, marker="o", markersize=4.5, linewidth=1.6,
                label="predicted by the cost network")
        ax.plot(x, df["measured_ms"], color=MEASURED, marker="s", markersize=4.5, linewidth=1.6, label="measured")
        ax.set_ylabel("mean plan cost (ms)", fontsize=10)
        ax.set_ylim(bottom=0, top=1.08 * float(np.nanmax(df[["predicted_ms", "measured_ms"]].to_numpy())))
        ax.grid(color="#E5E5E5", linewidth=0.8)
        ax.spines[["right"]].set_visible(False)
        ax.tick_params(labelsize=9)
        last = df["measurements"].iloc[-1] if "measurements" in df and df["measurements"].notna().any() else None
        subtitle = f"{len(df)} iterations" + (f", {int(last)} real plan measurements" if last is not None else "")
        ax.set_title(f"{name}: {subtitle}", fontsize=11.5, pad=4 if last is None else 8)
        m = df["measurements"].to_numpy() if "measurements" in df else None
        if m is not None and len(x) > 1 and np.all(np.isfinite(m)) and np.all(np.diff(m) > 0) and np.all(np.diff(x) > 0):
            secondary = ax.secondary_xaxis("top", functions=(_interp(x, m), _interp(m, x)))
            secondary.set_xlabel("real plan measurements so far", fontsize=9.5)
            secondary.tick_params(labelsize=8.5)
        error = 100.0 * (df["predicted_ms"] / df["measured_ms"] - 1.0)
        ax_err.axhline(0.0, color="black", linewidth=1.0, linestyle="--")
        ax_err.set_axisbelow(True)
        ax_err.bar(x, error, width=0.6, color="#6E6E6E")
        ax_err.set_ylabel("prediction error (%)\npredicted / measured − 1", fontsize=9.5)
        ax_err.set_xlabel("iteration", fontsize=10)
        ax_err.grid(axis="y", color="#E5E5E5", linewidth=0.8)
        ax_err.spines[["top", "right"]].set_visible(False)
        ax_err.tick_params(labelsize=9)
        finite = error[np.isfinite(error)]
        bound = max(5.0, float(np.abs(finite).max()) * 1.25) if len(finite) else 5.0
        ax_err.set_ylim(-bound, bound)
        ax_err.set_title("above 0: over-predicted", loc="left", fontsize=9, color="#555555", style="italic")
        if len(finite):
            ax_err.set_title(f"mean |error| {np.abs(finite).mean():.1f}%", loc="right", fontsize=9, color="#333333")
        if len(x) <= 25:
            ax_err.set_xticks(x, [f"{v:g}" for v in x])
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=PREDICTED, marker="o", markersize=5, label="predicted by the cost network"),
               Line2D([], [], color=MEASURED, marker="s", markersize=5, label="measured")]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=10, frameon=False)
    return fig


def _interp(xp: np.ndarray, fp: np.ndarray) -> Callable[[Any], Any]:
    """Linear map from xp to fp, extrapolated at both ends (for a secondary axis)."""
    xp, fp = np.asarray(xp, float), np.asarray(fp, float)
    slope_lo = (fp[1] - fp[0]) / (xp[1] - xp[0])
    slope_hi = (fp[-1] - fp[-2]) / (xp[-1] - xp[-2])

    def f(v: Any) -> Any:
        v = np.asarray(v, float)
        out = np.interp(v, xp, fp)
        out = np.where(v < xp[0], fp[0] + (v - xp[0]) * slope_lo, out)
        return np.where(v > xp[-1], fp[-1] + (v - xp[-1]) * slope_hi, out)

    return f


# ---------------------------------------------------------------- cost network on held-out plans


def cost_model_scatter(predicted_ms: Sequence[float] | np.ndarray, measured_ms: Sequence[float] | np.ndarray,
                       path: str | os.PathLike, title: str = "Cost network on held-out plans",
                       log: bool | None = None) -> Path:
    """`render_cost_model_scatter` written to `path` (PNG, atomically); returns `path`."""
    return _save(render_cost_model_scatter(predicted_ms, measured_ms, title, log), path)


def render_cost_model_scatter(predicted_ms: Sequence[float] | np.ndarray, measured_ms: Sequence[float] | np.ndarray,
                              title: str = "Cost network on held-out plans", log: bool | None = None) -> Figure:
    """Predicted against measured plan cost, one point per plan, with the y = x line and a +-20% band; Kendall
    tau (tau-a, as metrics/cost_model.json) and MAPE in the legend. Log-log when the costs span over a decade
    (`log` None), else linear. Pairs with a non-finite or non-positive cost are left out, and the title says so."""
    from dreamshard.learning.cost_model import kendall_tau

    try:
        pred = np.asarray(predicted_ms, dtype=np.float64).ravel()
        meas = np.asarray(measured_ms, dtype=np.float64).ravel()
    except (TypeError, ValueError) as e:
        raise DataFormatError(f"cost model scatter: predicted_ms and measured_ms must be numbers ({e})") from None
    if len(pred) != len(meas):
        raise DataFormatError(f"cost model scatter: {len(pred)} predicted costs for {len(meas)} measured ones")
    keep = np.isfinite(pred) & np.isfinite(meas) & (pred > 0) & (meas > 0)
    dropped = int((~keep).sum())
    pred, meas = pred[keep], meas[keep]
    note = f" ({dropped} plan{'s' if dropped != 1 else ''} with a non-finite or non-positive cost left out)" if dropped else ""
    if not len(pred):
        return _no_data_figure(title + note, "no data: no held-out plan with a predicted and a measured cost")
    lo, hi = float(min(pred.min(), meas.min())), float(max(pred.max(), meas.max()))
    use_log = hi / lo > 10 if log is None else log
    tau = kendall_tau(pred, meas)
    mape = float(np.mean(np.abs(pred - meas) / meas))

    fig = _figure(6.6, 7.0)
    ax = fig.subplots()
    fig.suptitle("\n".join(_wrap(line, 72) for line in (title + note).splitlines()), fontsize=11.5)
    if use_log:
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        a, b = lo / 1.25, hi * 1.25
    else:
        pad = 0.08 * (hi - lo) or 0.1 * hi
        a, b = max(0.0, lo - pad), hi + pad
    line = np.geomspace(a, b, 100) if use_log else np.linspace(a, b, 100)
    ax.fill_between(line, line * 0.8, line * 1.2, color="#DDDDDD", alpha=0.6, linewidth=0, label="within \u00b120%",
                    zorder=0)
    ax.plot(line, line, color="black", linestyle="--", linewidth=1.2, label="y = x (exact prediction)", zorder=1)
    ax.scatter(meas, pred, s=36, color=PREDICTED, edgecolor="white", linewidth=0.6, alpha=0.9, zorder=3,
               label=f"held-out plans (n = {len(pred)})")
    from matplotlib.lines import Line2D

    tau_text = "n/a (one plan)" if math.isnan(tau) else f"{tau:.2f}"
    stats = Line2D([], [], linestyle="none", label=f"Kendall \u03c4 = {tau_text}, MAPE = {100 * mape:.1f}%")
    ax.set_xlim(a, b)
    ax.set_ylim(a, b)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("measured plan cost (ms)", fontsize=10.5)
    ax.set_ylabel("predicted plan cost (ms)", fontsize=10.5)
    ax.tick_params(labelsize=9)
    ax.grid(color="#EEEEEE", linewidth=0.8, which="major")
    handles, _ = ax.get_legend_handles_labels()
    fig.legend(handles=[*handles, stats], loc="outside lower center", ncol=2, fontsize=9.5, frameon=False)
    return fig


# ---------------------------------------------------------------- from the pipeline's files


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{path}: not valid JSON ({e})") from None


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise DataFormatError(f"{path}: not a readable CSV ({e})") from None


def write_all(metrics_dir: str | os.PathLike = "metrics", plots_dir: str | os.PathLike = "plots",
              out_dir: str | os.PathLike | None = None, log: Callable[[str], None] = print) -> list[Path]:
    """Render every figure whose inputs exist into `out_dir` (default `plots_dir`), saying which it skipped:
    eval_cost_ratio.png from metrics/eval.json, training_curves.png from plots/train_*.csv,
    cost_model_holdout.png from plots/cost_model_holdout.csv (columns predicted_ms, measured_ms; the title
    takes the plan estimate from metrics/cost_model.json when there). Returns the paths written."""
    metrics, plots = Path(metrics_dir), Path(plots_dir)
    out = Path(out_dir) if out_dir is not None else plots
    written = []

    eval_path = metrics / EVAL_METRICS
    if not eval_path.is_file():
        log(f"figures: skipped {COST_RATIO_PNG}: {eval_path} not found (run the evaluate stage)")
    else:
        m = _read_json(eval_path)
        if not isinstance(m, dict) or "families" not in m:
            raise DataFormatError(f"{eval_path}: no \"families\" entry")
        written.append(cost_ratio_figure(m["families"], out / COST_RATIO_PNG, backend=m.get("backend"),
                                         device=m.get("device"), measured=m.get("measured")))

    curve_files = {p.stem.removeprefix("train_"): p for p in sorted(plots.glob(TRAIN_CSV_GLOB))}
    if not curve_files:
        log(f"figures: skipped {TRAINING_CURVES_PNG}: no {plots / TRAIN_CSV_GLOB} (run train_policy / train_autoshard)")
    else:
        for name in LEARNER_ORDER:
            if name not in curve_files:
                log(f"figures: {TRAINING_CURVES_PNG}: no {plots / f'train_{name}.csv'}, drawn without {name}")
        written.append(training_curves_figure({k: _read_csv(p) for k, p in curve_files.items()},
                                              out / TRAINING_CURVES_PNG))

    holdout = plots / HOLDOUT_CSV
    if not holdout.is_file():
        log(f"figures: skipped {COST_MODEL_PNG}: {holdout} not found (the train_cost stage does not write it yet)")
    else:
        df = _read_csv(holdout)
        missing = [c for c in ("predicted_ms", "measured_ms") if c not in df.columns]
        if missing:
            raise DataFormatError(f"{holdout}: missing column(s) {', '.join(missing)}")
        title = "Cost network on held-out plans: predicted vs measured plan cost"
        cost_metrics = metrics / COST_MODEL_METRICS
        cost_model = _read_json(cost_metrics) if cost_metrics.is_file() else {}
        held = cost_model.get("held_out") if isinstance(cost_model, dict) else None
        held = held if isinstance(held, dict) else {}
        estimate = df["estimate"].iloc[0] if "estimate" in df.columns and len(df) else held.get("plan_estimate_used")
        if estimate:
            title += f"\nplan estimate: {estimate} (train_cost.plan_estimate)"
        written.append(cost_model_scatter(df["predicted_ms"], df["measured_ms"], out / COST_MODEL_PNG, title))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dreamshard.evaluation.figures",
                                     description="Render the evaluation's PNG figures from the files the pipeline wrote; "
                                                 "a missing input is skipped with a note.")
    parser.add_argument("--metrics", type=Path, default=Path("metrics"), help="folder of eval.json, cost_model.json")
    parser.add_argument("--plots", type=Path, default=Path("plots"), help="folder of train_*.csv, cost_model_holdout.csv")
    parser.add_argument("--out", type=Path, default=None, help="where the PNGs go (default: the plots folder)")
    args = parser.parse_args(argv)
    try:
        for path in write_all(args.metrics, args.plots, args.out):
            print(f"figures: wrote {path}")
    except DreamShardError as e:
        print(f"figures: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
