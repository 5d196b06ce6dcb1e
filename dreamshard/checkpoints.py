"""Model checkpoints: plain dicts of tensors and lists saved by torch, loaded with weights_only."""
from __future__ import annotations

from pathlib import Path

import torch

from dreamshard.errors import DataFormatError
from dreamshard.io import atomic_path


def save_checkpoint(state: dict, fmt: str, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        torch.save({"format": fmt, **state}, tmp)


def load_checkpoint(path: str | Path, fmt: str) -> dict:
    """The saved dict, after checking it is a `fmt` checkpoint; clear errors otherwise."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: no such model checkpoint")
    try:
        state = torch.load(path, weights_only=True)
    except Exception as exc:  # truncated file, pickle of something else, ...
        raise DataFormatError(f"{path}: not a model checkpoint: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != fmt:
        raise DataFormatError(f"{path}: expected a {fmt} checkpoint")
    return state
