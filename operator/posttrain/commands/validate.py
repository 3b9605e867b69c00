"""posttrain validate: check a synth-ai TOML (RL or SFT) and, for SFT, its JSONL dataset.

Every problem is printed on its own line with the file, the TOML line, the field path and the fix; exit 2.
Dataset rules: each line a JSON object with messages[] of at least 2 turns, roles non-empty strings, OpenAI
content parts, image URLs https:// or data:image/, at most max_images_per_message images per message."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from posttrain.api.config import normalized_config
from posttrain.api.convert import _read, load
from posttrain.api.dataset import validate_jsonl
from posttrain.errors import Problem, UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check a synth TOML (and an SFT JSONL dataset)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", "-c", type=Path, help="the synth TOML")
    parser.add_argument(
        "--type", dest="job_type", choices=["rl", "sft"], help="rl or sft (detected when absent)"
    )
    parser.add_argument(
        "--dataset", type=Path, help="SFT JSONL (default: [job].data when it is a local file)"
    )
    parser.set_defaults(func=run)


def _max_images(config: dict[str, Any]) -> int | None:
    for section in ("model", "training", "hyperparameters", "job"):
        value = (
            config.get(section, {}).get("max_images_per_message")
            if isinstance(config.get(section), dict)
            else None
        )
        if isinstance(value, int):
            return value
    return None


def _dataset_path(args: argparse.Namespace, config: dict[str, Any]) -> Path | None:
    if args.dataset:
        return args.dataset
    data = (config.get("job") or {}).get("data")
    if not data or str(data).startswith(("s3://", "http://", "https://")):
        return None
    for candidate in (Path(data), args.config.parent / data):  # synth: relative to the CWD
        if candidate.is_file():
            return candidate
    raise UserError(Problem(f"dataset not found: {data}", file=str(args.config), field="job.data",
                            fix="pass --dataset PATH (relative paths resolve against the current folder)"))  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if args.config is None and args.dataset is None:
        raise UserError(Problem("nothing to check", fix="pass --config FILE and/or --dataset JSONL"))
    config: dict[str, Any] = {}
    kind = "sft"
    warnings: list[str] = []
    if args.config is not None:
        kind, model, warnings = load(_read(args.config), kind=args.job_type, file=str(args.config))
        config = normalized_config(model)
    problems: list[Problem] = []
    dataset = _dataset_path(args, config) if kind == "sft" or args.dataset else None
    examples = None
    if dataset is not None:
        report = validate_jsonl(dataset, max_images_per_message=_max_images(config))
        problems += report.problems
        warnings += report.warnings
        examples = report.examples
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if problems:
        raise UserError(problems)
    if args.config is not None:
        print(f"ok: {args.config} is a valid {kind} config")
    if dataset is not None:
        print(f"ok: {dataset}: {examples} examples")
    return 0
