"""A resumable evaluation: each task's result rows journaled as soon as they are measured.

One Parquet file per evaluated task, named by a hash of everything that decides its rows (the evaluation's
fingerprint, the split, the task), so a rerun evaluates only the tasks not yet journaled and never reuses
stale rows; a crash loses one task's measurements. Design: docs/pipeline.md.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from dreamshard import io
from dreamshard.errors import DataFormatError
from dreamshard.io import write_parquet, write_text
from dreamshard.tasks import Task


def task_fingerprint(task: Task) -> list[Any]:
    """What identifies a task's content: name, tables (all statistics), devices, memory model, constraints."""
    return [task.name, task.family,
            [(t.name, t.rows, t.dim, t.pooling_factor, list(t.bins) if t.bins is not None else None)
             for t in task.tables],
            [(d.memory_bytes, d.kind, d.speed, d.host) for d in task.devices],
            [task.memory.weights_precision, task.memory.optimizer], list(task.sharding),
            [list(p) for p in task.pins], [[t, list(d)] for t, d in task.avoid], [list(g) for g in task.groups],
            list(task.whole)]


def file_digest(path: str | Path) -> str:
    """sha1 of a file's bytes (a model checkpoint in an evaluation's fingerprint)."""
    return io.file_digest(path, "sha1")


class EvalJournal:
    """Per-task result rows of one evaluation, one file each, under `folder`."""

    def __init__(self, folder: str | Path, fingerprint: str) -> None:
        self.folder = Path(folder)
        self.fingerprint = fingerprint

    def key(self, split: str, task: Task) -> str:
        text = json.dumps([self.fingerprint, split, task_fingerprint(task)], sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:20]

    def path(self, split: str, task: Task) -> Path:
        return self.folder / f"task-{self.key(split, task)}.parquet"

    def has(self, split: str, task: Task) -> bool:
        return self.path(split, task).exists()

    def read(self, split: str, task: Task) -> list[dict]:
        path = self.path(split, task)
        try:
            return pd.read_parquet(path).to_dict("records")
        except Exception as exc:  # a file that is there was written whole (atomic): unreadable means damaged
            raise DataFormatError(f"{path}: journaled rows of task {task.name!r} cannot be read ({exc}); "
                                  "delete the file to measure that task again") from exc

    def write(self, split: str, task: Task, rows: Sequence[dict]) -> None:
        if not rows:
            raise ValueError(f"task {task.name!r}: no rows to journal")
        write_parquet(pa.Table.from_pylist(list(rows)), self.path(split, task))

    def once_path(self, name: str) -> Path:
        key = hashlib.sha1(json.dumps([self.fingerprint, name]).encode()).hexdigest()[:20]
        return self.folder / f"{name}-{key}.json"

    def once(self, name: str, compute: Callable[[], Any]) -> Any:
        """A JSON-able value measured once per evaluation (fingerprint): read if journaled, else computed and
        journaled."""
        value = self.peek(name)
        if value is None:
            value = compute()
            write_text(json.dumps(value), self.once_path(name))
        return value

    def peek(self, name: str) -> Any:
        """`once`'s value if journaled, else None (nothing measured): for a reader of a run under way."""
        path = self.once_path(name)
        return json.loads(path.read_text()) if path.exists() else None

    def journaled_count(self, items: Sequence[tuple[str, Task]]) -> int:
        return sum(self.has(split, task) for split, task in items)

    def run(self, items: Sequence[tuple[str, Task]], evaluate: Callable[[str, Task], list[dict]],
            on_task: Callable[[str, Task, bool], None] | None = None) -> list[dict]:
        """Rows of every (split, task) in order: journaled ones read, the others evaluated and journaled at once.
        `on_task(split, task, from_journal)` after each (progress)."""
        rows: list[dict] = []
        for split, task in items:
            if self.has(split, task):
                mine = self.read(split, task)
                reused = True
            else:
                mine = evaluate(split, task)
                self.write(split, task, mine)
                reused = False
            rows += mine
            if on_task:
                on_task(split, task, reused)
        return rows
