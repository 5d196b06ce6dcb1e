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


def main() -> int:
    quiet_local_prefect()
    from dreamshard.project.backend import huge_pages_from_params  # imports nothing heavy

    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--params", default="params.yaml")
    huge_pages_from_params(early.parse_known_args()[0].params)  # before anything imports torch
    from dreamshard.project.domain import DreamShardError
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
