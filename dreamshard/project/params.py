"""params.yaml: read with clear errors naming the missing key or the bad value."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dreamshard.errors import DreamShardError

T = TypeVar("T")


class ParamsError(DreamShardError):
    pass


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    path = Path(path)
    try:
        params = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such file") from None
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(params, dict):
        raise ParamsError(f"{path}: expected a mapping of parameter groups")
    return params


def section(params: dict[str, Any], dotted: str) -> Any:
    """params['a']['b'] for 'a.b', naming the missing key when absent."""
    node: Any = params
    for i, key in enumerate(dotted.split(".")):
        if not isinstance(node, dict) or key not in node:
            raise ParamsError(f"params.yaml: missing '{'.'.join(dotted.split('.')[: i + 1])}'")
        node = node[key]
    return node


def build(cls: type[T], values: Any, where: str) -> T:
    """Instantiate dataclass `cls` from a params mapping, rejecting unknown keys."""
    if not isinstance(values, dict):
        raise ParamsError(f"params.yaml: {where}: expected a mapping, got {type(values).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]  # cls: a dataclass
    unknown = sorted(set(values) - known)
    if unknown:
        raise ParamsError(f"params.yaml: {where}: unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(known))}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"params.yaml: {where}: {exc}") from None
