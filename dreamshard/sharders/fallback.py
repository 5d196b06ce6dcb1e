"""A learned sharder's fallback outside its training range: also plan by an analytic model, keep the better plan.

A learned cost model is fitted on the training tables; a task with a table wider, longer or more heavily pooled than
any of them (`FeatureScaler.outside`) asks it to extrapolate. There the sharder also plans the task with the
analytic sharder it was given (`torchrec_model`: our search rated by TorchRec's perf model) and keeps the plan its
own model rates cheaper (the learned plan on a tie); both models' ratings of both plans are recorded. Its own model
judges because on the evaluated plans it ranks them better than TorchRec's, beyond the range too, and a rule that
trusted TorchRec's model there (the plan with the smaller regret under the other model) measured worse: both in
results/holdout. Inside the range nothing changes. `Decision` records what happened: a plan file's `made_by`
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


def keep_better(task: Task, plan: Plan, outside: dict[str, tuple[float, float]], own_ms: Any,
               analytic: AnalyticSharder | None) -> tuple[Plan, Decision | None]:
    """`plan` (the learned sharder's) or `analytic`'s plan of `task`, whichever `own_ms` (the learned model) rates
    cheaper, as the module docstring says. No decision when the task lies inside the range."""
    if not outside:
        return plan, None
    if analytic is None:
        return plan, Decision(outside)
    other = analytic.shard(task)
    a_own, b_own = float(own_ms(task, plan)), float(own_ms(task, other))
    a_ana, b_ana = analytic.rating_ms(task, plan), analytic.rating_ms(task, other)
    kept = "analytic" if b_own < a_own else "learned"
    return (other if kept == "analytic" else plan), Decision(outside, analytic.name, kept, a_own, b_own, a_ana, b_ana)
