"""dreamshard.evaluation.figures: valid, non-blank PNGs from synthetic data and from the committed metrics and
plots; the fallback without intervals; bad or empty input as a clear error or a figure that says "no data";
dreamshard.learning.cost_model.plan_predictions against evaluate_cost_net."""
from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.image import imread
from matplotlib.text import Text

from dreamshard.errors import DataFormatError
from dreamshard.evaluation import figures
from dreamshard.evaluation.collect import plans_to_measure
from dreamshard.evaluation.figures import (
    cost_model_scatter,
    cost_ratio_figure,
    cost_ratio_table,
    render_cost_model_scatter,
    render_cost_ratio,
    render_training_curves,
    training_curves_figure,
    write_all,
)
from dreamshard.learning.cost_model import (
    CostNetConfig,
    cost_data_from_plans,
    evaluate_cost_net,
    fit_cost_net,
    kendall_tau,
    median_device_ms,
    plan_predictions,
)
from dreamshard.learning.features import FeatureScaler, table_features
from dreamshard.tables import Table
from dreamshard.tasks import Task
from helpers import PNG_MAGIC, analytic
from helpers import PROJECT_ROOT as ROOT

EVAL_JSON = ROOT / "metrics" / "eval.json"
TRAIN_CSVS = {name: ROOT / "plots" / f"train_{name}.csv" for name in ("dreamshard", "autoshard")}


def assert_png(path: Path, min_side: int = 300) -> np.ndarray:
    """A PNG matplotlib reads back, of a real size, not one flat colour."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path}: not a PNG"
    assert len(data) > 10_000, f"{path}: only {len(data)} bytes"
    image = imread(path)
    assert image.ndim == 3 and min(image.shape[:2]) >= min_side, image.shape
    assert float(image[..., :3].var()) > 0, f"{path}: a blank image"
    assert not list(path.parent.glob(f".{path.name}.*.tmp")), "a temporary file was left behind"
    return image


def texts(fig: Figure) -> str:
    """Every text of the figure (titles, labels, annotations, legend entries), one per line."""
    return "\n".join(t.get_text() for t in fig.findobj(Text) if t.get_text())


def eval_metrics() -> dict:
    return json.loads(EVAL_JSON.read_text())


def synthetic_families(intervals: bool = True) -> dict:
    """Two families; each sharder's ratio given, with a 95% interval and task counts when `intervals`."""
    fams: dict = {}
    for family, best_ms, ratios in (("f-20-4", 10.0, {"random": 1.3, "size_greedy": 1.1, "lookup_greedy": 1.0,
                                                      "dreamshard": 0.8, "neuroshard": 0.97}),
                                    ("f-40-8", 20.0, {"random": 1.2, "lookup_greedy": 1.0, "dreamshard": 1.02,
                                                      "my_new_sharder": 0.9})):
        algos: dict = {}
        for name, r in ratios.items():
            entry: dict = {"mean_cost_ms": best_ms * r, "num_tasks": 5}
            if intervals:
                half = 0.0 if name == "lookup_greedy" else 0.05
                entry["vs_best_heuristic"] = {"mean_ratio": r, "ci_low": r - half, "ci_high": r + half,
                                              "win_rate": 0.6, "tasks": 5, "better": 3, "worse": 2}
            algos[name] = entry
        algos["best_heuristic"] = "lookup_greedy"
        fams[family] = algos
    return fams


def curve(n: int, offset: float = 0.0) -> pd.DataFrame:
    it = np.arange(n)
    measured = 10 + 3 * np.sin(it) + offset
    return pd.DataFrame({"iteration": it, "cost_loss": 0.5, "policy_loss": -0.1, "predicted_ms": measured * 1.1,
                         "measured_ms": measured, "measurements": 10 * (it + 1)})


# ---------------------------------------------------------------- cost against the best heuristic


def test_cost_ratio_with_intervals(tmp_path):
    fams = synthetic_families()
    out = cost_ratio_figure(fams, tmp_path / "ratio.png", backend="analytic", device="modelled H100", measured=False)
    assert out == tmp_path / "ratio.png"
    assert_png(out)
    fig = render_cost_ratio(fams, backend="analytic", device="modelled H100", measured=False)
    words = texts(fig)
    assert "95% intervals" in words and "no intervals" not in words
    assert "analytic backend on modelled H100" in words and "modelled, not measured" in words
    assert "better" in words and "worse" in words
    bars = [c for ax in fig.axes for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 7  # every sharder but the two best heuristics
    table = cost_ratio_table(fams).set_index("family_sharder")
    assert table.loc["f-20-4 / dreamshard", "verdict"] == "better"
    assert table.loc["f-20-4 / random", "verdict"] == "worse"
    assert table.loc["f-20-4 / neuroshard", "verdict"] == "unclear"  # 0.92 .. 1.02 contains 1
    assert table.loc["f-20-4 / lookup_greedy", "verdict"] == "best"
    assert table.loc["f-40-8 / dreamshard", ["ci_low", "ci_high", "better", "tasks"]].tolist() == \
        pytest.approx([0.97, 1.07, 3, 5])


def test_sharders_in_the_order_the_evaluation_lists_them(tmp_path):
    fams = synthetic_families()
    reordered = {f: dict(reversed(list(algos.items()))) for f, algos in fams.items()}
    fig = render_cost_ratio(reordered)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    given = list(dict.fromkeys(a for algos in reordered.values() for a, v in algos.items() if isinstance(v, dict)))
    assert labels == given  # all families' sharders on one shared axis, first seen first
    first = [a for a, v in reordered[next(iter(reordered))].items() if isinstance(v, dict)]
    assert list(cost_ratio_table(reordered)["sharder"][:len(first)]) == first


def test_cost_ratio_falls_back_to_point_values_without_intervals(tmp_path):
    fams = synthetic_families(intervals=False)
    assert_png(cost_ratio_figure(fams, tmp_path / "ratio.png", backend="fbgemm", device="cpu", measured=True))
    fig = render_cost_ratio(fams, backend="fbgemm", device="cpu", measured=True)
    assert "no intervals" in fig.texts[0].get_text() or "no intervals" in fig.get_suptitle()
    assert not [c for ax in fig.axes for c in ax.containers if isinstance(c, ErrorbarContainer)]
    table = cost_ratio_table(fams).set_index("family_sharder")
    assert table.loc["f-20-4 / dreamshard", "ratio"] == pytest.approx(0.8)
    assert math.isnan(table.loc["f-20-4 / dreamshard", "ci_low"])
    assert table.loc["f-20-4 / dreamshard", "verdict"] == "point_below"


def test_cost_ratio_from_the_committed_eval_json(tmp_path):
    m = eval_metrics()
    out = cost_ratio_figure(m["families"], tmp_path / "eval.png", backend=m["backend"], device=m["device"],
                            measured=m["measured"])
    assert_png(out)
    fig = render_cost_ratio(m["families"], backend=m["backend"], device=m["device"], measured=m["measured"])
    title = fig.get_suptitle()
    assert m["backend"] in title and m["device"] in title and "measured" in title
    has_intervals = any("vs_best_heuristic" in v for algos in m["families"].values() for v in algos.values()
                        if isinstance(v, dict))
    assert ("no intervals" in title) != has_intervals
    # the point values are README's "vs best heuristic" column: mean cost / best heuristic's mean cost
    table = cost_ratio_table(m["families"]).set_index(["family", "sharder"])
    for family, algos in m["families"].items():
        best = algos[algos["best_heuristic"]]["mean_cost_ms"]
        if not has_intervals:
            assert table.loc[(family, "dreamshard"), "ratio"] == pytest.approx(algos["dreamshard"]["mean_cost_ms"] / best)
        assert table.loc[(family, algos["best_heuristic"]), "verdict"] == "best"


def test_cost_ratio_with_added_intervals_on_the_committed_eval_json(tmp_path):
    """What the evaluate stage will write: eval.json with "vs_best_heuristic" in every sharder's entry."""
    fams = copy.deepcopy(eval_metrics()["families"])
    for algos in fams.values():
        for v in algos.values():
            if isinstance(v, dict):
                r = v["mean_cost_ms"] / algos[algos["best_heuristic"]]["mean_cost_ms"]
                v["vs_best_heuristic"] = {"mean_ratio": r, "ci_low": r * 0.95, "ci_high": r * 1.05, "win_rate": 0.4,
                                          "tasks": v["num_tasks"], "better": 2, "worse": 3}
    assert_png(cost_ratio_figure(fams, tmp_path / "eval.png", backend="fbgemm", device="cpu", measured=True))
    assert "no intervals" not in render_cost_ratio(fams).get_suptitle()


def test_a_family_without_best_heuristic_is_a_panel_that_says_so(tmp_path):
    fams = synthetic_families(intervals=False)
    del fams["f-40-8"]["best_heuristic"]
    assert_png(cost_ratio_figure(fams, tmp_path / "ratio.png"))
    words = texts(render_cost_ratio(fams))
    assert "no data: no best heuristic" in words.replace("\n", " ")
    assert "f-20-4" in words  # the other family is drawn
    assert list(cost_ratio_table(fams)["family"].unique()) == ["f-20-4"]


@pytest.mark.parametrize("families", [{}, {"f": {"dreamshard": {"mean_cost_ms": 3.0}}},
                                      {"f": {"lookup_greedy": {"mean_cost_ms": 0.0}, "best_heuristic": "lookup_greedy"}},
                                      {"f": {"dreamshard": {"mean_cost_ms": 3.0}, "best_heuristic": "lookup_greedy"}}])
def test_nothing_to_draw_is_a_figure_that_says_no_data(tmp_path, families):
    assert_png(cost_ratio_figure(families, tmp_path / "ratio.png"), min_side=200)
    assert "no data" in texts(render_cost_ratio(families))


@pytest.mark.parametrize("families, words", [
    ([1, 2], "families: expected a dict"),
    ({"f": "lookup_greedy"}, "families['f']: expected a dict"),
    ({"f": {"lookup_greedy": {"mean_cost_ms": "fast"}, "best_heuristic": "lookup_greedy"}},
     "families['f']['lookup_greedy'].mean_cost_ms: expected a number, got 'fast'"),
    ({"f": {"lookup_greedy": {"mean_cost_ms": 1.0}, "dreamshard": {"mean_cost_ms": 1.0, "vs_best_heuristic": {
        "mean_ratio": 0.9, "ci_low": 1.1, "ci_high": 0.8}}, "best_heuristic": "lookup_greedy"}},
     "ci_low 1.1 is above ci_high 0.8"),
    ({"f": {"lookup_greedy": {"mean_cost_ms": 1.0}, "dreamshard": {"mean_cost_ms": 1.0, "vs_best_heuristic": 0.9},
            "best_heuristic": "lookup_greedy"}}, "vs_best_heuristic: expected a dict"),
])
def test_bad_eval_families_are_a_data_format_error_naming_the_entry(tmp_path, families, words):
    with pytest.raises(DataFormatError, match=words.replace("[", r"\[").replace("(", r"\(").replace(".", r"\.")):
        cost_ratio_figure(families, tmp_path / "ratio.png")
    assert not list(tmp_path.iterdir())  # nothing written, not even a temporary file


# ---------------------------------------------------------------- training curves


def test_training_curves_synthetic(tmp_path):
    curves = {"autoshard": curve(12, 5.0), "dreamshard": curve(6)}
    assert_png(training_curves_figure(curves, tmp_path / "curves.png"))
    fig = render_training_curves(curves)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[0].startswith("dreamshard: 6 iterations, 60 real plan measurements")  # DreamShard first
    assert any(t.startswith("autoshard: 12 iterations") for t in titles)
    words = texts(fig)
    assert "mean plan cost (ms)" in words and "iteration" in words and "real plan measurements so far" in words
    assert "predicted by the cost network" in words and "measured" in words


def test_training_curves_from_the_committed_csvs(tmp_path):
    curves = {name: pd.read_csv(p) for name, p in TRAIN_CSVS.items()}
    assert_png(training_curves_figure(curves, tmp_path / "curves.png"))
    fig = render_training_curves(curves)
    for name, df in curves.items():
        assert f"{name}: {len(df)} iterations, {int(df['measurements'].iloc[-1])} real plan measurements" in texts(fig)


def test_training_curves_without_measurements_column_or_with_unmeasured_iterations(tmp_path):
    df = curve(5).drop(columns=["measurements"])
    df.loc[2, ["predicted_ms", "measured_ms"]] = np.nan  # an iteration that measured no plan
    assert_png(training_curves_figure({"dreamshard": df}, tmp_path / "curves.png"))


def test_empty_curves_say_no_data(tmp_path):
    assert_png(training_curves_figure({}, tmp_path / "none.png"), min_side=200)
    assert "no data" in texts(render_training_curves({}))
    empty = curve(0)
    assert_png(training_curves_figure({"dreamshard": empty, "autoshard": curve(4)}, tmp_path / "one.png"))
    assert "no data: no iterations logged" in texts(render_training_curves({"dreamshard": empty, "autoshard": curve(4)}))
    unmeasured = curve(3).assign(measured_ms=np.nan)
    assert "no iteration measured a plan" in texts(render_training_curves({"autoshard": unmeasured}))


def test_bad_curves_are_a_data_format_error_naming_the_column(tmp_path):
    with pytest.raises(DataFormatError, match="training curve 'autoshard': missing column\\(s\\) measured_ms"):
        training_curves_figure({"autoshard": curve(3).drop(columns=["measured_ms"])}, tmp_path / "c.png")
    with pytest.raises(DataFormatError, match="column predicted_ms is not numeric"):
        training_curves_figure({"autoshard": curve(3).assign(predicted_ms="x")}, tmp_path / "c.png")
    with pytest.raises(DataFormatError, match="expected a DataFrame"):
        training_curves_figure({"autoshard": [1, 2, 3]}, tmp_path / "c.png")


# ---------------------------------------------------------------- cost network on held-out plans


def test_scatter_linear_and_log(tmp_path):
    rng = np.random.default_rng(0)
    measured = rng.uniform(6, 20, 10)
    predicted = measured * rng.normal(1, 0.2, 10)
    assert_png(cost_model_scatter(predicted, measured, tmp_path / "lin.png", "held out"))
    fig = render_cost_model_scatter(predicted, measured, "held out")
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear"
    mape = np.mean(np.abs(predicted - measured) / measured)
    words = texts(fig)
    assert f"Kendall \u03c4 = {kendall_tau(predicted, measured):.2f}, MAPE = {100 * mape:.1f}%" in words
    assert "measured plan cost (ms)" in words and "predicted plan cost (ms)" in words and "y = x" in words

    wide = 10 ** rng.uniform(-1, 2, 40)
    assert_png(cost_model_scatter(wide * 1.1, wide, tmp_path / "log.png"))
    assert render_cost_model_scatter(wide * 1.1, wide).axes[0].get_xscale() == "log"
    assert render_cost_model_scatter(wide * 1.1, wide, log=False).axes[0].get_xscale() == "linear"


def test_scatter_bad_and_empty_input(tmp_path):
    with pytest.raises(DataFormatError, match="3 predicted costs for 2 measured ones"):
        cost_model_scatter([1.0, 2.0, 3.0], [1.0, 2.0], tmp_path / "s.png")
    with pytest.raises(DataFormatError, match="must be numbers"):
        cost_model_scatter(["a", "b"], [1.0, 2.0], tmp_path / "s.png")  # type: ignore[list-item]
    assert_png(cost_model_scatter([], [], tmp_path / "empty.png"), min_side=200)
    assert "no data" in texts(render_cost_model_scatter([], []))
    fig = render_cost_model_scatter([1.0, np.nan, 3.0, 2.0], [1.2, 2.0, 0.0, 2.2])
    assert "2 plans with a non-finite or non-positive cost left out" in fig.get_suptitle().replace("\n", " ")
    assert "n = 2" in texts(fig)


# the library function the train_cost stage would call for the scatter's data


@pytest.fixture(scope="module")
def cost_world():
    rng = np.random.default_rng(3)
    tables = [Table(f"t{i:02d}", int(10 ** rng.uniform(2, 5)), int(rng.choice([8, 16, 32, 64])),
                    float(rng.uniform(1, 30)), tuple(float(b) for b in rng.dirichlet(np.ones(17)))) for i in range(40)]
    tasks = [Task.uniform(f"w/{k}", [tables[int(i)] for i in rng.choice(40, 10, replace=False)], 2, 1.0)
             for k in range(6)]
    backend = analytic()
    items = plans_to_measure(tasks, 24, 0.5, 0, "fp")
    data = cost_data_from_plans([(it.task, it.plan, backend.plan_cost(it.task, it.plan)) for it in items])
    scaler = FeatureScaler.fit(np.concatenate([table_features(t.tables, t.memory) for t in tasks]))
    return data, scaler


@pytest.mark.parametrize("estimate", ["device_max", "head"])
def test_plan_predictions_are_the_points_behind_evaluate_cost_net(cost_world, estimate):
    data, scaler = cost_world
    held, fit_on = data.subset(np.arange(6)), data.subset(np.arange(6, data.num_plans))
    net = CostNetConfig(scale_ms=median_device_ms(fit_on), plan_estimate=estimate).build(torch.Generator().manual_seed(0))
    fit_cost_net(net, scaler, fit_on, steps=30, lr=5e-3, batch_plans=8, seed=0)
    metrics = evaluate_cost_net(net, scaler, held)
    predicted, measured = plan_predictions(net, scaler, held)  # the net's own estimate
    assert predicted.shape == measured.shape == (6,) and np.all(predicted > 0)
    np.testing.assert_array_equal(measured, held.plan_cost_ms)
    prefix = "plan_device_max" if estimate == "device_max" else "plan"
    assert np.mean(np.abs(predicted - measured) / measured) == pytest.approx(metrics[f"{prefix}_mape"], rel=1e-6)
    assert kendall_tau(predicted, measured) == pytest.approx(metrics[f"{prefix}_kendall_tau"])
    other = "head" if estimate == "device_max" else "device_max"
    other_prefix = "plan" if estimate == "device_max" else "plan_device_max"
    p2, _ = plan_predictions(net, scaler, held, other)
    assert np.mean(np.abs(p2 - measured) / measured) == pytest.approx(metrics[f"{other_prefix}_mape"], rel=1e-6)
    with pytest.raises(ValueError, match="estimate: expected one of"):
        plan_predictions(net, scaler, held, "mean")


# ---------------------------------------------------------------- from the pipeline's files


def test_write_all_from_the_committed_files(tmp_path, capsys):
    written = write_all(ROOT / "metrics", ROOT / "plots", tmp_path)
    names = {p.name for p in written}
    assert {figures.COST_RATIO_PNG, figures.TRAINING_CURVES_PNG} <= names
    for p in written:
        assert_png(p)
    if not (ROOT / "plots" / figures.HOLDOUT_CSV).is_file():
        assert f"skipped {figures.COST_MODEL_PNG}" in capsys.readouterr().out


def test_write_all_with_a_holdout_csv_and_missing_inputs(tmp_path, capsys):
    metrics, plots, out = tmp_path / "metrics", tmp_path / "plots", tmp_path / "figs"
    metrics.mkdir()
    plots.mkdir()
    shutil.copy(TRAIN_CSVS["dreamshard"], plots)  # no eval.json, no train_autoshard.csv
    pd.DataFrame({"plan_id": ["a", "b", "c"], "predicted_ms": [5.0, 9.0, 7.5], "measured_ms": [6.0, 8.0, 7.0],
                  "estimate": "device_max"}).to_csv(plots / figures.HOLDOUT_CSV, index=False)
    written = write_all(metrics, plots, out)
    assert [p.name for p in written] == [figures.TRAINING_CURVES_PNG, figures.COST_MODEL_PNG]
    for p in written:
        assert_png(p)
    said = capsys.readouterr().out
    assert f"skipped {figures.COST_RATIO_PNG}" in said and "drawn without autoshard" in said

    assert write_all(tmp_path / "nothing", tmp_path / "nothing") == []
    said = capsys.readouterr().out
    assert said.count("skipped") == 3


def test_cli_writes_the_figures_and_reports_bad_input_in_one_line(tmp_path, capsys):
    assert figures.main(["--metrics", str(ROOT / "metrics"), "--plots", str(ROOT / "plots"), "--out", str(tmp_path)]) == 0
    assert f"wrote {tmp_path / figures.COST_RATIO_PNG}" in capsys.readouterr().out
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "eval.json").write_text("{not json")
    assert figures.main(["--metrics", str(tmp_path / "m"), "--plots", str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("figures: error: ") and "eval.json: not valid JSON" in err and "Traceback" not in err
