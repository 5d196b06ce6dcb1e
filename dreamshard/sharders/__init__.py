"""Sharders turn a task into a plan. One typed record per sharder; `make_sharder(name, ...)` builds one.

Each record says what the sharder is (`kind`), whether it needs a trained model, whether
it may split tables, and which options its factory takes. An option it does not take is
an error naming it, never ignored. A model is always an object: `load_model(name, path)`
reads the checkpoint of a sharder that needs one.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dreamshard.errors import DataFormatError
from dreamshard.plan import Plan
from dreamshard.sharders.heuristics import GREEDY_KEYS, GreedySharder, RandomSharder
from dreamshard.tasks import Task


class Sharder(Protocol):
    @property
    def name(self) -> str: ...

    def shard(self, task: Task) -> Plan: ...


KINDS = ("heuristic", "policy", "rnn", "search", "torchrec", "torchrec_search")


@dataclass(frozen=True)
class SharderSpec:
    name: str
    # heuristic | policy (DreamShard, AutoShard) | rnn (the RNN baseline) | search (NeuroShard) | torchrec (TorchRec's
    # planners) | torchrec_search (our search rated by TorchRec's perf model): what it loads, if anything
    kind: str
    factory: Callable[..., Sharder]
    options: tuple[str, ...]  # keyword options the factory takes
    needs_model: bool = False  # `model` is required: an object from load_model(name, path)
    splits_tables: bool = False  # may place column slices of a table on several devices
    checkpoint_of: str = ""  # the algorithm whose checkpoint it plans with ("": its own)
    doc: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"sharder {self.name!r}: kind {self.kind!r} not one of {KINDS}")
        if self.needs_model and "model" not in self.options:
            raise ValueError(f"sharder {self.name!r} needs a model but takes no 'model' option")

    @property
    def trained_as(self) -> str:
        """The algorithm its checkpoint is trained for (the `algorithm` of the checkpoint's metadata)."""
        return self.checkpoint_of or self.name

    def taken_from(self, offered: dict[str, Any]) -> dict[str, Any]:
        """The options of `offered` this sharder takes: for callers that offer every sharder the same
        settings (a seed, a batch size) on purpose. make_sharder itself refuses what it does not take."""
        return {k: v for k, v in offered.items() if k in self.options}


def _greedy(name: str) -> Callable[[], Sharder]:
    def factory() -> Sharder:
        return GreedySharder(name, GREEDY_KEYS[name])

    return factory


def _random(seed: int = 0) -> Sharder:
    return RandomSharder(seed)


def _policy(name: str) -> Callable[..., Sharder]:
    def factory(model: Any, samples: int = 0, seed: int = 0, rivals: tuple[str, ...] = ()) -> Sharder:
        from dreamshard.learning.policy import LearnedModel  # imports torch
        from dreamshard.sharders.learned import PolicySharder

        if not isinstance(model, LearnedModel):
            raise TypeError(f"sharder {name!r}: model must be a LearnedModel (load_model({name!r}, path)), "
                            f"got {type(model).__name__}")
        unknown = sorted(set(rivals) - set(GREEDY_KEYS))
        if isinstance(rivals, str) or unknown:
            raise ValueError(f"sharder {name!r}: rivals: expected greedy heuristics among {', '.join(GREEDY_KEYS)}, "
                             f"got {rivals!r}")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise ValueError(f"sharder {name!r}: samples: expected an integer >= 0, got {samples!r}")
        return PolicySharder(name, model, samples, seed, tuple(rivals))

    return factory


def _checked_fallback(name: str, fallback: Any) -> Any:
    """A learned sharder's analytic fallback (sharders/fallback.py): a sharder that also rates plans (rating_ms)."""
    if fallback is not None and not (callable(getattr(fallback, "shard", None))
                                     and callable(getattr(fallback, "rating_ms", None))):
        raise TypeError(f"sharder {name!r}: fallback must be a sharder that rates plans, as TorchRec's planners do "
                        f"(shard and rating_ms), got {type(fallback).__name__}")
    return fallback


def _dreamshard_cut(model: Any, cuts: Any = None, fallback: Any = None) -> Sharder:
    from dreamshard.learning.policy import LearnedModel  # imports torch
    from dreamshard.sharders.cuts import CutConfig, CutSearchSharder

    if not isinstance(model, LearnedModel):
        raise TypeError("sharder 'dreamshard_cut': model must be a LearnedModel (load_model('dreamshard_cut', path)), "
                        f"got {type(model).__name__}")
    if cuts is not None and not isinstance(cuts, CutConfig):
        raise TypeError(f"sharder 'dreamshard_cut': cuts must be a CutConfig, got {type(cuts).__name__}")
    return CutSearchSharder("dreamshard_cut", model, cuts or CutConfig(),
                            fallback=_checked_fallback("dreamshard_cut", fallback))


def _rnn(model: Any) -> Sharder:
    from dreamshard.learning.rnn import RnnModel  # imports torch
    from dreamshard.sharders.rnn import RnnSharder

    if not isinstance(model, RnnModel):
        raise TypeError(f"sharder 'rnn': model must be an RnnModel (load_model('rnn', path)), got {type(model).__name__}")
    return RnnSharder(model)


def _neuroshard(name: str, table_wise: bool) -> Callable[..., Sharder]:
    def factory(model: Any, search: Any = None, fallback: Any = None) -> Sharder:
        from dataclasses import replace

        from dreamshard.learning.neuroshard import NeuroShardModel  # imports torch
        from dreamshard.sharders.search import NeuroShardSharder, SearchConfig

        if not isinstance(model, NeuroShardModel):
            raise TypeError(f"sharder {name!r}: model must be a NeuroShardModel (load_model({name!r}, path)), "
                            f"got {type(model).__name__}")
        if search is not None and not isinstance(search, SearchConfig):
            raise TypeError(f"sharder {name!r}: search must be a SearchConfig, got {type(search).__name__}")
        config = search or SearchConfig()
        if table_wise:  # the greedy grid search alone: no moves, so no column or row cuts
            config = replace(config, depth=0, row_splits=False)
        return NeuroShardSharder(model, config, name=name, fallback=_checked_fallback(name, fallback))

    return factory


def _torchrec_model(batch_size: int | None = None, time_limit: float | None = None, links: Any = None,
                    hbm_gbps: float | None = None, torchrec_topology: Any = None) -> Sharder:
    from dreamshard.sharders.torchrec_model import TorchRecModelSharder  # imports torchrec only when planning

    return TorchRecModelSharder(batch_size, time_limit=time_limit, links=links, hbm_gbps=hbm_gbps,
                                torchrec_topology=torchrec_topology)


def _torchrec(name: str, full_search: bool, narrowest: bool = False) -> Callable[..., Sharder]:
    """`narrowest`: TorchRec's column-wise blocks may be as narrow as our cuts' slices (min_partition always on)."""
    def factory(batch_size: int | None = None, sharding_types: tuple[str, ...] | None = None,
                time_limit: float | None = None, links: Any = None, hbm_gbps: float | None = None,
                min_partition: bool = False, torchrec_topology: Any = None) -> Sharder:
        from dreamshard.sharders.torchrec_planner import make  # imports torchrec only when planning

        return make(name, full_search, batch_size, sharding_types, time_limit, links, hbm_gbps,
                    min_partition or narrowest, torchrec_topology=torchrec_topology)

    return factory


def _torchrec_calibrated(calibration: Any = None, batch_size: int | None = None,
                         time_limit: float | None = None, links: Any = None, hbm_gbps: float | None = None) -> Sharder:
    from dreamshard.interop.calibration import PerfCalibration
    from dreamshard.sharders.torchrec_planner import make  # imports torchrec only when planning

    if calibration is None:
        raise ValueError("sharder 'torchrec_calibrated' needs a calibration fitted to measured devices "
                         "(interop.calibration.fit_calibration; the evaluate stage fits it to the collected rows)")
    if not isinstance(calibration, PerfCalibration):
        raise TypeError(f"sharder 'torchrec_calibrated': calibration must be a PerfCalibration "
                        f"(interop.calibration.fit_calibration), got {type(calibration).__name__}")
    return make("torchrec_calibrated", True, batch_size, None, time_limit, links, hbm_gbps, calibration=calibration)


_SPECS = (
    SharderSpec("random", "heuristic", _random, ("seed",), doc="each table onto a random device with room"),
    SharderSpec("size_greedy", "heuristic", _greedy("size_greedy"), (), doc="greedy, key = table bytes"),
    SharderSpec("dim_greedy", "heuristic", _greedy("dim_greedy"), (), doc="greedy, key = dim"),
    SharderSpec("lookup_greedy", "heuristic", _greedy("lookup_greedy"), (),
                doc="greedy, key = dim x pooling factor"),
    SharderSpec("size_lookup_greedy", "heuristic", _greedy("size_lookup_greedy"), (),
                doc="greedy, key = dim x pooling factor x log10(rows)"),
    SharderSpec("dreamshard", "policy", _policy("dreamshard"), ("model", "samples", "seed", "rivals"), needs_model=True,
                doc="policy trained on the estimated MDP"),
    SharderSpec("dreamshard_cut", "policy", _dreamshard_cut, ("model", "cuts", "fallback"), needs_model=True,
                splits_tables=True, checkpoint_of="dreamshard",
                doc="DreamShard's policy and cost network, searching which tables to cut into "
                                        "column slices (sharders/cuts.py); the dreamshard checkpoint"),
    SharderSpec("autoshard", "policy", _policy("autoshard"), ("model", "samples", "seed", "rivals"), needs_model=True,
                doc="policy trained on real measurements"),
    SharderSpec("rnn", "rnn", _rnn, ("model",), needs_model=True,
                doc="the RNN baseline: an LSTM over the tables in order, trained on real measurements"),
    SharderSpec("neuroshard", "search", _neuroshard("neuroshard", False), ("model", "search", "fallback"),
                needs_model=True,
                splits_tables=True, doc="beam search over column splits with pre-trained cost models"),
    SharderSpec("neuroshard_tw", "search", _neuroshard("neuroshard_tw", True), ("model", "search"), needs_model=True,
                doc="NeuroShard table-wise: its greedy grid search on whole tables (the peer of the table-wise "
                    "learned sharders), the neuroshard model"),
    SharderSpec("torchrec_model", "torchrec_search", _torchrec_model,
                ("batch_size", "time_limit", "links", "hbm_gbps", "torchrec_topology"), splits_tables=True,
                doc="no trained model: our search over cuts and placements rated by TorchRec's perf model "
                    "(sharders/torchrec_model.py; needs TorchRec)"),
    SharderSpec("torchrec", "torchrec", _torchrec("torchrec", False),
                ("batch_size", "time_limit", "links", "hbm_gbps", "torchrec_topology"),
                doc="TorchRec's planner, table-wise (greedy: may give up on feasible tasks)"),
    SharderSpec("torchrec_full", "torchrec", _torchrec("torchrec_full", True),
                ("batch_size", "sharding_types", "time_limit", "links", "hbm_gbps", "min_partition",
                 "torchrec_topology"), splits_tables=True, doc="TorchRec's planner with all its sharding types; may raise"),
    SharderSpec("torchrec_full_min", "torchrec", _torchrec("torchrec_full_min", True, narrowest=True),
                ("batch_size", "sharding_types", "time_limit", "links", "hbm_gbps"), splits_tables=True,
                doc="torchrec_full told min_partition = each table's narrowest slice our cuts may make (TorchRec's "
                    "default, 128 columns, forbids every column cut of a narrower table)"),
    SharderSpec("torchrec_calibrated", "torchrec", _torchrec_calibrated,
                ("calibration", "batch_size", "time_limit", "links", "hbm_gbps"), splits_tables=True,
                doc="torchrec_full with TorchRec's perf model's compute fitted to the collected measurements "
                    "(interop/calibration.py)"),
)
SHARDERS: dict[str, SharderSpec] = {s.name: s for s in _SPECS}
DEFAULT_LEARNED = "dreamshard_cut"  # what `dreamshard plan` and DreamShardPlanner use when given a model
DEFAULT_HEURISTIC = "size_lookup_greedy"  # and `dreamshard plan` without one
DEFAULT_WITH_TORCHREC = "torchrec_model"  # and DreamShardPlanner without one: TorchRec is there
# what dreamshard_cut and neuroshard also plan a task beyond their training range by, in `dreamshard plan` and
# DreamShardPlanner (evaluate: params evaluate.fallback): TorchRec's own planner (sharders/fallback.py)
FALLBACK = "torchrec_full"


def default_algo(has_model: bool, torchrec: bool = False) -> str:
    """The sharder `dreamshard plan` and DreamShardPlanner use when none is named: our best learned one with a
    model (a dreamshard checkpoint); without one, the search rated by TorchRec's perf model where TorchRec is
    at hand (`torchrec`: DreamShardPlanner), else the best heuristic."""
    if has_model:
        return DEFAULT_LEARNED
    return DEFAULT_WITH_TORCHREC if torchrec else DEFAULT_HEURISTIC


HEURISTICS = tuple(n for n, s in SHARDERS.items() if s.kind == "heuristic")
LEARNED = tuple(n for n, s in SHARDERS.items() if s.needs_model)


def spec(name: str) -> SharderSpec:
    try:
        return SHARDERS[name]
    except KeyError:
        raise ValueError(f"unknown sharder {name!r}; available: {', '.join(SHARDERS)}") from None


def make_sharder(name: str, **options: Any) -> Sharder:
    """The sharder `name` built with `options`; an option it does not take is an error."""
    s = spec(name)
    unknown = sorted(set(options) - set(s.options))
    if unknown:
        takes = ", ".join(s.options) or "no options"
        raise ValueError(f"sharder {name!r}: unknown option(s) {', '.join(unknown)}; it takes {takes}")
    if s.needs_model and options.get("model") is None:
        raise ValueError(f"sharder {name!r} needs a trained model (--model PATH)")
    return s.factory(**options)


CHECKPOINT_KINDS = {"policy": "policy", "rnn": "rnn", "search": "neuroshard"}  # sharder kind -> checkpoint kind


def trained_compute_device(meta: Any) -> str | None:
    """The compute device ("cpu" or "cuda") whose kernel timings a checkpoint was trained on, from the device its
    metadata records (learner_meta: "cpu: <model> ..." for FBGEMM's CPU kernels, the GPU's name for CUDA); None
    for a model of no device (the analytic backend) or one that records none."""
    if not isinstance(meta, dict) or not meta.get("device"):
        return None
    device = str(meta["device"])
    if device.startswith("cpu"):
        return "cpu"
    return "cuda" if meta.get("backend") == "fbgemm" else None


def load_model(name: str, path: str | Path) -> Any:
    """The trained model sharder `name` needs, read from its checkpoint. A checkpoint trained for another
    algorithm (its metadata's `algorithm`) is refused: DreamShard and AutoShard checkpoints hold the same networks,
    and a plan would otherwise be labelled with the wrong one."""
    s = spec(name)
    if s.kind == "policy":
        from dreamshard.learning.policy import LearnedModel

        model: Any = LearnedModel.load(path)
    elif s.kind == "rnn":
        from dreamshard.learning.rnn import RnnModel

        model = RnnModel.load(path)
    elif s.kind == "search":
        from dreamshard.learning.neuroshard import NeuroShardModel

        model = NeuroShardModel.load(path)
    else:
        raise ValueError(f"sharder {name!r} uses no trained model")
    trained = model.meta.get("algorithm") if isinstance(model.meta, dict) else None
    family = [n for n, o in SHARDERS.items() if o.kind == s.kind]
    want = s.trained_as
    if s.kind == "policy" and trained is None:
        raise DataFormatError(f"{path}: the checkpoint records no algorithm it was trained for (metadata "
                              f"'algorithm'); expected a {want!r} checkpoint: give the one training wrote for {want}")
    if trained is not None and trained not in ([want] if s.kind == "policy" else family):
        users = [n for n, o in SHARDERS.items() if o.kind == s.kind and o.trained_as == trained]
        raise DataFormatError(f"{path}: a checkpoint trained for {trained!r}, but sharder {name!r} needs one trained for "
                              f"{want!r}; give the {want} checkpoint, or plan with --algo {' or '.join(users) or trained}")
    return model
