"""Lower bounds on a task's plan cost, valid for the backend's fusion behaviour.

Evaluation reports every sharder's cost over these bounds, so they must hold on whatever kernels measure
the plans: the compute term follows the fusion regime the probes measured (super-additive, sub-additive,
either, non-monotone), with terms for column slices, row ranges (`row_splits`) and devices of different
speed. The assumptions and the full proof: docs/bounds.md.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dreamshard.errors import OverBudgetError
from dreamshard.hardware.base import CostBackend
from dreamshard.hardware.comm import Topology, transfer_ms
from dreamshard.plan import Plan, Shard
from dreamshard.tasks import Task

SUPER_ADDITIVE = "super_additive"
SUB_ADDITIVE = "sub_additive"
MIXED = "mixed"
# not a measured regime: the bound that holds whichever way fusion goes (the evaluate stage's)
EITHER = "either"
# EITHER without the per-table term: where probes showed tables fused cheaper than one of them alone
NON_MONOTONE = "non_monotone"
REGIMES = (SUPER_ADDITIVE, SUB_ADDITIVE, MIXED, EITHER, NON_MONOTONE)

_BOTH = ("min(cost of all tables fused, sum of single-table costs - (T-1) x cheapest single cost) / N "
         "+ all-to-all bound")
# what metrics/eval.json says of the bound each regime uses
BOUND_USED = {
    SUPER_ADDITIVE: "(sum of single-table costs - (T-1) x cheapest single cost) / N + all-to-all bound",
    SUB_ADDITIVE: _BOTH,
    MIXED: _BOTH,
    EITHER: _BOTH + ": holds whether fusing tables costs more or less than running them apart",
    NON_MONOTONE: _BOTH.replace(" + all-to-all bound", " + all-to-all bound, without the per-table term") +
    ": probes measured a set of tables fused cheaper than its costliest table alone",
}


def whole_shards(task: Task, indices: Sequence[int] | None = None) -> list[Shard]:
    chosen = range(len(task.tables)) if indices is None else indices
    return [Shard(task.tables[i].name, 0, 0, task.tables[i].dim) for i in chosen]


@dataclass(frozen=True)
class FusionProbe:
    """The first tables of a task measured fused, and each alone (ms)."""

    fused_ms: float
    single_ms: tuple[float, ...]

    @property
    def additivity(self) -> float:
        """fused / sum of singles: below 1 fusion saves, above 1 it costs (`regime_of`)."""
        return self.fused_ms / sum(self.single_ms)

    @property
    def monotone(self) -> float:
        """fused / the costliest single: below 1 a table got cheaper when others joined it (`bound_regime`)."""
        return self.fused_ms / max(self.single_ms)

    def to_dict(self) -> dict[str, object]:
        return {"fused_ms": self.fused_ms, "single_ms": list(self.single_ms)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FusionProbe:
        return cls(float(d["fused_ms"]), tuple(float(x) for x in d["single_ms"]))


def fusion_probe(backend: CostBackend, task: Task, max_tables: int = 20) -> FusionProbe:
    """The first `max_tables` tables of `task` measured as one fused operator, then one by one."""
    shards = whole_shards(task, range(min(max_tables, len(task.tables))))
    fused = backend.compute_cost(task, shards).total_ms
    return FusionProbe(fused, tuple(backend.compute_cost(task, [s]).total_ms for s in shards))


def additivity_ratio(backend: CostBackend, task: Task, max_tables: int = 20) -> float:
    """compute(first tables fused) / sum of their single-table computes."""
    return fusion_probe(backend, task, max_tables).additivity


def bound_regime(probes: Sequence[FusionProbe]) -> str:
    """The bound that holds whichever way fusion goes (EITHER), or NON_MONOTONE where a probe measured its tables
    fused cheaper than the costliest of them alone (the per-table term's assumption refuted)."""
    return EITHER if all(p.monotone >= 1.0 for p in probes) else NON_MONOTONE


def regime_of(ratios: Sequence[float]) -> str:
    if all(r >= 1.0 for r in ratios):
        return SUPER_ADDITIVE
    if all(r < 1.0 for r in ratios):
        return SUB_ADDITIVE
    return MIXED


@dataclass(frozen=True)
class LowerBound:
    total_ms: float
    compute_mean_ms: float  # the compute-sum part, already divided by N (0 when not justified)
    transfer_mean_ms: float  # lower bound on the mean per-device transfer (one direction)
    max_table_ms: float  # the per-table bound (the busiest device of one table), communication included


def _fastest_seconds_per_byte(topology: Topology, n: int, hosts: Sequence[int] | None = None) -> float:
    one_host = n <= topology.devices_per_host if hosts is None else len(set(hosts)) == 1
    fastest = topology.intra_host_gbps if one_host else max(topology.intra_host_gbps, topology.inter_host_gbps)
    return 1.0 / (fastest * 1e9)


# with row_splits, consecutive probed piece sizes differ by at most this factor: a cut table's work is
# bounded within this factor of its cheapest rate per cell, at about log(rows / min piece rows) / log(ratio)
# probes per table and probed width
ROW_PROBE_RATIO = 1.1


def row_probe_sizes(rows: int, min_rows: int, ratio: float) -> list[int]:
    """Piece sizes to probe for a table of `rows` rows cut into pieces of at least `min_rows` rows:
    r_0 = rows - min_rows (the largest piece of a cut table) > r_1 > ... > r_J = min_rows, each
    ceil(previous / ratio), but at least one row fewer and at least min_rows."""
    if not ratio > 1.0:
        raise ValueError(f"row_probe_ratio: expected > 1, got {ratio}")
    if not 1 <= min_rows <= rows // 2:
        raise ValueError(f"a table of {rows} rows cannot be cut into pieces of at least {min_rows} rows")
    sizes = [rows - min_rows]
    while sizes[-1] > min_rows:
        sizes.append(max(min_rows, min(sizes[-1] - 1, math.ceil(sizes[-1] / ratio))))
    return sizes


def row_splits_of(task: Task, plans: Iterable[Plan]) -> dict[str, int]:
    """table name -> the fewest rows of any row range of it in `plans`, for the tables they cut by rows: the
    `row_splits` under which lower_bound holds for each of these plans (and every plan cutting no finer)."""
    rows = {t.name: t.rows for t in task.tables}
    out: dict[str, int] = {}
    for plan in plans:
        for s in plan.shards:
            r = s.num_rows(rows[s.table])
            if r < rows[s.table]:
                out[s.table] = min(out.get(s.table, r), r)
    return out


def column_splits_in(task: Task, plans: Iterable[Plan]) -> bool:
    """Does any of `plans` hold a column slice (a shard narrower than its table)? The `column_splits`
    under which lower_bound holds for each of them."""
    dims = {t.name: t.dim for t in task.tables}
    return any(s.width < dims[s.table] for plan in plans for s in plan.shards)


# a table's work bound: (multiplier k >= 1, probed single cost c) terms, the bound being min_terms k x (c - o)
WorkTerms = list[tuple[float, float]]


def least_work(terms: WorkTerms, o: float) -> float:
    """The least work (cost beyond the per-operator cost o) a table's shards do together, by its terms."""
    return min(k * (c - o) for k, c in terms)


def work_terms(backend: CostBackend, task: Task, i: int, single: float, column_splits: bool,
               min_piece_rows: int | None, ratio: float) -> tuple[WorkTerms, list[float]]:
    """The probes bounding table i's work in any plan that cuts it as allowed (`single`: its single cost;
    min_piece_rows: None for no row ranges; see the module docstring), and further probes that only
    bound o (a 1-row, 4-column piece: the least work an operator can hold)."""
    t = task.tables[i]
    terms = [(1.0, single)]
    if column_splits:
        # a table's slices do at least dim/4 times the work of its narrowest (4-column) slice
        # or at least the whole table's work, whichever way width changes the work per column
        terms.append((t.dim / 4, backend.compute_cost(task, [Shard(t.name, 0, 0, 4)]).total_ms))
    if min_piece_rows is None:
        return terms, []
    sizes = row_probe_sizes(t.rows, min_piece_rows, ratio)
    brackets = list(zip(sizes, sizes[1:])) or [(sizes[0], sizes[0])]  # (most rows, probed rows)
    for w in sorted({4, t.dim} if column_splits else {t.dim}):
        for upper, r in brackets:
            cost = backend.compute_cost(task, [Shard(t.name, 0, 0, w, 0, r)]).total_ms
            terms.append((t.rows * t.dim / (w * upper), cost))
    return terms, [backend.compute_cost(task, [Shard(t.name, 0, 0, 4, 0, 1)]).total_ms]


def _min_piece_rows(task: Task, row_splits: Mapping[str, int] | None) -> list[int | None]:
    """Per table: the fewest rows a piece of it holds, None where no plan cuts it into row ranges."""
    if row_splits is None:
        return [None] * len(task.tables)
    unknown = sorted(set(row_splits) - {t.name for t in task.tables})
    if unknown:
        raise ValueError(f"row_splits: table(s) {', '.join(map(repr, unknown))} not in task {task.name!r}")
    for name, m in row_splits.items():
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise ValueError(f"row_splits: table {name!r}: the fewest rows of a piece must be an int >= 1, got {m!r}")
    # a table with fewer than 2 x min rows cannot be cut into pieces that large: it stays whole
    return [row_splits[t.name] if t.name in row_splits and t.rows >= 2 * row_splits[t.name] else None
            for t in task.tables]


def fused_all_bound(backend: CostBackend, task: Task, singles: Sequence[float], regime: str) -> float:
    """A lower bound on compute(all tables fused): that cost measured, or, where the backend cannot hold every
    table in one operator (OverBudgetError: the paper profile's 200 tables, 20 GB), the fused cost of the
    costliest tables (by `singles`) it can hold. Adding tables to an operator never makes it cheaper is the
    assumption the per-table term makes already, checked by the fusion probes; where they refuted it
    (NON_MONOTONE) there is no such bound, and the error stands."""
    try:
        return backend.compute_cost(task, whole_shards(task)).total_ms
    except OverBudgetError as exc:
        if regime == NON_MONOTONE:
            raise OverBudgetError(f"task {task.name!r}: the lower bound needs the cost of all its tables fused, "
                                  f"and the probes showed fusion non-monotone, so no subset bounds it: {exc}",
                                  exc.needed_bytes, exc.budget_bytes) from None
        room, held = exc.budget_bytes, []
        for i in sorted(range(len(task.tables)), key=lambda i: -singles[i]):
            t = task.tables[i]
            need = task.memory.shard_bytes(t.rows, t.dim)  # what the measurement allocates: weights, state
            if need <= room:
                held.append(i)
                room -= need
        return backend.compute_cost(task, whole_shards(task, sorted(held))).total_ms


def lower_bound(backend: CostBackend, task: Task, regime: str, column_splits: bool = False,
                row_splits: Mapping[str, int] | None = None,
                row_probe_ratio: float = ROW_PROBE_RATIO) -> LowerBound:
    """Lower bound on the cost of every plan of `task` that cuts tables only as allowed (module docstring):
    `column_splits`: any table into column slices; `row_splits`: table name -> the fewest rows a piece of
    it holds, for the tables a plan may cut into row ranges (None: no table; `row_splits_of` reads it off
    the plans to bound); `row_probe_ratio`: the most by which consecutive probed piece sizes differ."""
    if regime not in REGIMES:
        raise ValueError(f"regime: expected one of {', '.join(REGIMES)}, got {regime!r}")
    n, batch_size, topology = task.num_devices, backend.batch_size, backend.topology
    min_rows = _min_piece_rows(task, row_splits)
    singles = [backend.compute_cost(task, [s]).total_ms for s in whole_shards(task)]
    probed = [work_terms(backend, task, i, c, column_splits, m, row_probe_ratio)
              for i, (c, m) in enumerate(zip(singles, min_rows))]
    terms = [table for table, _ in probed]
    # >= the fixed per-operator cost o: every probe costs o plus the work it holds
    fixed = min(c for table, o_probes in probed for c in [*(c for _, c in table), *o_probes])
    work = np.asarray([least_work(table, fixed) for table in terms])
    speeds = np.asarray(task.speeds(), dtype=np.float64)
    total_speed, fastest = float(speeds.sum()), float(speeds.max())
    conservative = (max(0.0, float(work.sum())) + fixed) / total_speed
    cut = [m is not None for m in min_rows]
    if n == 1 and not column_splits and not any(cut):
        compute_mean = backend.compute_cost(task, whole_shards(task)).total_ms / total_speed  # the only plan there is
    elif regime != SUPER_ADDITIVE:
        # fused(all) / N holds if fusion never costs more than any split, the conservative term if it saves at
        # most the fixed cost per table joined: the smaller holds if either does (probes that showed both
        # behaviours, MIXED, or no assumption at all, EITHER)
        compute_mean = min(fused_all_bound(backend, task, singles, regime) / total_speed, conservative)
    else:
        compute_mean = conservative
    # per table: the transfer of a device holding a shard of it: its full width or, for a table cut
    # into row ranges that may also be column slices (its busiest device then counts), 4 columns
    widths = [4 if c and column_splits else t.dim for t, c in zip(task.tables, cut)]
    if n > 1:
        # the all-to-all model (comm.transfer_ms) with every link at the fastest speed any link has: the mean
        # transfer when the tables' widths spread evenly, and the transfer of a device holding one width alone
        gbps = 1.0 / (_fastest_seconds_per_byte(topology, n, task.host_ids()) * 1e9)
        fast_links = replace(topology, intra_host_gbps=gbps, inter_host_gbps=gbps)
        total_dim = sum(t.dim for t in task.tables)
        transfer_mean = float(transfer_ms([total_dim / n] * n, batch_size, fast_links)[0])
        # the speed-weighted mean (below) of transfers: sum_d s_d x_d >= s_min sum_d x_d
        transfer_mean *= float(speeds.min()) * n / total_speed
        per_table_transfer = [float(transfer_ms([w] + [0] * (n - 1), batch_size, fast_links)[0]) for w in widths]
    else:
        transfer_mean, per_table_transfer = 0.0, [0.0] * len(task.tables)
    per_table = []
    for t, c, single, table, transfer in zip(task.tables, cut, singles, terms, per_table_transfer):
        if c:
            # the device with the largest share of t's work: o + work_t(o) / N, least at o = 0 or o = fixed
            per_table.append(min(least_work(table, 0.0) / n, fixed + least_work(table, fixed) / n) / fastest
                             + 2 * transfer)
        elif not column_splits or t.dim < 8:
            per_table.append(single / fastest + 2 * transfer)  # the device holding t whole
    if regime == NON_MONOTONE:  # a table may cost less beside others than alone: no per-table term
        per_table = []
    max_table = max(per_table, default=0.0)
    total = max(compute_mean + 2 * transfer_mean, max_table)
    return LowerBound(total, compute_mean, transfer_mean, max_table)
