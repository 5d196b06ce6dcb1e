"""What a written plan records of what made it: the tool's version, the sharder, the checkpoint (path, sha256,
kind, the algorithm it was trained for) and where the access-count bins came from, so that a plan can be traced
to the model and the statistics behind it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from dreamshard.io import file_digest
from dreamshard.tasks import Task


def tool_version() -> str:
    """The installed package's version; said plainly when it is not installed (run from a checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dreamshard")
    except PackageNotFoundError:
        return "unknown (dreamshard not installed as a package)"


def file_sha256(path: str | Path) -> str:
    return file_digest(path, "sha256")


def model_record(algo: str, path: str | Path, model: Any) -> dict[str, Any]:
    """The checkpoint a plan was made with: its path, sha256, checkpoint kind and the algorithm it was trained for."""
    from dreamshard.sharders import CHECKPOINT_KINDS, spec

    meta = getattr(model, "meta", None)
    return {"path": str(path), "sha256": file_sha256(path), "kind": CHECKPOINT_KINDS[spec(algo).kind],
            "algorithm": meta.get("algorithm") if isinstance(meta, dict) else None}


def bins_record(algo: str, task: Task, sharder: Any) -> dict[str, Any]:
    """Where the bins the sharder read came from: the tables file, estimated (the sharder's BinEstimator), both,
    or none read (sharders without a model read no bins)."""
    from dreamshard.sharders import spec

    in_file = sum(t.bins is not None for t in task.tables)
    estimator = getattr(sharder, "bins", None)
    reads = spec(algo).needs_model
    estimated = len(task.tables) - in_file if reads and estimator is not None else 0
    if not reads:
        source = "not read by the sharder"
    else:
        source = "estimated" if estimated and not in_file else "tables file and estimated" if estimated \
            else "tables file"
    record: dict[str, Any] = {"source": source, "in_file": in_file, "estimated": estimated}
    if estimated and estimator is not None:
        record["estimator"] = {"zipf_exponent": estimator.zipf_exponent, "fitted_on": estimator.fitted_on}
    return record


def provenance(algo: str, model_path: str | Path | None, model: Any, task: Task, sharder: Any) -> dict[str, Any]:
    """The `made_by` record of a plan file."""
    record = {"tool": "dreamshard", "version": tool_version(), "sharder": algo,
              "model": None if model_path is None else model_record(algo, model_path, model),
              "bins": bins_record(algo, task, sharder)}
    decision = getattr(sharder, "last_decision", None)  # a learned sharder's task beyond its training range
    if decision is not None:
        record["fallback"] = decision.to_dict()
    return record
