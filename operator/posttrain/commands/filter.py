"""`posttrain filter`: ReST-EM's offline step. Keep the rollouts whose reward meets the threshold and write them
as SFT JSONL (one record per user turn, as `synth-ai filter` does, each with the conversation before it),
ready for an SFTJob; `posttrain eval` writes such rollouts. (An RLJob with `variety = "restem"` runs the whole
loop: sampling, filtering and fine-tuning, iterated.) Rows: {"messages": [...],
"reward": x, "metadata": {...}} or {"prompt", "completion", "reward"}; see posttrain/api/restem.py.

A synth filter TOML works too (`--config filter.toml`, [filter] table: input, output, min_official_score,
max_official_score, splits, task_ids, models, min_judge_scores, max_judge_scores, min_created_at,
max_created_at, limit); options given on the command line win. Trace databases (db = sqlite...) are not read:
export the rollouts to JSONL first."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from posttrain.commands.argtypes import finite_float, positive_int
from posttrain.errors import Problem, UserError

TOML_KEYS = {
    "input",
    "db",
    "output",
    "min_official_score",
    "max_official_score",
    "splits",
    "task_ids",
    "models",
    "min_judge_scores",
    "max_judge_scores",
    "min_created_at",
    "max_created_at",
    "limit",
    "offset",
    "shuffle",
    "shuffle_seed",
    "per_turn",
}


def _judge_score(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=SCORE, got {text!r}") from None


# Shown at the end of --help (cli.py adds them).
EXAMPLES = """\
  posttrain filter --input .runs/evals/eval-x/traces.jsonl --min-reward 1 --output sft.jsonl
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "filter",
        help="ReST-EM: rollouts with reward >= threshold -> SFT JSONL",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--input", "-i", type=Path, help="rollouts JSONL")
    parser.add_argument("--output", "-o", type=Path, help="SFT JSONL to write (.jsonl or .json)")
    parser.add_argument("--config", type=Path, help="synth filter TOML with a [filter] table")
    parser.add_argument(
        "--min-reward", type=finite_float, default=None, help="keep rows with reward >= this (default 1.0)"
    )
    parser.add_argument("--max-reward", type=finite_float, default=None, help="keep rows with reward <= this")
    parser.add_argument(
        "--split", action="append", dest="splits", default=None, help="metadata.task_split to keep"
    )
    parser.add_argument(
        "--task-id", action="append", dest="task_ids", default=None, help="metadata.task_id to keep"
    )
    parser.add_argument(
        "--model", action="append", dest="models", default=None, help="metadata.model to keep"
    )
    parser.add_argument(
        "--min-judge-score",
        action="append",
        type=_judge_score,
        default=None,
        metavar="NAME=SCORE",
        help="metadata.judge_scores[NAME] >= SCORE",
    )
    parser.add_argument(
        "--max-judge-score",
        action="append",
        type=_judge_score,
        default=None,
        metavar="NAME=SCORE",
        help="metadata.judge_scores[NAME] <= SCORE",
    )
    parser.add_argument("--limit", type=positive_int, default=None, help="at most this many output records")
    parser.add_argument(
        "--keep-conversation",
        action="store_true",
        help="one record per rollout (whole conversation) instead of one per user turn",
    )
    parser.set_defaults(func=run)


def _toml_filter(path: Path) -> dict[str, Any]:
    from posttrain.api.convert import parse_toml, read_config

    data = parse_toml(read_config(path), str(path))
    table = data.get("filter")
    if not isinstance(table, dict):
        raise UserError(
            Problem("no [filter] table", file=str(path), fix="put the filter keys under [filter]")
        )
    unknown = sorted(set(table) - TOML_KEYS)
    if unknown:
        raise UserError([Problem(f"unknown key {k!r}", file=str(path), field=f"filter.{k}") for k in unknown])
    db = table.get("db")
    if db and not table.get("input"):
        if str(db).startswith(("sqlite", "libsql", "http")) or not str(db).endswith((".jsonl", ".json")):
            raise UserError(
                Problem(
                    "trace databases are not read by posttrain filter",
                    file=str(path),
                    field="filter.db",
                    fix="export the rollouts to JSONL and set filter.input",
                )
            )
        table["input"] = db
    return table


def build_spec(args: argparse.Namespace):
    from posttrain.api.restem import FilterSpec

    table = _toml_filter(args.config) if args.config else {}
    base = args.config.parent if args.config else Path.cwd()

    def pick(cli, key, default=None):
        return cli if cli is not None else table.get(key, default)

    input_path = args.input or (base / table["input"] if table.get("input") else None)
    output_path = args.output or (base / table["output"] if table.get("output") else None)
    problems = []
    if input_path is None:
        problems.append(Problem("no input file", field="--input", fix="pass --input rollouts.jsonl"))
    if output_path is None:
        problems.append(Problem("no output file", field="--output", fix="pass --output sft.jsonl"))
    elif output_path.suffix not in (".jsonl", ".json"):
        problems.append(Problem("output must end in .jsonl or .json", field="--output",
                                fix="name the output e.g. sft.jsonl"))  # fmt: skip
    if problems:
        raise UserError(problems)
    from posttrain.inputs import check_output_path

    check_output_path(output_path, flag="--output")
    spec = FilterSpec(
        min_reward=pick(args.min_reward, "min_official_score", 1.0),
        max_reward=pick(args.max_reward, "max_official_score"),
        splits=list(pick(args.splits, "splits", []) or []),
        task_ids=list(pick(args.task_ids, "task_ids", []) or []),
        models=list(pick(args.models, "models", []) or []),
        min_judge_scores=dict(args.min_judge_score)
        if args.min_judge_score
        else dict(table.get("min_judge_scores", {})),
        max_judge_scores=dict(args.max_judge_score)
        if args.max_judge_score
        else dict(table.get("max_judge_scores", {})),
        min_created_at=table.get("min_created_at"),
        max_created_at=table.get("max_created_at"),
        limit=pick(args.limit, "limit"),
        per_turn=not args.keep_conversation and bool(table.get("per_turn", True)),
    )
    return spec, input_path, output_path


def run(args: argparse.Namespace) -> int:
    from posttrain.api.dataset import read_lines
    from posttrain.api.restem import FilterError, filter_rollouts, parse_rows, write_jsonl

    spec, input_path, output_path = build_spec(args)
    lines = read_lines(input_path, what="rollouts file", field="--input")  # refuses binary, non-UTF-8, a BOM, a FIFO
    try:
        records, stats = filter_rollouts(parse_rows(lines), spec)
    except FilterError as err:
        raise UserError(
            Problem(
                str(err),
                file=str(input_path) if err.line or err.field == "input" else None,
                line=err.line,
                field=None if err.line else err.field,
            )
        ) from None
    if not records:
        raise UserError(
            Problem(
                f"no rollout matched the filter ({stats.rows} rows read, min reward "
                f"{spec.min_reward}); nothing written",
                file=str(input_path),
                fix="lower --min-reward or check the reward field",
            )
        )
    write_jsonl(records, output_path)
    print(
        f"kept {stats.kept_rows} of {stats.rows} rollouts -> {stats.records} SFT examples in {output_path}",
        file=sys.stderr,
    )
    return 0
