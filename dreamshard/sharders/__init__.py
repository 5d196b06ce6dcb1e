"""Sharders turn a task into a plan. `make_sharder(name)` builds one by its registered name."""
from __future__ import annotations

from typing import Any, Callable, Protocol

from dreamshard.plan import Plan
from dreamshard.sharders.heuristics import (
    GreedySharder,
    RandomSharder,
    dim_key,
    lookup_key,
    size_key,
    size_lookup_key,
)
from dreamshard.tasks import Task


class Sharder(Protocol):
    name: str

    def shard(self, task: Task) -> Plan: ...


def _greedy(name, key):
    return lambda **_: GreedySharder(name, key)


def _learned(name):
    def factory(model=None, samples: int = 0, seed: int = 0, **_) -> Sharder:
        from dreamshard.sharders.learned import LearnedModel, PolicySharder  # imports torch

        if model is None:
            raise ValueError(f"sharder {name!r} needs a trained model checkpoint (--model PATH)")
        loaded = model if isinstance(model, LearnedModel) else LearnedModel.load(model)
        return PolicySharder(name, loaded, samples, seed)

    return factory


def _neuroshard(model=None, search=None, **_) -> Sharder:
    from dreamshard.neuroshard import NeuroShardModel  # imports torch
    from dreamshard.sharders.search import NeuroShardSharder, SearchConfig

    if model is None:
        raise ValueError("sharder 'neuroshard' needs its pre-trained cost models (--model PATH)")
    loaded = model if isinstance(model, NeuroShardModel) else NeuroShardModel.load(model)
    config = search if isinstance(search, SearchConfig) else SearchConfig(**(search or {}))
    return NeuroShardSharder(loaded, config)


def _torchrec(name, full_search):
    def factory(batch_size: int = 2048, sharding_types=None, **_) -> Sharder:
        from dreamshard.sharders.torchrec_planner import make  # imports torchrec only when planning

        return make(name, full_search, batch_size, sharding_types)

    return factory


# name -> factory taking keyword options (seed, model paths, ...) it may ignore
SHARDERS: dict[str, Callable[..., Sharder]] = {
    "random": lambda seed=0, **_: RandomSharder(seed),
    "size_greedy": _greedy("size_greedy", size_key),
    "dim_greedy": _greedy("dim_greedy", dim_key),
    "lookup_greedy": _greedy("lookup_greedy", lookup_key),
    "size_lookup_greedy": _greedy("size_lookup_greedy", size_lookup_key),
    "dreamshard": _learned("dreamshard"),
    "autoshard": _learned("autoshard"),
    "neuroshard": _neuroshard,
    "torchrec": _torchrec("torchrec", full_search=False),  # TorchRec's planner, table-wise (needs torchrec)
    "torchrec_full": _torchrec("torchrec_full", full_search=True),  # all its sharding types; may raise
}

HEURISTICS = ("random", "size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")
LEARNED = ("dreamshard", "autoshard", "neuroshard")  # need model=PATH
SPLITTING = ("neuroshard", "torchrec_full")  # may split tables by columns
TORCHREC = ("torchrec", "torchrec_full")  # TorchRec's planner: greedy, may give up on feasible tasks


def make_sharder(name: str, **options: Any) -> Sharder:
    try:
        factory = SHARDERS[name]
    except KeyError:
        raise ValueError(f"unknown sharder {name!r}; available: {', '.join(SHARDERS)}") from None
    return factory(**options)
