"""`dreamshard report`: the page's and the figure's numbers are the plan's costs, bound and memory; errors."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from dreamshard.cli import main
from dreamshard.evaluation.bounds import column_splits_in, lower_bound, row_splits_of
from dreamshard.evaluation.plan_report import build_report, render_figure, render_html
from dreamshard.hardware.base import DeviceCost, PlanCost
from dreamshard.memory import GB, MemoryModel
from dreamshard.plan import Plan, device_memory_bytes
from dreamshard.tables import Table
from dreamshard.tasks import Device, Task
from helpers import PNG_MAGIC, analytic, one_line_error

TABLES = pd.DataFrame({
    "name": [f"emb_{i}" for i in range(8)],
    "rows": [20_000, 100, 5_000, 70_000, 1_000, 30_000, 250, 9_999],
    "dim": [32, 4, 16, 32, 64, 8, 12, 48],
    "pooling_factor": [1.0, 0.2, 15.5, 3.0, 40.0, 7.25, 100.0, 2.5],
})
TABLE_OBJS = [Table(r.name, r.rows, r.dim, r.pooling_factor) for r in TABLES.itertuples()]
# a heterogeneous cluster: kinds, speeds and capacities differ
DEVICES = [{"memory_gb": 0.05, "kind": "h100", "speed": 2.0},
           {"memory_gb": 0.03, "kind": "a100", "speed": 1.0},
           {"memory_gb": 0.02, "kind": "<l4&>", "speed": 0.5}]  # a kind the page must escape
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Page(HTMLParser):
    """The report's tagged numbers: elements by id (attributes, text), device rows' cells by class."""

    def __init__(self, text: str):
        super().__init__()
        self.by_id: dict[str, dict[str, str]] = {}
        self.text: dict[str, str] = {}
        self.rows: dict[int, dict[str, dict[str, str]]] = {}
        self.shards: list[dict[str, str]] = []
        self.img_src = ""
        self._open: list[tuple[str, str | None]] = []  # (tag, id) of the elements open
        self._row: int | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.by_id[a["id"]] = a
            self.text[a["id"]] = ""
        if tag not in VOID:
            self._open.append((tag, a.get("id")))
        if tag == "tr" and "data-device" in a:
            self._row = int(a["data-device"])
            self.rows[self._row] = {}
        elif tag == "td" and self._row is not None:
            for cls in a.get("class", "").split():
                self.rows[self._row][cls] = a
        elif tag == "li" and "shard" in a.get("class", "").split():
            self.shards.append(a)
        elif tag == "img" and a.get("id") == "figure":
            self.img_src = a["src"]

    def handle_endtag(self, tag):
        if tag == "tr":
            self._row = None
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data):
        for _, i in self._open:
            if i is not None:
                self.text[i] += data

    def ms(self, element_id: str) -> float:
        return float(self.by_id[element_id]["data-ms"])


@pytest.fixture
def tables_csv(tmp_path) -> Path:
    path = tmp_path / "tables.csv"
    TABLES.to_csv(path, index=False)
    return path


def plan_file(tables: Path, tmp_path: Path, capsys, *devices: str) -> Path:
    out = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(tables), *(devices or ("--devices", "3", "--memory-gb", "0.05")),
                 "--algo", "lookup_greedy", "-o", str(out)]) == 0
    capsys.readouterr()
    return out


def report(tables: Path, plan: Path, out: Path, *extra: str, regime: str | None = "super_additive") -> list[str]:
    return ["report", "--tables", str(tables), "--plan", str(plan), "--backend", "analytic",
            *(("--regime", regime) if regime else ()), "-o", str(out), *extra]


def expected_bound(backend, task: Task, plan: Plan, regime: str) -> float:
    return lower_bound(backend, task, regime, column_splits=column_splits_in(task, [plan]),
                       row_splits=row_splits_of(task, [plan]) or None).total_ms


def check_costs(page: Page, task: Task, plan: Plan, regime: str, batch_size: int) -> None:
    backend = analytic(regime, batch_size)
    cost = backend.plan_cost(task, plan)
    assert page.ms("plan-cost") == pytest.approx(cost.cost_ms, rel=1e-12)
    assert sorted(page.rows) == list(range(task.num_devices))
    for d, dc in enumerate(cost.devices):
        row = page.rows[d]
        assert float(row["total"]["data-ms"]) == pytest.approx(dc.total_ms, rel=1e-12)
        assert float(row["fwd"]["data-ms"]) == pytest.approx(dc.fwd_ms, rel=1e-12)
        assert float(row["bwd"]["data-ms"]) == pytest.approx(dc.bwd_ms, rel=1e-12)
        assert float(row["comm"]["data-ms"]) == pytest.approx(dc.fwd_comm_ms + dc.bwd_comm_ms, rel=1e-12)
        assert float(row["comm"]["data-fwd-ms"]) == pytest.approx(dc.fwd_comm_ms, rel=1e-12)
    assert page.ms("lower-bound") == pytest.approx(expected_bound(backend, task, plan, regime), rel=1e-12)
    assert page.ms("lower-bound") <= page.ms("plan-cost")


@pytest.mark.parametrize("regime", ["super_additive", "sub_additive"])
def test_report_numbers_are_the_plans_costs_and_bound(tables_csv, tmp_path, capsys, regime):
    plan = plan_file(tables_csv, tmp_path, capsys)
    out = tmp_path / "report.html"
    assert main(report(tables_csv, plan, out, "--batch-size", "1024", regime=regime)) == 0
    printed = capsys.readouterr().out
    assert "modelled, not measured" in printed and str(out) in printed
    page = Page(out.read_text())
    task = Task.uniform("tables", TABLE_OBJS, 3, 0.05)  # what `plan --devices 3 --memory-gb 0.05` made
    check_costs(page, task, Plan.load_json(plan), regime, 1024)
    assert page.text["batch-size"] == "1024"
    assert page.text["backend"] == "analytic"
    assert f"{page.ms('plan-cost'):.3f} ms" in page.text["plan-cost"]
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary files


def test_report_heterogeneous_devices_memory_kinds_speeds(tables_csv, tmp_path, capsys):
    devices_file = tmp_path / "devices.json"
    devices_file.write_text(json.dumps(DEVICES))
    plan = plan_file(tables_csv, tmp_path, capsys, "--devices-file", str(devices_file))
    out = tmp_path / "report.html"
    assert main(report(tables_csv, plan, out)) == 0  # the plan records its devices
    text = out.read_text()
    page = Page(text)
    task = Task("tables", tuple(TABLE_OBJS), tuple(Device(int(d["memory_gb"] * GB), d["kind"], d["speed"])
                                                   for d in DEVICES),
                MemoryModel("fp32", "exact_sgd", batch_size=512, reservation=0.15))  # `plan`'s defaults
    plan_obj = Plan.load_json(plan)
    used = device_memory_bytes(task, plan_obj)
    for d, dev in enumerate(task.devices):
        row = page.rows[d]
        assert int(row["memory"]["data-bytes"]) == used[d]
        assert float(row["memory"]["data-gb"]) == pytest.approx(used[d] / GB)
        assert int(row["capacity"]["data-bytes"]) == task.capacity(d)  # usable: the reservation kept free
        assert float(row["speed"]["data-speed"]) == dev.speed
    assert "<l4&>" not in text and "&lt;l4&amp;&gt;" in text  # escaped
    for heading in ("device 0 (h100, speed 2)", "device 1 (a100)", "device 2 (&lt;l4&amp;&gt;, speed 0.5)"):
        assert heading in text
    check_costs(page, task, plan_obj, "super_additive", 512)  # at the batch the plan records; speeds scale compute
    # the devices file given to `report` replaces the recorded devices
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps([{**d, "speed": 0.25} for d in DEVICES]))
    assert main(report(tables_csv, plan, out, "--devices-file", str(slow))) == 0
    assert Page(out.read_text()).ms("plan-cost") > page.ms("plan-cost")


def test_report_lists_every_shard_with_its_kind(tables_csv, tmp_path, capsys):
    # a hand-made plan cutting emb_0 into column halves and emb_3 into row halves
    shards = [{"table": "emb_0", "device": 0, "col_start": 0, "col_end": 16},
              {"table": "emb_0", "device": 1, "col_start": 16, "col_end": 32},
              {"table": "emb_3", "device": 1, "col_start": 0, "col_end": 32, "row_start": 0, "row_end": 35_000},
              {"table": "emb_3", "device": 0, "col_start": 0, "col_end": 32, "row_start": 35_000, "row_end": 70_000}]
    shards += [{"table": t.name, "device": i % 2, "col_start": 0, "col_end": t.dim} for i, t in enumerate(TABLE_OBJS)
               if t.name not in ("emb_0", "emb_3")]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"num_devices": 2, "shards": shards, "memory_gb": 0.05}))
    out = tmp_path / "report.html"
    assert main(report(tables_csv, plan, out)) == 0
    page = Page(out.read_text())
    kinds = {s["data-kind"] for s in page.shards}
    assert kinds == {"table", "column", "row"}
    assert len(page.shards) == len(shards)
    text = out.read_text()
    for label in ("emb_0[0:16]", "emb_0[16:32]", "emb_3[0:35000, 0:32]", "emb_3[35000:70000, 0:32]"):
        assert label in text
    # the bound is the one for the cuts this plan makes
    task = Task.uniform("tables", TABLE_OBJS, 2, 0.05)
    plan_obj = Plan.load_json(plan)
    assert column_splits_in(task, [plan_obj]) and row_splits_of(task, [plan_obj]) == {"emb_3": 35_000}
    check_costs(page, task, plan_obj, "super_additive", 2048)


def test_report_png_is_a_valid_png_and_inlined(tables_csv, tmp_path, capsys):
    from matplotlib.image import imread

    plan = plan_file(tables_csv, tmp_path, capsys)
    out = tmp_path / "report.html"
    assert main(report(tables_csv, plan, out)) == 0
    png = tmp_path / "report.png"  # beside it, same stem
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC)
    pixels = imread(png)
    assert pixels.shape[0] >= 300 and pixels.shape[1] >= 400 and pixels.shape[2] in (3, 4)
    assert pixels[..., :3].std() > 0.05  # something drawn, not a blank canvas
    page = Page(out.read_text())
    assert page.img_src.startswith("data:image/png;base64,")
    assert base64.b64decode(page.img_src.split(",", 1)[1]) == data  # the same figure
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", out.read_text())  # self-contained
    # --png puts it elsewhere
    other = tmp_path / "figs" / "plan figure.png"
    assert main(report(tables_csv, plan, tmp_path / "r2.html", "--png", str(other))) == 0
    assert other.read_bytes().startswith(PNG_MAGIC)
    assert not (tmp_path / "r2.png").exists()


def test_report_labelled_modelled_not_measured(tables_csv, tmp_path, capsys):
    plan = plan_file(tables_csv, tmp_path, capsys)
    out = tmp_path / "report.html"
    assert main(report(tables_csv, plan, out)) == 0
    page = Page(out.read_text())
    assert page.by_id["measured"]["data-measured"] == "false"
    assert page.text["measured"] == "modelled, not measured"
    assert ">measured<" not in out.read_text()


def _tiny_report(measured: bool):
    task = Task.uniform("t", TABLE_OBJS[:2], 2, 0.05)
    plan = Plan.from_assignment(task, [0, 1])
    cost = PlanCost((DeviceCost(1.0, 2.0, 0.25, 0.25), DeviceCost(0.5, 1.0, 0.5, 0.5)), "fbgemm" if measured else
                    "analytic", "cpu: test" if measured else "model", measured, "model")
    bound = lower_bound(analytic(), task, "super_additive")
    return build_report(task, plan, cost, bound, 2048, "super_additive")


@pytest.mark.parametrize("measured", [True, False])
def test_figure_and_page_say_what_the_cost_says(measured):
    """The label comes from PlanCost.measured, whatever the backend's name."""
    rep = _tiny_report(measured)
    label = "measured" if measured else "modelled, not measured"
    fig = render_figure(rep)
    titles = [ax.get_title() for ax in fig.axes] + [fig.get_suptitle()]
    assert any(f"({label})" in t for t in titles)
    time_ax = fig.axes[0]
    assert "lower bound" in [t.get_text() for t in time_ax.get_legend().get_texts()]
    assert any(line.get_ydata()[0] == pytest.approx(rep.bound.total_ms) for line in time_ax.get_lines())
    page = Page(render_html(rep, PNG_MAGIC))
    assert page.by_id["measured"]["data-measured"] == str(measured).lower()
    assert page.text["measured"] == label
    assert page.ms("plan-cost") == 3.5
    assert page.rows[1]["total"]["data-ms"] == "2.5"


def test_report_fbgemm_is_measured(tables_csv, tmp_path, capsys):
    """Real CPU kernels: labelled measured, as PlanCost says; the bound valid in either fusion regime."""
    small = tmp_path / "small.csv"
    TABLES.iloc[[1, 2, 4, 6]].to_csv(small, index=False)
    plan = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(small), "--devices", "2", "--memory-gb", "0.05", "--algo", "size_greedy",
                 "-o", str(plan)]) == 0
    out = tmp_path / "report.html"
    assert main(["report", "--tables", str(small), "--plan", str(plan), "--backend", "fbgemm", "--iterations", "2",
                 "--batch-size", "128", "-o", str(out)]) == 0
    page = Page(out.read_text())
    assert page.by_id["measured"]["data-measured"] == "true"
    assert page.text["measured"] == "measured"
    assert page.text["backend"] == "fbgemm"
    assert "either regime" in out.read_text()
    assert 0 < page.ms("lower-bound")
    assert page.ms("plan-cost") == pytest.approx(max(float(r["total"]["data-ms"]) for r in page.rows.values()))


def test_report_analytic_without_a_regime_takes_the_plans(tables_csv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no metrics/eval.json or params.yaml here: not needed
    plan = plan_file(tables_csv, tmp_path, capsys)
    out = tmp_path / "report.html"
    assert main(report(tables_csv, plan, out, regime=None)) == 0
    assert capsys.readouterr().out.startswith(f"regime super_additive: the one {plan}'s estimate used")
    assert out.exists() and out.with_suffix(".png").exists()


@pytest.mark.parametrize("option", ["-o", "--png"])
@pytest.mark.parametrize("which", ["tables", "plan"])
def test_report_never_writes_over_its_inputs(tables_csv, tmp_path, capsys, option, which):
    """`report ... --png t.csv` or `-o p.json`, also through a hard link: refused before any work, inputs intact."""
    plan = plan_file(tables_csv, tmp_path, capsys)
    victim = tables_csv if which == "tables" else plan
    link = tmp_path / "link.html"
    os.link(victim, link)
    before = victim.read_bytes()
    for name in (victim, link):
        outputs = ["--png", str(name)] if option == "--png" else []
        argv = report(tables_csv, plan, tmp_path / "r.html" if option == "--png" else name, *outputs)
        err = one_line_error(argv, capsys)
        assert f"{option} {name}: is the input --{which}" in err and "give another file name" in err
    assert victim.read_bytes() == before and not (tmp_path / "r.html").exists()


def test_report_page_to_standard_output(tables_csv, tmp_path, capsys):
    """`-o -`: the page on stdout, the summary on stderr; the PNG is binary: a file, never `-`."""
    plan = plan_file(tables_csv, tmp_path, capsys)
    png = tmp_path / "fig.png"
    assert main(report(tables_csv, plan, Path("-"), "--png", str(png))) == 0
    captured = capsys.readouterr()
    assert captured.out.lstrip().startswith("<!DOCTYPE html>") and captured.out.rstrip().endswith("</html>")
    assert "report: " in captured.err and png.read_bytes().startswith(PNG_MAGIC)
    assert "--png FILE" in one_line_error(report(tables_csv, plan, Path("-")), capsys)
    err = one_line_error(report(tables_csv, plan, tmp_path / "r.html", "--png", "-"), capsys)
    assert "--png -" in err and "binary" in err and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("content, words", [
    (None, ["absent.json", "no such file"]),
    ("{ not json", ["plan.json", "not valid JSON"]),
    ('{"num_devices": 2, "shards": [{"table": "emb_0", "device": "zero", "col_start": 0, "col_end": 32}]}',
     ["plan.json", "shards[0].device"]),
])
def test_report_unreadable_plan_names_the_file(tables_csv, tmp_path, capsys, content, words):
    plan = tmp_path / "plan.json"
    if content is None:
        plan = tmp_path / "absent.json"
    else:
        plan.write_text(content)
    out = tmp_path / "report.html"
    line = one_line_error(report(tables_csv, plan, out), capsys)
    for w in words:
        assert w in line
    assert not out.exists()


def test_report_refuses_to_write_the_page_over_its_png(tables_csv, tmp_path, capsys):
    plan = plan_file(tables_csv, tmp_path, capsys)
    line = one_line_error(report(tables_csv, plan, tmp_path / "report.png"), capsys)
    assert "--png" in line


# ---------------------------------------------------------------- rendered by a browser

BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_report_renders_in_headless_chromium(tables_csv, tmp_path, capsys):
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        pytest.skip("no headless Chromium installed (Debian package chromium): HTML not rendered")
    devices_file = tmp_path / "devices.json"
    devices_file.write_text(json.dumps(DEVICES))
    plan = plan_file(tables_csv, tmp_path, capsys, "--devices-file", str(devices_file))
    out = tmp_path / "report.html"
    assert main(report(tables_csv, plan, out)) == 0
    page = Page(out.read_text())
    base = [shutil.which(browser) or browser, *BROWSER_FLAGS]
    dom = subprocess.run([*base, f"--user-data-dir={tmp_path / 'profile-dom'}", "--dump-dom", out.as_uri()],
                         capture_output=True, text=True, timeout=60)
    assert dom.returncode == 0, dom.stderr[-2000:]
    rendered = Page(dom.stdout)
    assert rendered.text["plan-cost"] == page.text["plan-cost"]
    assert f"{page.ms('plan-cost'):.3f} ms" in rendered.text["plan-cost"]
    assert sorted(rendered.rows) == list(range(len(DEVICES)))
    for d in range(len(DEVICES)):
        assert f'id="device-{d}"' in dom.stdout
        assert rendered.rows[d]["total"]["data-ms"] == page.rows[d]["total"]["data-ms"]
    shot = tmp_path / "shot.png"
    run = subprocess.run([*base, f"--user-data-dir={tmp_path / 'profile-shot'}", f"--screenshot={shot}",
                          "--window-size=1200,1600", out.as_uri()], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 0
    assert shot.read_bytes().startswith(PNG_MAGIC)
