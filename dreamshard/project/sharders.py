"""The sharders, for the stages, benchmarks, experiments and tools: the registry (make_sharder, spec, load_model),
their settings (dreamshard_cut's cut search, NeuroShard's search), the greedy heuristics' keys, re-planning
(dreamshard.sharders). The sharders `evaluate.sharders` names, built from params: project.evaluation. TorchRec's
drop-in planner: project.torchrec."""
from __future__ import annotations

from dreamshard.sharders import Sharder, load_model, make_sharder, spec
from dreamshard.sharders.cuts import CutConfig
from dreamshard.sharders.heuristics import GREEDY_KEYS
from dreamshard.sharders.replan import replan
from dreamshard.sharders.search import SearchConfig

__all__ = ["GREEDY_KEYS", "CutConfig", "SearchConfig", "Sharder", "load_model", "make_sharder", "replan", "spec"]
