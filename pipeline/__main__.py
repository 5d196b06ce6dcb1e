"""`python -m pipeline STAGE [--params FILE]`: run a DVC stage through its Prefect flow."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def quiet_local_prefect() -> None:
    """Project-local Prefect state, no analytics, warnings only; explicit settings win."""
    os.environ.setdefault("PREFECT_HOME", str(Path.cwd() / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def huge_pages_from_params(params_file: str) -> None:
    """The fbgemm backend's allocator setting, in the environment before torch is imported (torch reads it at
    its first allocation): params backend.fbgemm.huge_pages decides it, whatever the shell had."""
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


def main() -> int:
    quiet_local_prefect()
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--params", default="params.yaml")
    huge_pages_from_params(early.parse_known_args()[0].params)  # before anything imports torch
    from dreamshard.errors import DreamShardError
    from pipeline.flows import STAGE_FLOWS  # after the environment is set: Prefect reads it on import

    parser = argparse.ArgumentParser(prog="python -m pipeline")
    parser.add_argument("stage", choices=sorted(STAGE_FLOWS))
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args()
    try:
        STAGE_FLOWS[args.stage](params_file=args.params)
    except DreamShardError as exc:
        print(f"{args.stage}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
