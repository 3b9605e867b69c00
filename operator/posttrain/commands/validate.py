"""posttrain validate: check a synth-ai TOML (RL, SFT, eval or filter) and, for SFT, its JSONL dataset.

Every problem is printed on its own line with the file, the TOML line, the field path and the fix; exit 2.
Both the training file (--dataset, else [job].data) and the validation file ([data].validation_path) are
checked with exactly the rules the trainer applies (posttrain.api.dataset, which the trainer imports): JSON
objects with messages[] of at least 2 turns and an assistant turn, chat roles (system, user, assistant, tool,
developer, function), OpenAI content parts, image URLs https://, data:image/ or beside the dataset.
Unknown keys and sections are warned about (with a did-you-mean) and kept."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from posttrain.api.config import normalized_config
from posttrain.api.convert import load, read_config
from posttrain.api.dataset import validate_jsonl
from posttrain.commands import experimental
from posttrain.errors import Problem, UserError

# Shown at the end of --help (cli.py adds them).
EXAMPLES = """\
  posttrain validate --config examples/rl_qwen3_4b.toml
  posttrain validate -c examples/sft_lora.toml --dataset examples/datasets/math_chat.jsonl
  posttrain validate --strict -c my.toml        # CI: warnings exit 2 too
"""


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
    parser.add_argument("--strict", action="store_true", help="treat warnings as errors: exit 2 when there are any (CI)")
    experimental.add_flag(parser)
    parser.set_defaults(func=run)


def strict_warnings(args: argparse.Namespace, warnings: list[str]) -> None:
    """--strict: warnings (unknown keys, ignored flags) are refused like errors, exit 2."""
    if getattr(args, "strict", False) and warnings:
        raise UserError(Problem(f"{len(warnings)} warning(s) above", field="--strict",
                                fix="fix what the warnings name, or drop --strict"))  # fmt: skip


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


def _datasets(args: argparse.Namespace, config: dict[str, Any]) -> list[tuple[str, Path]]:
    """(field, local path) of the training file (--dataset or [job].data) and the validation file
    ([data].validation_path); s3:// and http(s) URIs are the cluster's to read and are not checked here."""
    from posttrain.dataset_upload import find_local

    job = config.get("job") if isinstance(config.get("job"), dict) else {}
    data = config.get("data") if isinstance(config.get("data"), dict) else {}
    out = []
    for field, value in (
        ("job.data", args.dataset or job.get("data")),
        ("data.validation_path", data.get("validation_path")),
    ):
        if not value or str(value).startswith(("s3://", "http://", "https://")):
            continue
        if field == "job.data" and args.dataset:
            out.append(("--dataset", Path(args.dataset)))
            continue
        out.append((field, find_local(str(value), args.config, field=field, file=str(args.config))))
    return out


def tracker_problems(config: dict[str, Any], *, text: str, file: str) -> list[Problem]:
    """[training].report_to trackers that cannot work with this environment (the one a local run's trainer
    inherits): a missing package or setting, at the key's line."""
    from posttrain.api import trackers
    from posttrain.toml_locate import locate

    line = locate(text, trackers.FIELD)
    return [Problem(message, file=file, line=line, field=trackers.FIELD, fix=fix)
            for message, fix in trackers.problems(trackers.report_to(config), os.environ)]  # fmt: skip


FLAT_EVAL_KEYS = {"task_app_url", "seeds", "num_episodes", "app_id"}


def config_kind(raw: dict[str, Any]) -> str | None:
    """What a synth TOML is: "rl", "sft", "eval", "filter", "prompt_learning" (synth's GEPA / MIPRO), or
    None. synth's eval command reads a file without [eval] as the eval table itself: such a file (a top-level
    model id, task_app_url, seeds or num_episodes, no [algorithm]) is an eval config even with a [rollout]."""
    from posttrain.api.config import infer_type

    if isinstance(raw.get("prompt_learning"), dict):
        return "prompt_learning"
    flat = isinstance(raw.get("model"), str) or bool(FLAT_EVAL_KEYS & set(raw))
    if flat and not raw.get("algorithm") and "eval" not in raw and "filter" not in raw:
        return "eval"
    return infer_type(raw)


def synth_tool_kind(text: str, file: str) -> str | None:
    """ "eval" or "filter" for synth's eval and filter TOMLs, None for RL/SFT (and what is neither);
    a prompt-learning config is refused, naming what it is."""
    from posttrain.api.convert import parse_toml

    kind = config_kind(parse_toml(text, file))
    if kind == "prompt_learning":
        raise UserError(Problem("synth's prompt learning (GEPA / MIPRO prompt optimisation) has no equivalent in "
                                "posttrain, which trains weights", file=file, field="prompt_learning",
                                fix="run it with synth-ai; posttrain takes RL, SFT, eval and filter configs"))  # fmt: skip
    return kind if kind in ("eval", "filter") else None


def validate_tool_config(args: argparse.Namespace, kind: str, text: str) -> int:
    """An eval or filter TOML checked by its typed model (posttrain.api.eval_config / filter_config): each
    problem at file:line, keys without effect here named."""
    from posttrain.api.eval_config import load_eval_config
    from posttrain.api.filter_config import load_filter_config

    load = load_eval_config if kind == "eval" else load_filter_config
    table, warnings = load(text, str(args.config))
    if kind == "eval":
        from posttrain.evaluation.judges import check_judges

        problems = check_judges(table.judge_specs(), config=args.config, file=str(args.config))  # type: ignore[union-attr]
        if problems:
            raise UserError(problems)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    strict_warnings(args, warnings)
    print(f"ok: {args.config} is a valid {kind} config (run it with posttrain {kind} --config {args.config})")
    return 0


def run(args: argparse.Namespace) -> int:
    experimental.apply(args)
    if args.config is None and args.dataset is None:
        raise UserError(Problem("nothing to check", fix="pass --config FILE and/or --dataset JSONL"))
    config: dict[str, Any] = {}
    kind = "sft"
    warnings: list[str] = []
    if args.config is not None:
        text = read_config(args.config)
        if args.job_type is None and (other := synth_tool_kind(text, str(args.config))):
            return validate_tool_config(args, other, text)
        kind, model, warnings = load(text, kind=args.job_type, file=str(args.config))
        config = normalized_config(model)
    problems: list[Problem] = []
    if args.config is not None:
        problems += tracker_problems(config, text=text, file=str(args.config))
    checked: list[tuple[Path, int]] = []
    for _, path in _datasets(args, config) if kind == "sft" or args.dataset else []:
        report = validate_jsonl(path, max_images_per_message=_max_images(config))
        problems += report.problems
        warnings += report.warnings
        checked.append((path, report.examples))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if problems:
        raise UserError(problems)
    strict_warnings(args, warnings)
    if args.config is not None:
        print(f"ok: {args.config} is a valid {kind} config")
    for path, examples in checked:
        print(f"ok: {path}: {examples} examples")
    return 0
