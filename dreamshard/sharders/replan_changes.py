"""How the tables changed since a previous plan: added, removed, resized. `dreamshard plan --previous` refuses a
previous plan of other tables unless `--allow-new-tables` says the changes are intended (a plan of an unrelated
table set keeps nothing, and would report moving 0 GB)."""
from __future__ import annotations

from collections.abc import Mapping

from dreamshard.plan import Plan
from dreamshard.tasks import Task


def changed_tables(task: Task, previous: Plan, shapes: Mapping[str, tuple[int, int]] | None) -> dict[str, list[str]]:
    """{added, removed, resized}: table names, sorted. `shapes`: the (rows, dim) the previous plan records, if any
    (without them the previous tables are those its shards name, and a resize is not seen)."""
    before = set(shapes) if shapes is not None else {s.table for s in previous.shards}
    now = {t.name: (t.rows, t.dim) for t in task.tables}
    return {"added": sorted(set(now) - before), "removed": sorted(before - set(now)),
            "resized": sorted(n for n in before & set(now) if shapes is not None and shapes[n] != now[n])}


def describe_changes(changes: Mapping[str, list[str]], everyone: bool = False) -> str:
    """'added 2 ('a', 'b'); removed 1 ('c')': the first three names of each, or all with `everyone`."""
    def names(n: list[str]) -> str:
        shown = n if everyone else n[:3]
        return ", ".join(map(repr, shown)) + (", ..." if len(shown) < len(n) else "")

    return "; ".join(f"{what} {len(n)} ({names(n)})" for what, n in changes.items() if n)
