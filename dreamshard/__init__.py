"""DreamShard: embedding table placement for recommender models.

The names below are imported on first use (PEP 562), so `import dreamshard.tables`
does not load the sharders, the learned models or the kernels.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DataFormatError": "dreamshard.errors", "DreamShardError": "dreamshard.errors",
    "InfeasibleTaskError": "dreamshard.errors", "InvalidPlanError": "dreamshard.errors",
    "MemoryModel": "dreamshard.memory",
    "Plan": "dreamshard.plan", "Shard": "dreamshard.plan", "validate_plan": "dreamshard.plan",
    "SHARDERS": "dreamshard.sharders", "make_sharder": "dreamshard.sharders",
    "Table": "dreamshard.tables",
    "Device": "dreamshard.tasks", "Task": "dreamshard.tasks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dreamshard' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
