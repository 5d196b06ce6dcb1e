"""experiments.model_ab's summary: per family, each group's cost over the best rival and the paired A / B."""
from __future__ import annotations

import pytest

from experiments.model_ab import group_rows, select_tasks


def row(split, family, a, b, best=2.0, other=4.0):
    return {"split": split, "task": f"{split}/{family}", "family": family, "best_rival_ms": best,
            "cost_ms": {"A0": a[0], "A1": a[1], "B0": b[0], "B1": b[1], "R0": best, "R1": other}}


def test_groups_average_their_models_and_pair_a_with_b_per_task():
    rows = [row("test", "f1", (1.8, 2.2), (2.0, 2.0)),   # A 1.00, B 1.00 of the best rival
            row("test", "f1", (1.0, 1.0), (2.0, 2.0)),   # A 0.50, B 1.00
            row("test", "f2", (1.5, 1.5), (1.5, 1.5)),
            row("train", "f1", (3.0, 3.0), (2.0, 2.0))]
    out = group_rows(rows, ["A0", "A1"], ["B0", "B1"], ["R0", "R1"], seed=0)
    assert set(out) == {"f1", "f2", "test", "train:f1"}
    f1 = out["f1"]
    assert f1["tasks"] == 2 and f1["a_over_best_rival"] == pytest.approx(0.75) and f1["b_over_best_rival"] == 1.0
    assert f1["models_over_best_rival"] == pytest.approx({"A0": 0.7, "A1": 0.8, "B0": 1.0, "B1": 1.0})
    assert f1["a_over_b"] == pytest.approx(0.75) and f1["a_over_b_ci"] == pytest.approx([0.5, 1.0])
    assert out["test"]["tasks"] == 3 and out["test"]["a_over_b"] == pytest.approx((1.0 + 0.5 + 1.0) / 3)
    assert out["train:f1"]["a_over_b"] == pytest.approx(1.5) and out["train:f1"]["a_over_b_ci"] == [1.5, 1.5]
    # each group over each rival, paired per task: A's mean cost 2.0 and 1.0 on f1 over R1's 4.0
    assert f1["over_each_rival"]["a_over_R1"] == pytest.approx([0.375, 0.25, 0.5])
    assert f1["over_each_rival"]["b_over_R0"] == pytest.approx([1.0, 1.0, 1.0])


class FakeTask:
    def __init__(self, family: str, k: int):
        self.family, self.name = family, f"{family}/{k}"


def test_part_of_the_stage_tasks_only_those_families_the_first_n_each_in_the_stage_order():
    stage = [(sp, FakeTask(f, k)) for k in range(3) for f in ("f1", "f2") for sp in ("test", "train")]
    picked = select_tasks(stage, {"test", "train"}, {"f2"}, 2)
    assert [(sp, t.name) for sp, t in picked] == [("test", "f2/0"), ("train", "f2/0"), ("test", "f2/1"),
                                                   ("train", "f2/1")]
    assert [t.name for _, t in select_tasks(stage, {"test"}, set(), None)] == ["f1/0", "f2/0", "f1/1", "f2/1",
                                                                               "f1/2", "f2/2"]
    with pytest.raises(ValueError, match="--only: no test tasks of f3"):
        select_tasks(stage, {"test"}, {"f1", "f3"}, None)


def test_a_rows_file_of_an_earlier_pass_gives_the_same_summary_and_names_what_it_lacks(tmp_path):
    import json

    from experiments.model_ab import summarise_rows

    rows = [row("test", "f1", (1.8, 2.2), (2.0, 2.0)), row("test", "f1", (1.0, 1.0), (2.0, 2.0))]
    for r in rows:
        r["device"] = "cpu: test"
    path = tmp_path / "ab.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = summarise_rows(path, ["R0", "R1"], seed=0)
    assert summary["device"] == "cpu: test"
    assert summary["families"] == group_rows(rows, ["A0", "A1"], ["B0", "B1"], ["R0", "R1"], seed=0)
    with pytest.raises(ValueError, match="ab.jsonl: cost_ms: expected .*torchrec"):
        summarise_rows(path, ["R0", "torchrec"], seed=0)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty.jsonl: no rows"):
        summarise_rows(tmp_path / "empty.jsonl", ["R0"], seed=0)


def test_summarising_rows_refuses_the_options_of_a_measuring_pass(capsys):
    from experiments.model_ab import main

    with pytest.raises(SystemExit):
        main(["--rows", "ab.jsonl", "--only", "f1", "--tasks-per-family", "3"])
    assert "--only, --tasks-per-family only apply to a measuring pass" in capsys.readouterr().err
