"""The project's cost backend: params `backend`, fed with the process stage's recorded lookups; and the allocator
setting it measures under, set before torch is imported (this module imports nothing heavy at load)."""
from __future__ import annotations

from typing import Any

from dreamshard.project.params import ParamsError, build, section


def recorded_lookups(params: dict[str, Any]):
    """The process stage's recorded lookups, by table name."""
    import pandas as pd

    from dreamshard.data.lookups import RecordedLookups
    from dreamshard.data.requests import read_requests

    stats = pd.read_parquet(section(params, "paths.tables"), columns=["table_id", "name"])
    by_id = read_requests(section(params, "paths.requests"))
    return RecordedLookups({name: by_id[int(i)] for i, name in zip(stats["table_id"], stats["name"])})


def backend_of(params: dict[str, Any], lookups=None):
    """The cost backend named in params `backend`, fed with the recorded lookups (or `lookups`)."""
    from dreamshard.hardware import BACKENDS, Topology, make_backend

    cfg = section(params, "backend")
    name = cfg.get("name")
    if name not in BACKENDS:
        raise ParamsError(f"params.yaml: backend.name: expected one of {', '.join(BACKENDS)}, got {name!r}")
    topology = build(Topology, cfg.get("topology", {}), "backend.topology")
    options = dict(cfg.get(name, {}) or {})
    try:
        backend = make_backend(name, recorded_lookups(params) if lookups is None else lookups, topology,
                               batch_size=cfg["batch_size"], **options)
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"params.yaml: backend.{name}: {exc}") from None
    from dreamshard.hardware.fbgemm import pin_threads

    pin_threads(backend)  # a stage (or benchmark) is a program: it sets the measurement thread count once, here
    return backend


def huge_pages_from_params(params_file: str) -> None:
    """The fbgemm backend's allocator setting, in the environment before torch is imported (torch reads it at
    its first allocation): params backend.fbgemm.huge_pages decides it, whatever the shell had. For programs'
    starts: `python -m pipeline`, the benchmarks, experiments and tools that measure."""
    import yaml

    from dreamshard.hardware.allocator import set_huge_pages

    try:
        with open(params_file) as fh:
            params = yaml.safe_load(fh) or {}
    except (OSError, yaml.YAMLError):
        return  # the stage itself reports the missing or malformed file
    backend = params.get("backend") if isinstance(params, dict) else None
    fbgemm = backend.get("fbgemm") if isinstance(backend, dict) else None
    wanted = isinstance(fbgemm, dict) and fbgemm.get("huge_pages") is True
    set_huge_pages(wanted)
