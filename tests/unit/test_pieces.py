"""A production-scale model with tables larger than a device (issue 11's example): every sharder of ours plans it,
cutting the 40M-row tables into column slices, each plan valid and within memory."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from dreamshard.data.examples import PRODUCTION_BIG_ROWS, production_model_tables
from dreamshard.learning.cost_model import CostNetConfig
from dreamshard.learning.features import NUM_FEATURES, FeatureScaler
from dreamshard.learning.neuroshard import CommNetConfig, NeuroShardModel
from dreamshard.learning.policy import LearnedModel, PolicyNetConfig
from dreamshard.learning.rnn import RnnModel, RnnPolicyConfig
from dreamshard.memory import GB
from dreamshard.plan import device_memory_bytes, validate_plan
from dreamshard.sharders import HEURISTICS, LEARNED, make_sharder
from dreamshard.sharders.search import SearchConfig
from dreamshard.tables import Table
from dreamshard.tasks import Task
from helpers import seeded

BIG_ROWS = PRODUCTION_BIG_ROWS  # 40M x 128 x 4 B = 19.07 GB: larger than a 16 GB device


def production_tables(bins: bool) -> list[Table]:
    """26 tables of dim 128: 4 of 40M rows, the rest 3 to 3M rows; pooling factors 1..100 (with random bins)."""
    rng = np.random.default_rng(0)
    hist = tuple(float(x) for x in rng.dirichlet(np.ones(17))) if bins else None
    return [replace(t, bins=hist) for t in production_model_tables()]


def untrained_models() -> dict[str, object]:
    gen = torch.Generator().manual_seed(0)
    scaler = FeatureScaler.fit(np.abs(np.random.default_rng(0).normal(size=(64, NUM_FEATURES))) * 100)
    cost = CostNetConfig().build(gen)
    return {"dreamshard": LearnedModel(cost, PolicyNetConfig().build(gen), scaler, {}),
            "autoshard": LearnedModel(cost, PolicyNetConfig().build(gen), scaler, {}),
            "neuroshard": NeuroShardModel(cost, CommNetConfig().build(gen), scaler, {}),
            "rnn": RnnModel(RnnPolicyConfig().build(gen), scaler, {})}


def any_sharder(name: str, depth: int = 3):
    """Sharder `name` of ours, a learned one with its untrained model (NeuroShard's search cut to `depth`)."""
    options = {}
    if name in LEARNED:
        options["model"] = untrained_models()[{"neuroshard_tw": "neuroshard", "dreamshard_cut": "dreamshard"}.get(name, name)]
    if name in ("neuroshard", "neuroshard_tw"):
        options["search"] = SearchConfig(beams=2, depth=depth, candidates=depth, scale_steps=depth)
    return make_sharder(name, **options, **seeded(name, 0))


@pytest.mark.parametrize("name", HEURISTICS + LEARNED)
def test_the_production_model_plans_on_eight_16_gb_devices(name):
    task = Task.uniform("production", production_tables(bins=name in LEARNED), 8, 16.0)
    plan = any_sharder(name).shard(task)
    validate_plan(task, plan)
    assert max(device_memory_bytes(task, plan)) <= 16 * GB
    for i in range(4):  # each 19 GB table in column slices of at most 64 columns (9.5 GB) on several devices
        pieces = [s for s in plan.shards if s.table == f"cat_{i}"]
        assert all(s.kind(BIG_ROWS, 128) == "column" and s.width <= 64 for s in pieces), pieces
        assert len({s.device for s in pieces}) >= 2


# ---------------------------------------------------------------- the column cut rule, linear in dim


def _old_column_widths(dim: int, k: int) -> list[int]:
    """column_widths as it was before the cut search became a binary search (kept here only to compare)."""
    units = dim // 4
    base, extra = divmod(units, k)
    return [4 * (base + (1 if i < extra else 0)) for i in range(k)]


def _old_fewest_slices(dim: int, fits) -> int | None:
    """The old search of first_cut: every k in turn (quadratic in dim)."""
    for k in range(2, dim // 4 + 1):
        if fits(max(_old_column_widths(dim, k))):
            return k
    return None


def test_the_column_cuts_are_those_of_the_old_rule():
    """The same slices and the same fewest k as the old rule, for every dim 4..4096 step 4 and a few limits on the
    widest slice (a device's room, in columns), and a few k."""
    from dreamshard.sharders.pieces import column_widths, fewest_slices, widest_column

    for dim in range(4, 4097, 4):
        for k in sorted({1, 2, 3, 5, 7, 16, dim // 8, dim // 4} - {0}):
            if k > dim // 4:
                continue
            assert column_widths(dim, k) == _old_column_widths(dim, k), (dim, k)
            assert widest_column(dim, k) == max(_old_column_widths(dim, k)), (dim, k)
        rooms = {dim - 4, dim // 2, dim // 3, dim // 5, dim // 8 + 1} | ({4, 8, 12} if dim <= 512 else set())
        for room in rooms:
            def fits(width: int, room: int = room) -> bool:
                return width <= room
            assert fewest_slices(dim, fits) == _old_fewest_slices(dim, fits), (dim, room)


def test_the_column_cut_of_a_wide_table_is_quick():
    """The largest dim the tool accepts, cut as finely as it goes: a binary search, not dim^2 / 32 steps."""
    import time

    from dreamshard.limits import MAX_DIM
    from dreamshard.sharders.pieces import fewest_slices

    start = time.monotonic()
    assert fewest_slices(MAX_DIM, lambda width: width <= 4) == MAX_DIM // 4
    assert fewest_slices(MAX_DIM, lambda width: width <= 0) is None
    assert time.monotonic() - start < 1.0


def test_a_search_that_runs_long_cuts_finer_before_it_starts_again_largest_first():
    # thirty 160 B tables (dim 4), then tables of 15,200 and 12,000 B (dim 8) on two devices of 16,000 B: placed
    # small first by least load, the large ones are stranded and backing out takes about a million placements.
    # with_pieces gives such a search up after DEFAULT_PATIENCE placements and cuts the largest piece into two
    # column slices, twice here (the slices of "big" strand "large" in turn), until the same order places them;
    # the largest-first restart is left for the last cut
    from dreamshard.errors import InfeasibleTaskError
    from dreamshard.placement import DEFAULT_PATIENCE, by_least_load, giving_up_early, place_tables
    from dreamshard.plan import Plan
    from dreamshard.sharders.pieces import with_pieces
    from dreamshard.tasks import Device

    tables = [Table(f"t{i}", 10, 4, 1.0) for i in range(30)] + [Table("big", 475, 8, 1.0), Table("large", 375, 8, 1.0)]
    task = Task("stranded", tuple(tables), (Device(16_000), Device(16_000)), sharding=("table", "column"))
    calls = []

    def small_first(t: Task) -> Plan:
        sizes = [t.table_bytes(i) for i in range(len(t.tables))]

        def ranked(i, state):
            calls.append(i)
            return by_least_load(i, state)
        return Plan.from_assignment(t, place_tables(t, sorted(range(len(sizes)), key=lambda i: sizes[i]), ranked,
                                                    weights=sizes))

    plan = with_pieces(task, small_first)
    validate_plan(task, plan)
    for name in ("big", "large"):
        assert sorted((s.col_start, s.col_end) for s in plan.shards if s.table == name) == [(0, 4), (4, 8)]
    assert len(calls) < 2 * DEFAULT_PATIENCE + 100  # two cuts given up, the third placed without backing up
    with giving_up_early(), pytest.raises(InfeasibleTaskError, match=f"found in {DEFAULT_PATIENCE} steps"):
        small_first(task)
    whole = small_first(task)  # outside it, the restart places the whole tables
    validate_plan(task, whole)
    assert len(whole.shards) == len(tables)
