"""`dreamshard report`: one plan's costs, lower bound and memory as an HTML page and a PNG figure.

The task is rebuilt from the tables file and what the plan file records, exactly as `dreamshard measure`
does, and costed the same way; beside it, the plan's lower bound under the cuts the plan makes, in the
backend's regime or, for fbgemm without `--regime`, the bound valid in either. docs/report.md.
"""
from __future__ import annotations

import base64
import html
import io
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dreamshard.errors import DreamShardError
from dreamshard.io import atomic_path, same_file, write_text
from dreamshard.memory import GB
from dreamshard.plan import Plan, device_memory_bytes
from dreamshard.tasks import Task

if TYPE_CHECKING:  # these import torch or matplotlib: not when the CLI starts
    from matplotlib.figure import Figure

    from dreamshard.evaluation.bounds import LowerBound
    from dreamshard.hardware.base import PlanCost

# what the bound of a report assumed of fusion, by the regime lower_bound was given
EITHER_REGIME = "either regime (the smaller of the super- and sub-additive bounds)"

# segment colours of the time bars (colour-blind safe: Okabe-Ito), and the bound's
COLOURS = {"fwd": "#0072B2", "bwd": "#E69F00", "fwd_comm": "#009E73", "bwd_comm": "#56B4E9"}
BOUND_COLOUR = "#D55E00"


# ---------------------------------------------------------------- the numbers


@dataclass(frozen=True)
class ShardRow:
    label: str  # Shard.label(): table[rows, cols]
    kind: str  # table | column | row | row+column
    rows: int
    width: int
    memory_bytes: int


@dataclass(frozen=True)
class DeviceRow:
    index: int
    fwd_ms: float
    bwd_ms: float
    fwd_comm_ms: float
    bwd_comm_ms: float
    memory_bytes: int  # used by the plan's shards (device_memory_bytes)
    capacity_bytes: int
    kind: str  # Device.kind, "" when not said
    speed: float  # Device.speed (1: the reference device)
    host: str
    shards: tuple[ShardRow, ...]

    @property
    def comm_ms(self) -> float:
        return self.fwd_comm_ms + self.bwd_comm_ms

    @property
    def total_ms(self) -> float:
        return self.fwd_ms + self.bwd_ms + self.fwd_comm_ms + self.bwd_comm_ms

    @property
    def name(self) -> str:
        """'device 0', with its kind and speed when the devices file sets them: 'device 0 (h100, speed 2)'."""
        extra = [x for x in (self.kind, f"speed {self.speed:g}" if self.speed != 1.0 else "") if x]
        return f"device {self.index}" + (f" ({', '.join(extra)})" if extra else "")


@dataclass(frozen=True)
class PlanReport:
    task_name: str
    backend: str  # PlanCost.backend
    device_name: str  # PlanCost.device_name: where the compute ran (or the model)
    measured: bool  # PlanCost.measured: True only when real kernels ran
    comm: str  # PlanCost.comm: how communication was obtained
    batch_size: int
    bound_regime: str  # what the lower bound assumed of fusion
    cost_ms: float  # PlanCost.cost_ms: the slowest device
    bound: LowerBound
    devices: tuple[DeviceRow, ...]
    num_tables: int
    weights_precision: str
    optimizer: str
    sources: tuple[tuple[str, str], ...] = ()  # ("plan", "plan.json"), ("tables", ...): shown as given

    @property
    def measured_label(self) -> str:
        return "measured" if self.measured else "modelled, not measured"

    @property
    def slowest(self) -> int:
        return max(range(len(self.devices)), key=lambda d: self.devices[d].total_ms)

    @property
    def cost_over_bound(self) -> float:
        return self.cost_ms / self.bound.total_ms if self.bound.total_ms > 0 else float("inf")


def build_report(task: Task, plan: Plan, cost: PlanCost, bound: LowerBound, batch_size: int, bound_regime: str,
                 sources: Sequence[tuple[str, str]] = ()) -> PlanReport:
    """The report's numbers: `cost` is the backend's PlanCost of `plan`, `bound` lower_bound(...) of `task`."""
    if len(cost.devices) != task.num_devices or plan.num_devices != task.num_devices:
        raise ValueError(f"task {task.name!r} has {task.num_devices} devices, the plan {plan.num_devices}, "
                         f"its cost {len(cost.devices)}")
    tables = {t.name: t for t in task.tables}
    used = device_memory_bytes(task, plan)
    rows = []
    for d, (dc, dev) in enumerate(zip(cost.devices, task.devices)):
        shards = tuple(
            ShardRow(s.label(), s.kind(tables[s.table].rows, tables[s.table].dim), s.num_rows(tables[s.table].rows),
                     s.width, task.shard_bytes(tables[s.table], s.num_rows(tables[s.table].rows), s.width))
            for s in plan.device_shards(d))
        rows.append(DeviceRow(d, dc.fwd_ms, dc.bwd_ms, dc.fwd_comm_ms, dc.bwd_comm_ms, used[d], task.capacity(d),
                              dev.kind, float(dev.speed), dev.host, shards))
    return PlanReport(task.name, cost.backend, cost.device_name, cost.measured, cost.comm, batch_size, bound_regime,
                      cost.cost_ms, bound, tuple(rows), len(task.tables), task.memory.weights_precision,
                      task.memory.optimizer, tuple(sources))


# ---------------------------------------------------------------- the figure


def _tick_label(d: DeviceRow, sep: str = "\n") -> str:
    """'0', its kind and speed when set, one per line (or `sep`: rotated labels keep one line)."""
    parts = [str(d.index)]
    if d.kind:
        parts.append(d.kind)
    if d.speed != 1.0:
        parts.append(f"speed {d.speed:g}")
    return sep.join(parts)


def render_figure(report: PlanReport) -> Figure:
    """Two panels: per-device stacked time bars (forward, backward, both all-to-alls) with the lower bound as a
    line; per-device memory used against each device's capacity (outlined). matplotlib's object API with the
    Agg canvas: no pyplot, no global backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(report.devices)
    xs = list(range(n))
    width = min(16.0, max(10.0, 0.55 * n + 5.0))
    wrap, wrap_axes = int(width * 11), int((width - 2.5) * 12.5)  # characters of an 11 / 10 pt title line
    fig = Figure(figsize=(width, 8.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax_t, ax_m = fig.subplots(2, 1)
    fig.suptitle(textwrap.fill(f"Plan of {report.task_name} on {n} devices: {report.backend} backend, "
                               f"{report.device_name}, batch {report.batch_size}", wrap), fontsize=11)
    right = n - 0.4 + min(2.0, max(0.9, 0.12 * n))  # an empty column right of the bars for the bound's label

    # time: stacked fwd, bwd, fwd_comm, bwd_comm
    bottom = [0.0] * n
    for key, label in (("fwd", "forward"), ("bwd", "backward"), ("fwd_comm", "fwd all-to-all"),
                       ("bwd_comm", "bwd all-to-all")):
        values = [getattr(d, f"{key}_ms") for d in report.devices]
        ax_t.bar(xs, values, 0.7, bottom=bottom, color=COLOURS[key], label=label, edgecolor="white", linewidth=0.4)
        bottom = [b + v for b, v in zip(bottom, values)]
    top = max(max(bottom), report.bound.total_ms)
    ax_t.axhline(report.bound.total_ms, color=BOUND_COLOUR, linestyle="--", linewidth=1.6, zorder=3,
                 label="lower bound")
    ax_t.annotate(f"lower bound\n{report.bound.total_ms:.3g} ms", (right, report.bound.total_ms), xytext=(-3, 3),
                  textcoords="offset points", ha="right", va="bottom", fontsize=8, color=BOUND_COLOUR,
                  bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85},
                  zorder=4)
    slowest = report.slowest
    if n <= 24:  # totals above the bars while they fit
        for x, total in zip(xs, bottom):
            ax_t.annotate(f"{total:.3g}", (x, total), xytext=(0, 2), textcoords="offset points", ha="center",
                          va="bottom", fontsize=8, fontweight="bold" if x == slowest else "normal",
                          bbox={"boxstyle": "square,pad=0.05", "facecolor": "white", "edgecolor": "none",
                                "alpha": 0.85}, zorder=4)
    ax_t.set_ylim(0, top * 1.2)
    ax_t.set_ylabel("ms per step")
    ax_t.set_title(textwrap.fill(f"Time per device ({report.measured_label}): cost {report.cost_ms:.3g} ms on "
                                 f"device {slowest}, {report.cost_over_bound:.2f}x the lower bound", wrap_axes), fontsize=10)
    ax_t.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)

    # memory: used (filled) against capacity (outline)
    used = [d.memory_bytes / GB for d in report.devices]
    capacity = [d.capacity_bytes / GB for d in report.devices]
    ax_m.bar(xs, used, 0.7, color="#7F7F7F", label="used")
    ax_m.bar(xs, capacity, 0.7, fill=False, edgecolor="black", linewidth=1.2, label="capacity")
    if n <= 24:
        for x, u, c in zip(xs, used, capacity):
            ax_m.annotate(f"{100 * u / c:.0f}%", (x, c), xytext=(0, 2), textcoords="offset points", ha="center",
                          va="bottom", fontsize=8)
    ax_m.set_ylim(0, max(capacity) * 1.15)
    ax_m.set_ylabel("GB")
    ax_m.set_title(textwrap.fill(f"Memory per device ({report.weights_precision} weights, {report.optimizer}): "
                                 "used of capacity", wrap_axes), fontsize=10)
    ax_m.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)

    rotate = n > 16
    labels = [_tick_label(d, "  " if rotate else "\n") for d in report.devices]
    for ax in (ax_t, ax_m):
        ax.set_xticks(xs, labels, fontsize=8, rotation=90 if rotate else 0)
        ax.set_xlim(-0.6, right)
        ax.set_xlabel("device" + (" (kind, speed)" if any(d.kind or d.speed != 1.0 for d in report.devices) else ""))
        ax.spines[["top", "right"]].set_visible(False)
    return fig


def figure_png(report: PlanReport, dpi: int = 100) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    render_figure(report).savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


# ---------------------------------------------------------------- the page

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1150px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; } h3 { font-size: 1em; margin: 1em 0 0.3em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f2f2f2; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.slowest td { font-weight: bold; }
dl.summary { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dl.summary dt { font-weight: bold; } dl.summary dd { margin: 0; }
img.figure { max-width: 100%; height: auto; border: 1px solid #ddd; }
.note { color: #555; font-size: 0.9em; }
ul.shards { columns: 3 18em; font-family: ui-monospace, monospace; font-size: 0.85em; }
"""


def _ms(value: float, cls: str) -> str:
    return f'<td class="num {cls}" data-ms="{value!r}">{value:.3f}</td>'


def render_html(report: PlanReport, png: bytes) -> str:
    """A self-contained page (no external resources): summary, the figure (base64 PNG), per-device table, shards."""
    e = html.escape
    b = report.bound
    title = f"DreamShard plan report: {report.task_name}"
    summary = [
        ("backend", f'<span id="backend">{e(report.backend)}</span>'),
        ("device", f'<span id="device-name">{e(report.device_name)}</span>'),
        ("costs", f'<span id="measured" data-measured="{str(report.measured).lower()}">'
                  f"{e(report.measured_label)}</span>; communication: {e(report.comm)}"),
        ("batch size", f'<span id="batch-size">{report.batch_size}</span>'),
        ("plan cost (slowest device)", f'<span id="plan-cost" data-ms="{report.cost_ms!r}">{report.cost_ms:.3f} ms'
                                       f"</span> (device {report.slowest})"),
        ("lower bound", f'<span id="lower-bound" data-ms="{b.total_ms!r}">{b.total_ms:.3f} ms</span> '
                        f'<span class="note">(the larger of compute {b.compute_mean_ms:.3f} ms + 2 x all-to-all '
                        f"{b.transfer_mean_ms:.3f} ms and the per-table term {b.max_table_ms:.3f} ms; fusion: "
                        f"{e(report.bound_regime)})</span>"),
        ("cost / lower bound", f'<span id="cost-over-bound">{report.cost_over_bound:.3f}</span>'),
        ("task", f"{report.num_tables} tables on {len(report.devices)} devices, {e(report.weights_precision)} "
                 f"weights, {e(report.optimizer)}"),
        *[(name, f"<code>{e(value)}</code>") for name, value in report.sources],
    ]
    rows = []
    for d in report.devices:
        cls = "device slowest" if d.index == report.slowest else "device"
        rows.append(
            f'<tr class="{cls}" id="device-{d.index}" data-device="{d.index}">'
            f'<td class="index">{d.index}</td><td class="kind">{e(d.kind)}</td>'
            f'<td class="num speed" data-speed="{d.speed!r}">{d.speed:g}</td>'
            + _ms(d.fwd_ms, "fwd") + _ms(d.bwd_ms, "bwd")
            + f'<td class="num comm" data-ms="{d.comm_ms!r}" data-fwd-ms="{d.fwd_comm_ms!r}" '
              f'data-bwd-ms="{d.bwd_comm_ms!r}" title="forward {d.fwd_comm_ms:.3f} + backward {d.bwd_comm_ms:.3f} '
              f'ms">{d.comm_ms:.3f}</td>'
            + _ms(d.total_ms, "total")
            + f'<td class="num memory" data-bytes="{d.memory_bytes}" data-gb="{d.memory_bytes / GB!r}">'
              f"{d.memory_bytes / GB:.4f}</td>"
            + f'<td class="num capacity" data-bytes="{d.capacity_bytes}" data-gb="{d.capacity_bytes / GB!r}">'
              f"{d.capacity_bytes / GB:.4g}</td>"
            + f'<td class="num used-fraction">{100 * d.memory_bytes / d.capacity_bytes:.1f}%</td>'
            + f'<td class="num shard-count">{len(d.shards)}</td></tr>')
    shard_lists = []
    for d in report.devices:
        items = "".join(f'<li class="shard" data-kind="{e(s.kind)}" data-rows="{s.rows}" data-width="{s.width}">'
                        f'{e(s.label)} <span class="kind">({e(s.kind)})</span></li>' for s in d.shards)
        shard_lists.append(f'<section class="device-shards" id="shards-{d.index}"><h3>{e(d.name)}: '
                           f"{len(d.shards)} shard{'s' if len(d.shards) != 1 else ''}</h3>"
                           f'<ul class="shards">{items or "<li>(none)</li>"}</ul></section>')
    alt = (f"Per-device time ({report.measured_label}) with the lower bound, and memory used against capacity")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{e(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{e(title)}</h1>
<p class="note">Costs from the <strong>{e(report.backend)}</strong> backend: <strong>{e(report.measured_label)}</strong>.
The plan's cost is its slowest device's forward + backward + all-to-all time; the lower bound holds for every plan
of this task that cuts tables no finer than this one (<code>dreamshard/evaluation/bounds.py</code>).</p>
<dl class="summary">
{"".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in summary)}
</dl>
<h2>Figure</h2>
<img class="figure" id="figure" alt="{e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">
<h2>Devices</h2>
<table id="devices">
<thead><tr><th>device</th><th>kind</th><th>speed</th><th>fwd ms</th><th>bwd ms</th><th>comm ms</th><th>total ms</th>
<th>memory used GB</th><th>capacity GB</th><th>used</th><th>shards</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody>
</table>
<p class="note">comm: the forward and backward all-to-all ({e(report.comm)}); GB = 2<sup>30</sup> bytes.</p>
<h2>Shards per device</h2>
{chr(10).join(shard_lists)}
</body>
</html>
"""


def write_report(report: PlanReport, html_path: str | Path, png_path: str | Path) -> None:
    """The PNG and the page that inlines the same PNG, each written atomically (the page may go to standard
    output, `-`; the PNG, binary, may not)."""
    if same_file(html_path, png_path):
        raise DreamShardError(f"{html_path}: the page and the PNG must be different files")
    png = figure_png(report)
    with atomic_path(png_path, "--png") as tmp:
        tmp.write_bytes(png)
    write_text(render_html(report, png), html_path, "-o", stdout=True)
