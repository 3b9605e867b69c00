"""The `posttrain` command. Each subcommand lives in posttrain/commands/<name>.py and exposes
`register(subparsers)`; the parser it adds sets `func=run`, where `run(args) -> int` is the exit code."""

from __future__ import annotations

import argparse
import importlib
import sys

from posttrain.errors import UserError

# Order is the order shown in --help.
SUBCOMMANDS: list[str] = [
    "convert",
    "validate",
    "crds",
    "train",
    "status",
    "verify_task_app",
    "filter",
    "operator",
]

EXIT_USER_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posttrain",
        description="Declarative LLM post-training (GSPO RL, SFT, ReST-EM) on Kubernetes or on one machine.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"posttrain.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        for problem in err.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
