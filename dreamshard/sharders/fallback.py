"""A learned sharder's fallback outside its training range: also plan by TorchRec, keep the better plan.

A learned cost model is fitted on the training tables; a task with a table wider, longer or more heavily pooled than
any of them (`FeatureScaler.outside`) asks it to extrapolate. Where everything beyond the range is a feature the
model folds into in-range pieces (`FeatureScaler.folds`: dims), the fold prices it and the learned plan stands.
Where anything beyond is not folded (pooling, rows), the sharder also plans the task with the analytic sharder it
was given (`torchrec_full`: TorchRec's own planner, told the task's cluster; or `torchrec_model`: our search rated
by TorchRec's perf model) and keeps the plan that sharder's perf model rates cheaper (the learned plan on a tie).
On fresh tables the learned models ranked plans of heavier pooling no better than chance and TorchRec's model
chose better; at wider dims the learned plans measured cheaper than the fallback's they would have kept
(results/holdout/fallback-judge). Both models' ratings of both plans are recorded. Inside the range nothing
changes. `Decision` records what happened: a plan file's `made_by` (`fallback`) and the evaluate stage's rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from dreamshard.errors import DreamShardError, InfeasibleTaskError
from dreamshard.plan import Plan
from dreamshard.tasks import Task


class AnalyticSharder(Protocol):
    name: str

    def shard(self, task: Task) -> Plan: ...

    def rating_ms(self, task: Task, plan: Plan) -> float: ...


@dataclass(frozen=True)
class Decision:
    """Why a task was planned as it was: the features beyond the training range (value, training high); whether the
    model folds them all (then no fallback ran); when the fallback ran, each plan's rating by each model and which
    plan was kept ("learned" or "analytic"), or why the analytic sharder found no plan."""

    outside: dict[str, tuple[float, float]]
    analytic: str = ""
    kept: str = "learned"
    folded: bool = False  # every feature beyond the range is folded: the learned plan, no fallback run
    no_plan: str = ""  # why the analytic sharder found no plan (the learned plan kept), e.g. TorchRec's planner's error
    learned_by_own: float | None = None  # the learned plan, rated by the learned model (ms, a model's estimate)
    analytic_by_own: float | None = None  # the analytic plan, by the learned model
    learned_by_analytic: float | None = None  # the learned plan, by the analytic model (the judge)
    analytic_by_analytic: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"outside_training_range": {k: {"value": v, "training_high": hi}
                                                        for k, (v, hi) in self.outside.items()}}
        if self.folded:
            d["folded"] = True
        elif self.no_plan:
            d.update({"planned_also_by": self.analytic, "kept": self.kept, "no_plan": self.no_plan})
        elif self.analytic:
            d.update({"planned_also_by": self.analytic, "kept": self.kept, "ratings_ms": {
                "learned_plan": {"learned_model": self.learned_by_own, "analytic_model": self.learned_by_analytic},
                "analytic_plan": {"learned_model": self.analytic_by_own, "analytic_model": self.analytic_by_analytic},
            }})
        return d


def keep_better(task: Task, plan: Plan, outside: dict[str, tuple[float, float]], own_ms: Any,
                analytic: AnalyticSharder | None, folds: tuple[str, ...] = ()) -> tuple[Plan, Decision | None]:
    """`plan` (the learned sharder's), or `analytic`'s plan of `task` where its own model rates that cheaper, as the
    module docstring says: no decision inside the range; the learned plan where the model folds (`folds`) every
    feature in `outside`. `own_ms`: the learned model's rating, recorded beside."""
    if not outside:
        return plan, None
    if analytic is None:
        return plan, Decision(outside)
    if set(outside) <= set(folds):
        return plan, Decision(outside, folded=True)
    try:
        other = analytic.shard(task)
    except (InfeasibleTaskError, DreamShardError) as exc:  # e.g. TorchRec's planner finds no plan, or a constraint
        return plan, Decision(outside, analytic.name, no_plan=str(exc)[:300])  # it cannot honour: said, not hidden
    a_ana, b_ana = analytic.rating_ms(task, plan), analytic.rating_ms(task, other)
    kept = "analytic" if b_ana < a_ana else "learned"
    return (other if kept == "analytic" else plan), Decision(
        outside, analytic.name, kept, learned_by_own=float(own_ms(task, plan)),
        analytic_by_own=float(own_ms(task, other)), learned_by_analytic=a_ana, analytic_by_analytic=b_ana)
