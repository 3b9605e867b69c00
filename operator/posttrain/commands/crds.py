"""posttrain crds: the CustomResourceDefinitions (RLJob, SFTJob, TaskApp) generated from posttrain.api.

By default they are printed to stdout as one multi-document YAML, ready for `kubectl apply --server-side -f -`;
-o DIR writes one file per kind (the repository's crds/ is `-o crds`). --check compares a folder instead of
writing (exit 1 when it is stale)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posttrain.api.crdgen import crd_files, write_crds
from posttrain.api.exitcodes import CLI_FAILED, CLI_OK, CLI_USER_ERROR

# Shown at the end of --help (cli.py adds them).
EXAMPLES = """\
  posttrain crds | kubectl apply --server-side -f -
  posttrain crds -o crds                        # regenerate the repository's crds/
  posttrain crds -o crds --check                # CI: exit 1 when crds/ differs from the models
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "crds",
        help="print the CRDs generated from the models (or write them to a folder)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--output", "-o", type=Path, default=None, help="write one file per kind into this folder (default: stdout)"
    )
    parser.add_argument("--check", action="store_true", help="with -o DIR: compare only; exit 1 when it differs")
    parser.set_defaults(func=run)


def stale(directory: Path) -> list[str]:
    out = []
    want = crd_files()
    for name, text in want.items():
        path = directory / name
        if not path.is_file():
            out.append(f"missing {path}")
        elif path.read_text() != text:
            out.append(f"differs {path}")
    for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else []:
        if path.name not in want:
            out.append(f"unexpected {path}")
    return out


def run(args: argparse.Namespace) -> int:
    directory = args.output
    if args.check:
        if directory is None:
            print("error: --check: needs -o DIR, the folder to compare (fix: posttrain crds -o crds --check)",
                  file=sys.stderr)  # fmt: skip
            return CLI_USER_ERROR
        problems = stale(directory)
        for line in problems:
            print(line, file=sys.stderr)
        if not problems:
            print(f"ok: {directory} matches the models")
        return CLI_FAILED if problems else CLI_OK
    if directory is None:
        # Each file already starts with its comment header; `---` separates the documents.
        sys.stdout.write("---\n".join(crd_files().values()))
        return CLI_OK
    for path in write_crds(directory):
        print(path)
    return CLI_OK
