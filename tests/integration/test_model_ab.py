"""experiments.model_ab: per family, each group's cost over the best rival and the paired A / B; a decoding's A/B
read off an evaluation's journal, where the variant's cost on a task is the measured cost of the plan it picks."""
from __future__ import annotations

import importlib
import json
import os

import pytest
import yaml

from dreamshard.errors import DreamShardError
from dreamshard.plan import Plan
from dreamshard.sharders.heuristics import GREEDY_KEYS
from experiments import model_ab
from experiments.model_ab import group_rows, select_tasks


def row(split, family, a, b, best=2.0, other=4.0):
    return {"split": split, "task": f"{split}/{family}", "family": family, "best_rival_ms": best,
            "cost_ms": {"A0": a[0], "A1": a[1], "B0": b[0], "B1": b[1], "R0": best, "R1": other}}


def test_groups_average_their_models_and_pair_a_with_b_per_task():
    rows = [row("validation", "f1", (1.8, 2.2), (2.0, 2.0)),   # A 1.00, B 1.00 of the best rival
            row("validation", "f1", (1.0, 1.0), (2.0, 2.0)),   # A 0.50, B 1.00
            row("validation", "f2", (1.5, 1.5), (1.5, 1.5)),
            row("train", "f1", (3.0, 3.0), (2.0, 2.0))]
    out = group_rows(rows, ["A0", "A1"], ["B0", "B1"], ["R0", "R1"], seed=0)
    assert set(out) == {"f1", "f2", "validation", "train:f1"}
    f1 = out["f1"]
    assert f1["tasks"] == 2 and f1["a_over_best_rival"] == pytest.approx(0.75) and f1["b_over_best_rival"] == 1.0
    assert f1["models_over_best_rival"] == pytest.approx({"A0": 0.7, "A1": 0.8, "B0": 1.0, "B1": 1.0})
    assert f1["a_over_b"] == pytest.approx(0.75) and f1["a_over_b_ci"] == pytest.approx([0.5, 1.0])
    assert out["validation"]["tasks"] == 3 and out["validation"]["a_over_b"] == pytest.approx((1.0 + 0.5 + 1.0) / 3)
    assert out["train:f1"]["a_over_b"] == pytest.approx(1.5) and out["train:f1"]["a_over_b_ci"] == [1.5, 1.5]
    # each group over each rival, paired per task: A's mean cost 2.0 and 1.0 on f1 over R1's 4.0
    assert f1["over_each_rival"]["a_over_R1"] == pytest.approx([0.375, 0.25, 0.5])
    assert f1["over_each_rival"]["b_over_R0"] == pytest.approx([1.0, 1.0, 1.0])


class FakeTask:
    def __init__(self, family: str, k: int):
        self.family, self.name = family, f"{family}/{k}"


def test_part_of_the_stage_tasks_only_those_families_the_first_n_each_in_the_stage_order():
    stage = [(sp, FakeTask(f, k)) for k in range(3) for f in ("f1", "f2") for sp in ("validation", "train")]
    picked = select_tasks(stage, {"validation", "train"}, {"f2"}, 2)
    assert [(sp, t.name) for sp, t in picked] == [("validation", "f2/0"), ("train", "f2/0"), ("validation", "f2/1"),
                                                   ("train", "f2/1")]
    assert [t.name for _, t in select_tasks(stage, {"validation"}, set(), None)] == ["f1/0", "f2/0", "f1/1", "f2/1",
                                                                               "f1/2", "f2/2"]
    with pytest.raises(ValueError, match="--only: no validation tasks of f3"):
        select_tasks(stage, {"validation"}, {"f1", "f3"}, None)


def test_a_rows_file_of_an_earlier_pass_gives_the_same_summary_and_names_what_it_lacks(tmp_path):
    import json

    from experiments.model_ab import summarise_rows

    rows = [row("validation", "f1", (1.8, 2.2), (2.0, 2.0)), row("validation", "f1", (1.0, 1.0), (2.0, 2.0))]
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


def test_summarising_rows_or_reading_the_journal_refuses_the_options_of_a_measuring_pass(capsys):
    from experiments.model_ab import main

    with pytest.raises(SystemExit):
        main(["--rows", "ab.jsonl", "--only", "f1", "--tasks-per-family", "3"])
    assert "--only, --tasks-per-family only apply to a measuring pass" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--journal", "--a", "A0.pt", "--a-decoding", "{}", "--rivals", "size_greedy"])
    assert "--journal reads the run's evaluation; --a, --a-decoding, --rivals only apply" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--a", "A0.pt", "--b", "B0.pt", "--sharder", "autoshard"])
    assert "--sharder: a measured A/B plans with DreamShard checkpoints, as dreamshard or dreamshard_cut" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--a", "A0.pt", "--b", "A0.pt", "--b-decoding", '["rivals"]'])
    assert "--b-decoding: expected a JSON object of decoding options" in capsys.readouterr().err


def plan_key(shards_json: str) -> tuple:
    """Plan.key() of a journal row's `shards` (JSON)."""
    shards = json.loads(shards_json)
    return Plan.from_dict({"num_devices": 1 + max(s["device"] for s in shards), "shards": shards}).key()


def test_the_journal_variant_takes_the_measured_row_of_the_plan_it_picks(tiny_project, tmp_path, monkeypatch, capsys):
    from dreamshard.hardware.allocator import HUGE_PAGES_ENV

    monkeypatch.setenv(HUGE_PAGES_ENV, os.environ.get(HUGE_PAGES_ENV, "0"))  # the command sets it from params
    monkeypatch.chdir(tmp_path)
    params = tiny_project("trained").copy_to(tmp_path)  # the tiny project with a trained DreamShard policy
    params["evaluate"].update(sharders=[*GREEDY_KEYS, "dreamshard"], estimated_bins={"tasks_per_family": 0, "rounds": 1},
                              train_tasks_per_family=1)
    params["orchestration"] = {"evaluate": {"planning_workers": 1, "planning_chunk": 4}}
    importlib.import_module("stages.evaluate").run(params)
    frame, counts = model_ab.counterfactual(params, "dreamshard", {"rivals": list(GREEDY_KEYS)})
    variant = frame[frame["algorithm"] == "dreamshard+rivals"]
    assert counts["tasks"] == len(set(zip(frame["split"], frame["task"]))) == len(variant) + counts["missing"]
    assert counts["missing"] == 0 and counts["kept"] + sum(counts[r] for r in GREEDY_KEYS) == counts["tasks"]
    for _, row in variant.iterrows():  # the same plan, the same measurement as one evaluated row of its task
        same = frame[(frame["task"] == row["task"]) & (frame["split"] == row["split"])
                     & (frame["algorithm"] != row["algorithm"])]
        matches = same[same["shards"].map(plan_key) == plan_key(row["shards"])]
        assert not matches.empty and (matches["cost_ms"] == row["cost_ms"]).all()
    result = model_ab.decoding_summary(frame, "dreamshard", "dreamshard+rivals", seed=0)
    assert set(result) == {"train"}  # the journal's training tasks only: design never reads the test pool
    assert set(frame["split"]) == {"train"}
    assert all("dreamshard+rivals" in v for fams in result.values() for v in fams.values())
    with pytest.raises(DreamShardError, match="missing: autoshard"):
        model_ab.counterfactual(params, "autoshard", {"rivals": ["size_greedy"]})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))  # the command reads the run's params
    out = tmp_path / "decoding.json"
    assert model_ab.main(["--journal", "--root", str(tmp_path), "--out", str(out)]) == 0  # rivals: every greedy one
    written = json.loads(out.read_text())
    assert written["counts"] == counts and written["rivals"] == list(GREEDY_KEYS)
    assert "| split | family | dreamshard vs best heuristic | dreamshard+rivals vs best heuristic |" in \
        capsys.readouterr().out
