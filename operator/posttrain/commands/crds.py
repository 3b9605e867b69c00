"""posttrain crds: write the CustomResourceDefinitions (RLJob, SFTJob, TaskApp) generated from posttrain.api
into crds/ (one file per kind). --check compares instead of writing (exit 1 when crds/ is stale)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posttrain.api.crdgen import crd_files, write_crds

REPO_CRDS = Path(__file__).resolve().parents[3] / "crds"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("crds", help="regenerate crds/ from the models", description=__doc__)
    parser.add_argument(
        "--output", "-o", type=Path, default=None, help="folder (default: the repository's crds/)"
    )
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when the folder differs")
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
    directory = args.output or REPO_CRDS
    if args.check:
        problems = stale(directory)
        for line in problems:
            print(line, file=sys.stderr)
        if not problems:
            print(f"ok: {directory} matches the models")
        return 1 if problems else 0
    for path in write_crds(directory):
        print(path)
    return 0
