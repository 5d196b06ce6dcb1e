"""A learned sharder beyond its training range (sharders/fallback.py): the scaler's recorded range, the rule (the
learned plan where the model folds all that lies beyond, else the plan the analytic sharder's model rates cheaper),
and dreamshard_cut planning with TorchRec's model or TorchRec's own planner as its fallback."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from dreamshard.errors import DataFormatError
from dreamshard.learning.features import FeatureScaler, table_features
from dreamshard.memory import MemoryModel
from dreamshard.plan import Plan, validate_plan
from dreamshard.sharders import make_sharder
from dreamshard.sharders.fallback import keep_better
from dreamshard.tables import Table
from dreamshard.tasks import Task

BINS = tuple([0.5, 0.3, 0.2] + [0.0] * 14)
MEMORY = MemoryModel()


def training_tables() -> list[Table]:
    rng = np.random.default_rng(0)
    return [Table(f"tr{i}", int(rng.integers(100, 100_000)), int(rng.choice([8, 16, 32, 64])),
                  float(rng.uniform(1, 20)), BINS) for i in range(40)]


def scaler() -> FeatureScaler:
    return FeatureScaler.fit(table_features(training_tables(), MEMORY))


def task_of(tables: list[Table], devices: int = 2, memory_gb: float = 1.0) -> Task:
    return Task.uniform("t", tables, devices, memory_gb, MEMORY, "f")


def test_the_scaler_records_the_training_range_and_names_what_lies_beyond():
    s = scaler()
    tables = training_tables()
    assert s.high == (max(t.dim for t in tables), max(t.rows for t in tables), max(t.pooling_factor for t in tables))
    assert s.low == (min(t.dim for t in tables), min(t.rows for t in tables), min(t.pooling_factor for t in tables))
    assert s.outside(tables) == {}
    assert s.outside([replace(tables[0], dim=4, rows=100, pooling_factor=0.5)]) == {}  # below: not extrapolating up
    assert s.outside([replace(tables[0], rows=int(s.high[1] * 1.05))]) == {}  # within RANGE_SLACK of the high
    wide = replace(tables[0], dim=256)
    heavy = replace(tables[1], pooling_factor=90.0)
    assert s.outside([tables[2], wide, heavy]) == {"dim": (256.0, s.high[0]), "pooling_factor": (90.0, s.high[2])}
    assert FeatureScaler.from_dict(s.to_dict()) == s
    old = {k: v for k, v in s.to_dict().items() if k != "range"}  # a checkpoint written before ranges were kept
    assert FeatureScaler.from_dict(old).outside([wide]) == {}
    bad = {**s.to_dict(), "range": {"features": ["dim"], "low": [1.0], "high": [2.0]}}
    with pytest.raises(DataFormatError, match="feature scaler: range: expected features"):
        FeatureScaler.from_dict(bad)


@dataclass
class Rated:
    """A sharder with a fixed plan and fixed ratings by plan (the rule's oracle: each case's numbers by hand)."""

    plan: Plan
    ratings: dict
    name: str = "rated"

    def shard(self, task: Task) -> Plan:
        return self.plan

    def rating_ms(self, task: Task, plan: Plan) -> float:
        return self.ratings[plan.key()]


@pytest.mark.parametrize("learned_own, analytic_own, learned_ana, analytic_ana, kept", [
    (1.0, 1.5, 2.0, 1.0, "analytic"),  # the analytic model rates its plan cheaper: the learned model's view is moot
    (1.0, 0.5, 1.0, 1.2, "learned"),   # ... and the other way
    (2.0, 1.0, 1.0, 1.0, "learned"),   # a tie: the learned plan
])
def test_beyond_the_range_in_what_the_model_does_not_fold_the_analytic_model_judges(
        learned_own, analytic_own, learned_ana, analytic_ana, kept):
    tables = [Table(f"t{i}", 1000, 8, 1.0, BINS) for i in range(2)]
    task = task_of(tables)
    mine, other = Plan.from_assignment(task, [0, 1]), Plan.from_assignment(task, [0, 0])
    analytic = Rated(other, {mine.key(): learned_ana, other.key(): analytic_ana})
    own = {mine.key(): learned_own, other.key(): analytic_own}
    for outside in ({"pooling_factor": (90.0, 40.0)}, {"pooling_factor": (90.0, 40.0), "dim": (512.0, 128.0)}):
        plan, decision = keep_better(task, mine, outside, lambda _t, p: own[p.key()], analytic, ("dim",))
        assert decision is not None and decision.kept == kept and decision.analytic == "rated"
        assert plan == (other if kept == "analytic" else mine) and not decision.folded
        assert (decision.learned_by_own, decision.analytic_by_own) == (learned_own, analytic_own)
        assert (decision.learned_by_analytic, decision.analytic_by_analytic) == (learned_ana, analytic_ana)
        assert decision.to_dict()["outside_training_range"] == {k: {"value": v, "training_high": hi}
                                                                for k, (v, hi) in outside.items()}
    # beyond it in dims alone, which the model folds: its plan, nothing else planned or rated
    wide = {"dim": (512.0, 128.0)}
    plan, decision = keep_better(task, mine, wide, lambda *_: 1 / 0, Rated(other, {}), ("dim",))
    assert plan == mine and decision is not None and decision.folded and decision.to_dict()["folded"] is True
    # a model that folds nothing: dims beyond go to the fallback too
    plan, decision = keep_better(task, mine, wide, lambda _t, p: own[p.key()], analytic, ())
    assert decision is not None and not decision.folded and decision.kept == kept
    # inside the range: the learned plan, nothing planned besides, no decision
    assert keep_better(task, mine, {}, lambda *_: 1 / 0, analytic) == (mine, None)
    # outside without a fallback: the learned plan, and the decision says so
    plan, decision = keep_better(task, mine, {"pooling_factor": (90.0, 40.0)}, lambda *_: 1 / 0, None)
    assert plan == mine and decision is not None and not decision.analytic and decision.kept == "learned"


def test_an_analytic_sharder_that_finds_no_plan_leaves_the_learned_plan_and_says_why():
    from dreamshard.errors import InfeasibleTaskError

    class NoPlan(Rated):
        def shard(self, task: Task) -> Plan:
            raise InfeasibleTaskError("TorchRec's planner found no plan: strict constraints")

    task = task_of([Table(f"t{i}", 1000, 8, 1.0, BINS) for i in range(2)])
    mine = Plan.from_assignment(task, [0, 1])
    plan, decision = keep_better(task, mine, {"pooling_factor": (90.0, 40.0)}, lambda *_: 1 / 0,
                                 NoPlan(mine, {}), ("dim",))
    assert plan == mine and decision is not None and decision.kept == "learned"
    assert decision.to_dict()["no_plan"] == "TorchRec's planner found no plan: strict constraints"
    assert "ratings_ms" not in decision.to_dict()


def untrained_model():
    import torch

    from dreamshard.learning.cost_model import CostNetConfig
    from dreamshard.learning.policy import LearnedModel, PolicyNetConfig

    gen = torch.Generator().manual_seed(0)
    return LearnedModel(CostNetConfig().build(gen), PolicyNetConfig().build(gen), scaler(), {})


def test_dreamshard_cut_falls_back_to_torchrec_model_beyond_its_training_range_only():
    """Real parts: dreamshard_cut (an untrained model: the mechanism, not its quality) with torchrec_model as the
    fallback. Inside the range its plans are its own; beyond, the kept plan is the one the recorded ratings choose,
    and the ratings are the two models' own."""
    pytest.importorskip("torchrec")
    from dreamshard.interop.torchrec import torchrec_batch, torchrec_perf_estimate
    from dreamshard.learning.cost_model import NetworkEstimate

    model = untrained_model()
    analytic = make_sharder("torchrec_model", batch_size=1024)
    alone = make_sharder("dreamshard_cut", model=model)
    with_fallback = make_sharder("dreamshard_cut", model=model, fallback=analytic)
    inside = task_of(training_tables()[:8], 4)
    assert with_fallback.shard(inside) == alone.shard(inside) and with_fallback.last_decision is None

    beyond = task_of([replace(t, pooling_factor=t.pooling_factor * 10) for t in training_tables()[:8]], 4)
    plan = with_fallback.shard(beyond)
    validate_plan(beyond, plan)
    d = with_fallback.last_decision
    assert d is not None and d.analytic == "torchrec_model" and set(d.outside) == {"pooling_factor"}
    mine, theirs = alone.shard(beyond), analytic.shard(beyond)
    assert plan == (theirs if d.kept == "analytic" else mine)
    own = NetworkEstimate(model.cost_net, model.scaler)
    assert d.learned_by_own == pytest.approx(own.plan_cost(beyond, mine).cost_ms)
    assert d.analytic_by_own == pytest.approx(own.plan_cost(beyond, theirs).cost_ms)
    batch = torchrec_batch(beyond, 1024)
    assert d.analytic_by_analytic == pytest.approx(torchrec_perf_estimate(beyond, theirs, batch).cost_ms)
    assert d.learned_by_analytic == pytest.approx(torchrec_perf_estimate(beyond, mine, batch).cost_ms)
    # pooling is beyond the range and the model does not fold it: TorchRec's model judges
    assert not d.folded and d.kept == ("analytic" if d.analytic_by_analytic < d.learned_by_analytic else "learned")
    from dreamshard.provenance import provenance  # what a plan file's made_by says of it

    assert provenance("dreamshard_cut", None, model, beyond, with_fallback)["fallback"] == d.to_dict()
    with_fallback.shard(inside)
    assert "fallback" not in provenance("dreamshard_cut", None, model, inside, with_fallback)


def test_dreamshard_cut_with_torchrec_planner_as_fallback_defers_only_beyond_what_it_folds():
    """Real parts: dreamshard_cut with TorchRec's own planner (torchrec_full, told a cluster) as the fallback. Beyond
    the range in dims, which the model folds, its own plan stands; in pooling, the plan TorchRec's perf model (on the
    sharder's cluster) rates cheaper is kept, and both ratings are TorchRec's own estimates of the two plans."""
    pytest.importorskip("torchrec")
    from dreamshard.hardware.topology import Topology
    from dreamshard.interop.torchrec import topology, torchrec_batch, torchrec_perf_estimate

    model = untrained_model()
    links = Topology(devices_per_host=2)
    analytic = make_sharder("torchrec_full", batch_size=1024, links=links)
    alone = make_sharder("dreamshard_cut", model=model)
    with_fallback = make_sharder("dreamshard_cut", model=model, fallback=analytic)
    wide = task_of([replace(t, dim=512) for t in training_tables()[:8]], 4, 8.0)
    assert with_fallback.shard(wide) == alone.shard(wide)
    assert with_fallback.last_decision is not None and with_fallback.last_decision.folded

    heavy = task_of([replace(t, pooling_factor=t.pooling_factor * 10) for t in training_tables()[:8]], 4)
    plan = with_fallback.shard(heavy)
    validate_plan(heavy, plan)
    d = with_fallback.last_decision
    assert d is not None and d.analytic == "torchrec_full" and not d.folded and not d.no_plan
    mine, theirs = alone.shard(heavy), analytic.shard(heavy)
    assert plan == (theirs if d.kept == "analytic" else mine)
    rate = [torchrec_perf_estimate(heavy, p, torchrec_batch(heavy, 1024), topology(heavy, links)).cost_ms
            for p in (mine, theirs)]
    assert (d.learned_by_analytic, d.analytic_by_analytic) == pytest.approx(rate)
    assert d.kept == ("analytic" if rate[1] < rate[0] else "learned")


def test_torchrecs_planner_as_fallback_plans_and_rates_on_the_users_torchrec_topology(monkeypatch):
    """DreamShardPlanner hands the fallback its user's TorchRec Topology: TorchRec's planner plans on a topology of
    that Topology's hosts and links (a new one, not the one ratings keep), and rates plans on it."""
    pytest.importorskip("torchrec")
    from torchrec.distributed.planner.types import Topology as TorchRecTopology

    import dreamshard.interop.torchrec as tx

    given = TorchRecTopology(world_size=4, compute_device="cuda", local_world_size=2, inter_host_bw=1e6)
    sharder = make_sharder("torchrec_full", batch_size=1024, torchrec_topology=given)
    task = task_of([replace(t, pooling_factor=t.pooling_factor * 10) for t in training_tables()[:8]], 4)
    planned_on = []
    real = tx.topology_like

    def spy(t, g):
        planned_on.append(real(t, g))
        return planned_on[-1]

    monkeypatch.setattr(tx, "topology_like", spy)
    assert sharder.spans_hosts(task) and "grid_shard" not in sharder.types_for(task)
    plan = sharder.shard(task)
    validate_plan(task, plan)
    assert len(planned_on) == 1 and planned_on[0] is not tx.topology_from(task, given)
    assert (planned_on[0].local_world_size, planned_on[0].inter_host_bw) == (2, 1e6)
    want = tx.torchrec_perf_estimate(task, plan, tx.torchrec_batch(task, 1024), tx.topology_from(task, given))
    assert sharder.rating_ms(task, plan) == pytest.approx(want.cost_ms)


def test_only_the_learned_sharders_that_cut_take_a_fallback_and_it_must_rate_plans():
    model = untrained_model()
    with pytest.raises(TypeError, match="fallback must be a sharder that rates plans"):
        make_sharder("dreamshard_cut", model=model, fallback=make_sharder("size_greedy"))
    with pytest.raises(ValueError, match="unknown option"):
        make_sharder("dreamshard", model=model, fallback=None)


def test_the_fold_prices_a_wider_piece_as_trained_width_slices_and_leaves_pooling_alone():
    from dreamshard.learning.features import FOLDABLE, FOLDED

    s = scaler()
    high_dim, high_pool = s.high[0], s.high[2]
    inside, wide = training_tables()[0], replace(training_tables()[1], dim=int(high_dim) * 4)
    heavy = replace(training_tables()[2], pooling_factor=high_pool * 5)
    raw = table_features([inside, wide, heavy], MEMORY)
    folded, weight = s.fold(raw)
    assert FOLDED == ("dim",)
    assert weight.tolist() == [1.0, 4.0, 1.0]
    assert folded[0].tolist() == raw[0].tolist() and folded[2].tolist() == raw[2].tolist()  # pooling: as it is
    slice_ = table_features([replace(wide, dim=int(high_dim))], MEMORY)[0]  # a column slice of the trained width
    assert folded[1] == pytest.approx(slice_)
    both, weight = replace(s, folds=FOLDABLE).fold(raw)
    assert weight.tolist() == [1.0, 4.0, 5.0] and both[2][2] == pytest.approx(high_pool)
    nothing, weight = replace(s, folds=()).fold(raw)
    assert weight.tolist() == [1.0, 1.0, 1.0] and nothing.tolist() == raw.tolist()
    old = FeatureScaler.from_dict({k: v for k, v in s.to_dict().items() if k != "range"})  # no range known
    assert old.fold(raw)[1].tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="folds: expected features among"):
        replace(s, folds=("rows",))


def test_the_cost_network_computes_a_wide_table_as_its_trained_width_slices_on_one_device():
    import torch

    from dreamshard.learning.cost_model import CostNetConfig, NetworkEstimate
    from dreamshard.plan import Shard

    s = scaler()
    width = int(s.high[0])
    wide = replace(training_tables()[1], name="wide", dim=width * 4)
    task = task_of([wide, *training_tables()[:3]], devices=2, memory_gb=4.0)
    rest = [Shard(t.name, 1, 0, t.dim) for t in task.tables[1:]]
    whole = Plan(2, (Shard("wide", 0, 0, wide.dim), *rest))
    sliced = Plan(2, (*(Shard("wide", 0, c, c + width) for c in range(0, wide.dim, width)), *rest))
    net = CostNetConfig().build(torch.Generator().manual_seed(0))  # one fused operator per device
    a, b = NetworkEstimate(net, s).plan_cost(task, whole), NetworkEstimate(net, s).plan_cost(task, sliced)
    assert [c for d in a.devices for c in (d.fwd_ms, d.bwd_ms)] == \
        pytest.approx([c for d in b.devices for c in (d.fwd_ms, d.bwd_ms)], rel=1e-5)
    unfolded = NetworkEstimate(net, replace(s, folds=())).plan_cost(task, whole)
    assert unfolded.devices[0].fwd_ms != pytest.approx(a.devices[0].fwd_ms)


def test_a_folded_dim_weighs_k_to_the_scalers_exponent_pooling_k_and_checkpoints_keep_it():
    from dreamshard.learning.features import FOLDABLE

    s = scaler()
    wide = replace(training_tables()[1], dim=int(s.high[0]) * 4)
    heavy = replace(training_tables()[2], pooling_factor=s.high[2] * 5)
    raw = table_features([wide, heavy], MEMORY)
    half = replace(s, fold_exponent=0.5)
    assert s.fold_exponent == 1.0 and s.fold(raw)[1].tolist() == [4.0, 1.0]
    assert half.fold(raw)[1].tolist() == [2.0, 1.0]
    assert replace(half, folds=FOLDABLE).fold(raw)[1].tolist() == [2.0, 5.0]  # pooling folds at weight k
    assert half.fold(raw)[0].tolist() == s.fold(raw)[0].tolist()  # the same slices, only their weight differs
    assert FeatureScaler.from_dict(half.to_dict()) == half
    older = half.to_dict()
    del older["range"]["fold_exponent"]  # a checkpoint written before the exponent was fitted
    assert FeatureScaler.from_dict(older).fold_exponent == 1.0
    for bad in (0, 1.5, True, "0.5"):
        with pytest.raises(DataFormatError, match="fold_exponent: expected a number in"):
            FeatureScaler.from_dict({**older, "range": {**older["range"], "fold_exponent": bad}})


def test_the_fitted_fold_exponent_is_the_grid_one_whose_folds_inside_the_range_agree_with_the_network_best():
    """Brute force over FOLD_EXPONENTS as the oracle: rate each device with dims above half and a quarter of the
    training high folded, and keep the exponent of least mean log ratio to the unfolded rating."""
    import torch

    from dreamshard.learning.cost_model import FOLD_EXPONENTS, CostNetConfig, NetworkEstimate, fit_fold_exponent

    s = scaler()
    net = CostNetConfig().build(torch.Generator().manual_seed(0))
    tables = training_tables()
    tasks = [task_of(tables[i:i + 8], devices=2, memory_gb=4.0) for i in range(0, 40, 8)]
    fitted = fit_fold_exponent(net, s, tasks)

    def device_compute(sc, task):
        plan = Plan.from_assignment(task, [i % 2 for i in range(len(task.tables))])
        return np.array([d.fwd_ms + d.bwd_ms for d in NetworkEstimate(net, sc).plan_cost(task, plan).devices])

    def off(e):
        logs = []
        for div in (2, 4):
            capped = replace(s, high=(s.high[0] / div, *s.high[1:]))
            for task in tasks:
                ratio = device_compute(replace(capped, fold_exponent=e), task) / device_compute(s, task)
                moved = device_compute(replace(capped, fold_exponent=1.0), task) != device_compute(s, task)
                logs += np.log(ratio[moved]).tolist()
        return abs(np.mean(logs))

    assert fitted.fold_exponent in FOLD_EXPONENTS
    assert off(fitted.fold_exponent) == pytest.approx(min(off(e) for e in FOLD_EXPONENTS))
    assert replace(fitted, fold_exponent=1.0) == s  # only the exponent changes
    assert fit_fold_exponent(net, replace(s, low=None, high=None), tasks).fold_exponent == 1.0  # no range: no fit
    assert fit_fold_exponent(net, s, []) is s
