"""The `posttrain` command. Each subcommand lives in posttrain/commands/<name>.py and exposes
`register(subparsers)`; the parser it adds sets `func=run`, where `run(args) -> int` is the exit code.

Every parser refuses abbreviated flags (`--model` is never taken for `--model-path`), and every refusal
(a usage mistake, bad input, an unreachable API server) is one line `error: ...` and exit 2."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from posttrain import __version__
from posttrain.api.exitcodes import CLI_CLOSED_PIPE, CLI_INTERRUPTED, CLI_USER_ERROR
from posttrain.errors import UserError

# Order is the order shown in --help.
SUBCOMMANDS: list[str] = [
    "convert",
    "validate",
    "crds",
    "train",
    "eval",
    "status",
    "logs",
    "plot",
    "verify_task_app",
    "filter",
    "operator",
    "completion",
]

EXIT_USER_ERROR = CLI_USER_ERROR
EXAMPLES = """\
examples:
  posttrain validate --config rl.toml
  posttrain convert --config rl.toml --task-app math -n team-a | kubectl apply --server-side -f -
  posttrain train --local --type rl --config examples/demo/rl.toml
  posttrain status -A
  posttrain completion bash > /etc/bash_completion.d/posttrain

`posttrain COMMAND --help` for each command's flags; exit codes: docs/reference/exit-codes.md"""


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching, and with usage errors as one line (exit 2)."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"error: {self.prog}: {message} (fix: see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = Parser(
        prog="posttrain",
        description="Declarative LLM post-training (GSPO RL, SFT, ReST-EM) on Kubernetes or on one machine.",
    )
    parser.add_argument("--version", action="version", version=f"posttrain {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"posttrain.commands.{name}")
        module.register(subparsers)
        sub = subparsers.choices[name.replace("_", "-")]
        sub.epilog = "examples:\n" + module.EXAMPLES.rstrip()
        sub.formatter_class = argparse.RawDescriptionHelpFormatter  # keep the examples' lines
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        code = _run(argv)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        # `posttrain status | head -1`: the reader has gone, so the rest of the output goes nowhere, quietly
        # (Python's own flush at exit would raise again: stdout now points at /dev/null).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLI_CLOSED_PIPE


def _run(argv: list[str] | None) -> int:
    from posttrain.kubeaccess import problem_for

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
        return CLI_INTERRUPTED
    except BrokenPipeError:
        raise
    except Exception as err:
        problem = problem_for(err)
        if problem is None:
            raise
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
