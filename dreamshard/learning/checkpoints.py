"""One checkpoint mechanism for every learned model.

Each network's config, weights, feature scaler and metadata, saved atomically and loaded strictly: a config
or weights that differ from the code's are an error naming the file, network and field, never a silently
different model. The kinds and what each holds: docs/learning.md.
"""
from __future__ import annotations

import dataclasses
import importlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dreamshard.errors import DataFormatError
from dreamshard.io import atomic_path
from dreamshard.learning.features import FeatureScaler

FORMAT = "dreamshard-checkpoint/2"
# kind -> its networks, role -> the config dataclass that builds it
KINDS = {
    "cost_net": {"cost_net": "CostNetConfig"},
    "policy": {"cost_net": "CostNetConfig", "policy": "PolicyNetConfig"},
    "neuroshard": {"compute": "CostNetConfig", "comm": "CommNetConfig"},
    "rnn": {"rnn": "RnnPolicyConfig"},
}
# config dataclass name -> module that defines it (imported when a checkpoint is loaded)
CONFIGS = {
    "CostNetConfig": "dreamshard.learning.cost_model",
    "PolicyNetConfig": "dreamshard.learning.policy",
    "CommNetConfig": "dreamshard.learning.neuroshard",
    "RnnPolicyConfig": "dreamshard.learning.rnn",
}


@dataclass
class Checkpoint:
    kind: str
    networks: dict[str, nn.Module]
    scaler: FeatureScaler
    meta: dict


def save_checkpoint(path: str | Path, kind: str, networks: dict[str, nn.Module], scaler: FeatureScaler,
                    meta: dict) -> None:
    if kind not in KINDS or set(networks) != set(KINDS[kind]):
        raise ValueError(f"checkpoint kind {kind!r} holds networks {sorted(KINDS.get(kind, {}))}, got {sorted(networks)}")
    stored = {}
    for role, net in networks.items():
        config: Any = getattr(net, "config", None)
        if type(config).__name__ != KINDS[kind][role] or not dataclasses.is_dataclass(config) or isinstance(config, type):
            raise ValueError(f"network {role!r}: expected .config to be a {KINDS[kind][role]}, got {type(config).__name__}")
        stored[role] = {"config_type": type(config).__name__, "config": _plain(dataclasses.asdict(config)),
                        "state": net.state_dict()}
    state = {"format": FORMAT, "kind": kind, "networks": stored, "scaler": scaler.to_dict(), "meta": meta}
    buffer = io.BytesIO()  # saved to memory first: a file's archive records its name, and the name of
    torch.save(state, buffer)  # atomic_path's temporary differs each time; equal checkpoints are equal bytes
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(buffer.getvalue())


def load_checkpoint(path: str | Path, kind: str) -> Checkpoint:
    """The `kind` checkpoint at `path`, networks rebuilt in eval mode; clear errors otherwise."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: no such model checkpoint")
    try:
        with warnings.catch_warnings():  # torch warns of a foreign pickle's protocol: the error below says more
            warnings.simplefilter("ignore")
            state = torch.load(path, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a truncated file, a pickle of something else, ...
        # torch's own messages ("pop from empty list", "101") say nothing to the user: the file and the remedy do
        raise DataFormatError(f"{path}: not a model checkpoint: expected a file that training saved with torch.save "
                              f"({FORMAT}), but it cannot be read ({type(exc).__name__}: truncated, or another kind "
                              "of file); give the checkpoint training wrote, or train the model again") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = (repr(state["format"]) if "format" in state else "a dict without 'format'") \
            if isinstance(state, dict) else f"a {type(state).__name__}"
        raise DataFormatError(f"{path}: not a model checkpoint: expected a {FORMAT} checkpoint, found {found}; give "
                              "the checkpoint training wrote, or train the model again")
    if state.get("kind") != kind:
        raise DataFormatError(f"{path}: expected a {kind!r} checkpoint, found a {state.get('kind')!r} one")
    networks = {}
    for role, expected in KINDS[kind].items():
        entry = state["networks"].get(role)
        if entry is None:
            raise DataFormatError(f"{path}: network {role!r} missing")
        networks[role] = _rebuild(path, role, expected, entry)
    return Checkpoint(kind, networks, FeatureScaler.from_dict(state["scaler"]), state["meta"])


def _rebuild(path: Path, role: str, expected: str, entry: dict[str, Any]) -> nn.Module:
    name = entry.get("config_type")
    if name != expected:
        raise DataFormatError(f"{path}: network {role!r}: expected a {expected}, found {name!r}")
    cls = getattr(importlib.import_module(CONFIGS[name]), name)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    stored = entry["config"]
    upgrade = getattr(cls, "stored_fields", None)  # a config class that reads older checkpoints' fields
    if upgrade is not None and isinstance(stored, dict):
        stored = upgrade(stored)
    unknown = sorted(set(stored) - set(fields))
    if unknown:
        raise DataFormatError(f"{path}: network {role!r}: {name} has no field(s) {', '.join(unknown)}")
    missing = sorted(n for n in fields if n not in stored)
    if missing:
        raise DataFormatError(f"{path}: network {role!r}: the checkpoint lacks {name} field(s) {', '.join(missing)}")
    try:
        config = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()})
        # the initial weights are overwritten below: any generator will do
        net = config.build(torch.Generator())
        net.load_state_dict(entry["state"])
    except (TypeError, ValueError, RuntimeError) as exc:
        raise DataFormatError(f"{path}: network {role!r}: cannot rebuild it from its {name}: {exc}") from None
    net.eval()
    return net


def _plain(value: Any) -> Any:
    """Tuples as lists: torch.load(weights_only=True) reads lists, dicts and scalars."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
