"""The `dreamshard` command: one module per subcommand (plan, measure, profile, report), the inputs that measure
and report share in `inputs`; here only the parser that wires them and `main`, which turns errors into one line."""
from __future__ import annotations

import argparse
import os
import sys

from dreamshard.cli import measure, plan, profile, report
from dreamshard.errors import DreamShardError

SUBCOMMANDS = (plan, measure, profile, report)  # in the order `dreamshard --help` lists them


class OneLineErrorParser(argparse.ArgumentParser):
    """Usage mistakes end in one line on stderr, like every other error of the command."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from dreamshard.provenance import tool_version

    parser = OneLineErrorParser(prog="dreamshard", description="Place embedding tables on devices.")
    parser.add_argument("--version", action="version", version=f"dreamshard {tool_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineErrorParser)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


INTERRUPTED = 130  # the shell's exit status for a command ended by Ctrl-C (128 + SIGINT)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
    except BrokenPipeError:
        # the reader of stdout went away (`| head -1`): what was written is written; say nothing more, exit 0
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass  # stdout is no file (captured): nothing will flush to it at exit
        return 0
    except KeyboardInterrupt:  # Ctrl-C: outputs are written whole or not at all (dreamshard.io.atomic_path)
        print("dreamshard: interrupted (Ctrl-C); no partial output was written", file=sys.stderr)
        return INTERRUPTED
    except (DreamShardError, ValueError, OSError, OverflowError) as exc:
        print(f"dreamshard: error: {exc}", file=sys.stderr)
        return 1
    return 0
