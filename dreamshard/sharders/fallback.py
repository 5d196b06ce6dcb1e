"""A learned sharder's fallback outside its training range: also plan by an analytic model, keep the safer plan.

A learned cost model is fitted on the training tables; a task with a table wider, longer or more heavily pooled than
any of them (`FeatureScaler.outside`) asks it to extrapolate. There the sharder also plans the task with the
analytic sharder it was given (`torchrec_model`: our search rated by TorchRec's perf model) and rates both plans by
both models. Each plan is its own model's optimum, so each model prefers its own: the sharder keeps the plan whose
regret under the other model is smaller (its cost over the other plan's, by the model that did not make it), the
learned plan on a tie. Inside the range nothing changes. `Decision` records what happened: a plan file's `made_by`
(`fallback`) and the evaluate stage's rows carry it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from dreamshard.plan import Plan
from dreamshard.tasks import Task


class AnalyticSharder(Protocol):
    name: str

    def shard(self, task: Task) -> Plan: ...

    def rating_ms(self, task: Task, plan: Plan) -> float: ...


@dataclass(frozen=True)
class Decision:
    """Why a task was planned as it was: the features beyond the training range (value, training high), and when
    the fallback ran, each plan's rating by each model and which plan was kept ("learned" or "analytic")."""

    outside: dict[str, tuple[float, float]]
    analytic: str = ""
    kept: str = "learned"
    learned_by_own: float | None = None  # the learned plan, rated by the learned model (ms, a model's estimate)
    analytic_by_own: float | None = None  # the analytic plan, by the learned model
    learned_by_analytic: float | None = None  # the learned plan, by the analytic model
    analytic_by_analytic: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"outside_training_range": {k: {"value": v, "training_high": hi}
                                                        for k, (v, hi) in self.outside.items()}}
        if self.analytic:
            d.update({"planned_also_by": self.analytic, "kept": self.kept, "ratings_ms": {
                "learned_plan": {"learned_model": self.learned_by_own, "analytic_model": self.learned_by_analytic},
                "analytic_plan": {"learned_model": self.analytic_by_own, "analytic_model": self.analytic_by_analytic},
            }})
        return d


def keep_safer(task: Task, plan: Plan, outside: dict[str, tuple[float, float]], own_ms: Any,
               analytic: AnalyticSharder | None) -> tuple[Plan, Decision | None]:
    """`plan` (the learned sharder's) or `analytic`'s plan of `task`, as the module docstring says; `own_ms` rates a
    plan by the learned model. No decision when the task lies inside the range."""
    if not outside:
        return plan, None
    if analytic is None:
        return plan, Decision(outside)
    other = analytic.shard(task)
    a_own, b_own = float(own_ms(task, plan)), float(own_ms(task, other))
    a_ana, b_ana = analytic.rating_ms(task, plan), analytic.rating_ms(task, other)
    learned_regret = a_ana / b_ana if b_ana > 0 else 1.0  # the learned plan's cost over the other's, by the analytic
    analytic_regret = b_own / a_own if a_own > 0 else 1.0
    kept = "analytic" if analytic_regret < learned_regret else "learned"
    return (other if kept == "analytic" else plan), Decision(outside, analytic.name, kept, a_own, b_own, a_ana, b_ana)
