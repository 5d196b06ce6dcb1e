"""The tiny project the stage-level tests start from, built once per test session, level by level.

Each level is a folder of its own holding `params.yaml` (helpers.tiny_params, every path under the folder) and
the outputs of the stages up to that level; a level is built from a copy of the level below:

    processed  download, process                      data/raw, data/tables.parquet, data/requests.parquet
    tasks      + tasks                                data/tasks
    costed     + collect, collect_devices, train_cost data/costs, data/single_devices, models/cost_net.pt, metrics
    trained    + train_policy                         models/dreamshard.pt

A level's files are read-only (its folders too): a test that runs a stage on it or changes a file works on a
copy (Level.copy_to). Tests of a stage's own behaviour on special input build that input themselves.
"""
from __future__ import annotations

import copy
import importlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from helpers import tiny_params

# level -> (the level below, the stages that make it from there)
LEVELS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "processed": (None, ("download", "process")),
    "tasks": ("processed", ("tasks",)),
    "costed": ("tasks", ("collect", "collect_devices", "train_cost")),
    "trained": ("costed", ("train_policy",)),
}


@dataclass(frozen=True)
class Level:
    name: str
    root: Path

    @property
    def params(self) -> dict:
        """The level's params (a fresh copy each time: change it freely)."""
        return copy.deepcopy(_params_of(self.root))

    def tasks(self, split: str = "train") -> list:
        """The level's tasks of `split` (`train` or `test`)."""
        from dreamshard.tasks import read_tasks

        p = self.params["paths"]
        return read_tasks(Path(p["tasks"]) / f"{split}.parquet", p["tables"])

    def copy_to(self, dest: Path, params: dict | None = None) -> dict:
        """The level's outputs copied, writable, into `dest` (params.yaml not written: a test writes its own);
        returns `params` (default: the level's) with every path moved from the level's folder to `dest`."""
        _copy_writable(self.root, dest, skip=self.root / "params.yaml")
        p = copy.deepcopy(params) if params is not None else self.params
        p["paths"] = {k: str(dest / Path(v).relative_to(self.root)) if Path(v).is_absolute() else v
                      for k, v in p["paths"].items()}
        return p


_PARAMS: dict[Path, dict] = {}


def _params_of(root: Path) -> dict:
    if root not in _PARAMS:
        _PARAMS[root] = yaml.safe_load((root / "params.yaml").read_text())
    return _PARAMS[root]


def _copy_writable(src: Path, dest: Path, skip: Path | None = None) -> None:
    """src's tree (but `skip`) into dest (which may exist), files and folders writable whatever src's modes."""
    for folder, _dirs, files in os.walk(src):
        target = dest / Path(folder).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            if Path(folder) / f != skip:
                shutil.copyfile(Path(folder) / f, target / f)


def _read_only(root: Path) -> None:
    for folder, _dirs, files in os.walk(root):
        for f in files:
            os.chmod(Path(folder) / f, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    for folder, _dirs, _files in sorted(os.walk(root), key=lambda w: -len(Path(w[0]).parts)):
        os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)


class TinyProject:
    """tiny_project(LEVEL) -> Level: built on first use in this session, from the level below."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._factory = tmp_path_factory
        self._built: dict[str, Level] = {}

    def __call__(self, level: str) -> Level:
        if level not in LEVELS:
            raise KeyError(f"tiny project: no level {level!r} (levels: {', '.join(LEVELS)})")
        if level not in self._built:
            below, stages = LEVELS[level]
            root = self._factory.mktemp(f"tiny-{level}")
            if below is not None:
                _copy_writable(self(below).root, root)
            params = tiny_params(root)
            (root / "params.yaml").write_text(yaml.safe_dump(params))
            for stage in stages:
                importlib.import_module(f"stages.{stage}").run(copy.deepcopy(params))
            _read_only(root)
            self._built[level] = Level(level, root)
        return self._built[level]
