"""Lower bounds on a task's plan cost, valid for the backend's fusion behaviour.

For a plan with device table sets S_1..S_N, cost = max_d cost_d >= mean_d cost_d, and
cost_d >= compute(S_d) + 2 x transfer_d (the forward all-to-all also waits for the
slowest device, which only adds). So

  cost >= (sum_d compute(S_d)) / N + 2 x mean_d transfer_d.

How sum_d compute(S_d) is bounded depends on how fusing tables changes their cost,
which is measured (`additivity_ratio`: fused cost / sum of single costs on probe sets),
never assumed from the kind of processor:
  super_additive or mixed (large tables compete for cache while small ones still share
    the operator's fixed cost; seen with FBGEMM's CPU kernels on some processors, results/):
    assume fusion saves at most the fixed per-operator cost o per table joined, i.e.
    compute(S) >= o + sum_{t in S} (c(t) - o). o is at most the cheapest table's single
    cost m, so sum_d compute(S_d) >= sum_t c(t) - (T - 1) m.
  sub_additive (compute(A u B) <= compute(A) + compute(B): fusion saves launches and more;
    seen with FBGEMM's CPU kernels on other processors): sum_d compute(S_d) >=
    compute(all tables fused). Probes of single tables cannot prove that for every split,
    so the smaller of this and the first bound is used.
  mixed (probes of both kinds) and either (no assumption on the direction: the evaluate stage's
    choice, so that one bound holds on processors of both kinds): the smaller of the two, which
    holds when either assumption does. Where fusion is super-additive, compute(all fused) / N is
    at least the first bound, so taking the smaller costs nothing there.
    Where all tables do not fit one operator of the backend (its measurement budget), compute(all fused)
    is bounded below by the fused cost of the costliest tables that fit: adding tables never makes an
    operator cheaper, the assumption of the per-table term below (`fused_all_bound`).
  non_monotone (a set of tables measured cheaper fused than its costliest table alone: fused(S) <
    max_t c(t), `fusion_probe(...).monotone` below 1; seen with FBGEMM's CUDA kernels at a small batch,
    where each operator's cost is the host launching its kernels, results/gpu/): the compute term of `either`, without
    the per-table term below, whose assumption (a table's cost does not drop when others join it) the
    probes refuted. `bound_regime` picks it from the probes.
The plain sum of single costs is NOT a bound on super-additive kernels: the evaluate stage's
exhaustive check found small tasks whose optimum lies below it.
Transfers: every device sends its outputs to N-1 others,
so mean_d transfer_d >= latency + (N-1) B D bytes / (N^2 x fastest link), D the task's
total dim. Independently, the device holding table t costs at least c(t) + 2 x
(latency + (N-1)/N B dim_t bytes / fastest link), assuming a table's cost does not drop
when others join it (true in both regimes). When sharders may split tables by columns
(`column_splits`), that holds only for tables too narrow to split (dim 4), and a table's
work in the compute sum is the smaller of its whole work and dim/4 times the work of its
4-column slice: its slices do at least that much, whether wider rows make work per
column cheaper (FBGEMM's vectorised rows) or dearer (cache pressure in the analytic model).

Row ranges (`row_splits`: table name -> m_t, the fewest rows a piece of it holds): each table
named may be cut into row pieces of at least m_t rows, any number of them, on any devices
(several on one device too), each piece also a column slice when `column_splits`; the other
tables keep all their rows in every shard. pieces.py cuts tables too large for a device so
(TorchRec's row-wise blocks), NeuroShard's search any table when its `row_splits` is on;
`row_splits_of(task, plans)` reads the tables and m_t off the plans to be bounded (and
`column_splits_in` whether they hold column slices): the bound then holds for each of them.
Assumed, besides the fusion assumption above with pieces as shards (all hold in the
analytic model, pieces included):
  (R1) a piece's single cost depends on its row count and width, not on which rows or
       columns it holds: a piece gets its rows' share of the lookups, pooling x piece rows /
       rows (pieces.py's rule, the analytic backend's model); the fbgemm backend feeds a
       piece the lookups in its range, which follow that share as far as hot rows are
       scattered over the table (as in the synthetic data);
  (R2) at a given width, a piece with more rows costs at least as much as one with fewer
       (more lookups, more touched rows to update, a larger working set);
  and, at a given row count, work per column monotone in width, as for column slices.
Row pieces break both per-table arguments above. Every piece pays the work of its B x width
(partial) pooled outputs however few its rows, so many small pieces do far more than their
table; but a piece's working set is its rows' share of the table's, so where lookups miss
the cache less in smaller working sets (the analytic sub_additive regime) two row halves do
less work than the whole table. So c(t) is no per-table bound, the whole table's work no
lower bound on its pieces', and work per row is monotone in neither direction.
What (R1), (R2) give: a piece of a cut table t has r rows, m_t <= r <= rows - m_t (the other
rows of its columns are in pieces of at least m_t rows). Probe W(r, w) = c(piece of r rows,
w columns) - o at r_0 = rows - m_t > r_1 > ... > r_J = m_t (each r_(j+1) = ceil(r_j / ratio),
`row_probe_ratio`, but at least one row fewer and at least m_t) and w = dim_t (and 4 with
`column_splits`). A piece of r_(j+1) <= r <= r_j rows does at least W(r_(j+1), .) (R2) over at
most r_j rows, so every cell of every piece of t does work at least
  rate_t = min_j min_w W(r_(j+1), w) / (w x r_j),
a shard with all rows at least the whole-table or column-slice rate above, and t's shards
together at least rows x dim x (the least of these rates): within a factor `row_probe_ratio`
(r / (r - 1) below 1 / (ratio - 1) rows, where one row fewer is the larger step) of the
cheapest rate any piece size can reach. A table's work in the compute sum is the
smallest of its whole work, its column-slice term and these rates times its cells. Each
term is k x (probed cost - o) with k >= 1, so o + sum_t work_t falls as o grows, and
o <= fixed (the cheapest probe taken, including a 1-row, 4-column piece of each cut table:
the least an operator can hold) gives sum_d compute(S_d) >= fixed + sum_t work_t(fixed).
Why m_t matters: fixed may exceed o by a piece's own output work, so a probe barely above
fixed cannot be told from a free one. With m_t = 1 the bound is still proven but weak
(4 tables on 2 devices, halves allowed: optimum / bound 1.1-1.3 with m_t = 1 and rows
only, 2-12 with column slices too, against 1.02-1.2 with m_t = rows / 2, the real halves).
The per-table term: the device holding the largest share of a cut table t's work holds at
least 1/N of it, so costs at least o + work_t(o) / N, plus twice the transfer of one piece
of t (width dim_t, or 4 with `column_splits`): a row piece sends its partial sums, B/N x
width to each other device, as comm.py models row-wise shards. o + work_t(o) / N is concave
in o (a minimum of lines), so over 0 <= o <= fixed it is least at o = 0 or o = fixed: the
smaller is used. The mean transfer bound still holds: row pieces only add to the devices'
dim sums. The one-device shortcut (the fused cost of all tables is the only plan's) does
not hold once a table may be cut, so it is then not used. Not covered: row pieces of fewer
than m_t rows, and row ranges of tables not named in `row_splits`.
Cost: J (about log(rows / m_t - 1) / log(ratio), at least 1) probes per cut table and width,
plus its 1-row probe: with ratio 1.1, 1 for halves, 74 for pieces of at least 1000 of 1M rows.

Devices of different speed (Device.speed s_d: device d computes in reference cost / s_d; the
backends' compute_cost is the reference device's). Everything above bounds reference compute.
The maximum over devices is at least any weighted mean, here the speed-weighted one:
  cost >= sum_d s_d cost_d / S >= (sum_d compute_ref(S_d) + 2 sum_d s_d transfer_d) / S,  S = sum_d s_d,
so the compute part is the reference work bound over the total speed S instead of N (speed-weighted
work over total speed), and the transfer part is the mean transfer bound times s_min N / S (since
sum_d s_d x_d >= s_min sum_d x_d). A per-table term divides the table's compute by the fastest
speed: the device holding it is at most that fast. With equal speeds of 1 every term is the
uniform one. Hosts named by the devices (Task.host_ids) choose the fastest link: intra-host when
all devices share one host, else the faster of the two bandwidths.
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
