"""`posttrain filter`: ReST-EM's offline step. Keep the rollouts whose reward meets the threshold and write them
as SFT JSONL (one record per user turn, as `synth-ai filter` does, each with the conversation before it),
ready for an SFTJob; `posttrain eval` writes such rollouts. (An RLJob with `variety = "restem"` runs the whole
loop: sampling, filtering and fine-tuning, iterated.) Rows: {"messages": [...],
"reward": x, "metadata": {...}} or {"prompt", "completion", "reward"}; see posttrain/api/restem.py.

A synth filter TOML works too (`--config filter.toml`, [filter] table: input, output, min_official_score,
max_official_score, splits, task_ids, models, min_judge_scores, max_judge_scores, min_created_at,
max_created_at, limit); options given on the command line win.

The input may also be synth's v3 trace database (`db = "traces/v3/synth_ai.db"`: what a synth task app
served with TASKAPP_TRACING_ENABLED=1 writes, and what `posttrain eval --sqlite` writes; its sessions, messages
and outcome_rewards, read with synth's filter semantics: posttrain.api.synth_traces), or an RL job's trace store (traces.sqlite, posttrain_trainer/traces.py: every rollout
the trainer ran, with its messages, tool calls, per-step rewards and policy version): a local file (the
`train --local` run folder's work/traces.sqlite), `sqlite:///path` (synth's `db` spelling), or in S3 the
job's folder `s3://BUCKET/jobs/NS/NAME-UID8/` or the file itself (S3_ENDPOINT, S3_ACCESS_KEY_ID and
S3_SECRET_ACCESS_KEY set: your namespace's keys). A store's score is the reward the trainer used; its
failed rollouts are skipped."""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path
from typing import Any

from posttrain.commands.argtypes import finite_float, positive_int
from posttrain.errors import Problem, UserError


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
  posttrain filter --input .runs/<run>/work/traces.sqlite --min-reward 0.5 --limit 500 --output sft.jsonl
  posttrain filter --input s3://posttrain/jobs/team-a/crafter-1a2b3c4d/ --min-reward 1 --output sft.jsonl
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "filter",
        help="ReST-EM: rollouts with reward >= threshold -> SFT JSONL",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--input",
        "-i",
        help="rollouts JSONL, a trace store (traces.sqlite, sqlite:///...), or s3://... job folder",
    )
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
    """The [filter] table, checked by its typed model (posttrain.api.filter_config); warnings to stderr."""
    from posttrain.api.convert import read_config
    from posttrain.api.filter_config import load_filter_config

    table, warnings = load_filter_config(read_config(path), str(path))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    out = table.model_dump(exclude_none=True)
    if table.source():
        out["input"] = table.source()
    return out


MAX_STORE_BYTES = 4 * 1024**3  # a trace store read from S3 is downloaded whole; refuse one beyond this


def resolve_input(value: str, base: Path) -> tuple[str, bool]:
    """(where, from_s3): an s3:// URI as given, else a local path, relative to base. synth's URL spelling
    is read too: sqlite:///relative.db, sqlite:////absolute.db (also sqlite+aiosqlite:///)."""
    if value.startswith("s3://"):
        return value, True
    if value.startswith("sqlite") and ":///" in value:
        value = value.split(":///", 1)[1]
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else base / path), False


def download_store(uri: str, into: Path) -> Path:
    """The trace store of an s3:// job folder (or the file itself) into `into`; UserError naming the
    variable or the URI when it cannot be read."""
    import os

    from posttrain.dataset_upload import S3_VARIABLES, s3_configured

    if not s3_configured():
        raise UserError(Problem(f"the trace store is in S3 ({uri})", field="S3_ENDPOINT",
                                fix=f"set {', '.join(S3_VARIABLES)} (your namespace's keys) to read it"))  # fmt: skip
    from posttrain import storage
    from posttrain.api.traces import FILE_NAME

    bucket, key = storage.parse_s3_uri(uri)
    if not key or key.endswith("/"):
        key += FILE_NAME
    client = storage.client_from_env({"endpoint": os.environ["S3_ENDPOINT"], "bucket": bucket})
    try:
        size = client.stat_object(bucket, key).size
        if size > MAX_STORE_BYTES:
            raise UserError(Problem(f"s3://{bucket}/{key} is {size} bytes, over the {MAX_STORE_BYTES} read here",
                                    field="--input", fix="copy it and filter the local file"))  # fmt: skip
        local = into / FILE_NAME
        client.fget_object(bucket, key, str(local))
        return local
    except UserError:
        raise
    except Exception as err:  # minio's S3Error or a transport error: one line
        raise UserError(Problem(f"cannot read s3://{bucket}/{key}: {type(err).__name__}: {err}"[:300],
                                field="--input", fix="check the URI (a job folder or its traces.sqlite), "
                                "the S3 endpoint and your keys")) from None  # fmt: skip


def build_spec(args: argparse.Namespace):
    from posttrain.api.restem import FilterSpec

    table = _toml_filter(args.config) if args.config else {}
    base = args.config.parent if args.config else Path.cwd()

    def pick(cli, key, default=None):
        return cli if cli is not None else table.get(key, default)

    input_path = args.input if args.input is not None else table.get("input")
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
    input_path, from_s3 = resolve_input(str(input_path), Path.cwd() if args.input is not None else base)
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
    return spec, (input_path, from_s3), output_path


def run(args: argparse.Namespace) -> int:
    import tempfile

    spec, (where, from_s3), output_path = build_spec(args)
    if from_s3:
        with tempfile.TemporaryDirectory(prefix="posttrain-filter-") as tmp:
            return _filter(download_store(where, Path(tmp)), spec, output_path, shown=where)
    return _filter(Path(where), spec, output_path, shown=where)


def read_store(path: Path):
    """The rows of a trace database: synth's v3 schema (a task app's synth_ai.db, `posttrain eval --sqlite`)
    or posttrain's RL trace store (traces.sqlite), told apart by their session_traces columns."""
    from posttrain.api import synth_traces, traces

    try:
        db = sqlite3.connect(f"file:{path.resolve().as_posix()}?mode=ro", uri=True)
        try:
            synth = synth_traces.is_synth_store(db)
        finally:
            db.close()
    except sqlite3.Error as err:
        raise traces.TraceStoreError(f"{path} is not a trace database ({err})") from None
    return synth_traces.read_sessions(path) if synth else traces.read_sessions(path)


def _filter(input_path: Path, spec, output_path: Path, *, shown: str) -> int:
    from posttrain.api.dataset import read_lines
    from posttrain.api.restem import FilterError, filter_rollouts, parse_rows, write_jsonl
    from posttrain.api.traces import TraceStoreError, is_trace_store

    try:
        if is_trace_store(input_path):
            rows = read_store(input_path)
        else:  # refuses binary, non-UTF-8, a BOM, a FIFO
            rows = parse_rows(read_lines(input_path, what="rollouts file", field="--input"))
        records, stats = filter_rollouts(rows, spec)
    except (TraceStoreError, sqlite3.Error) as err:
        raise UserError(Problem(f"cannot read the trace store: {err}", file=shown)) from None
    except FilterError as err:
        raise UserError(
            Problem(
                str(err),
                file=shown if err.line or err.field == "input" else None,
                line=err.line,
                field=None if err.line else err.field,
            )
        ) from None
    if not records:
        raise UserError(
            Problem(
                f"no rollout matched the filter ({stats.rows} rows read, min reward "
                f"{spec.min_reward}); nothing written",
                file=shown,
                fix="lower --min-reward or check the reward field",
            )
        )
    write_jsonl(records, output_path)
    print(
        f"kept {stats.kept_rows} of {stats.rows} rollouts -> {stats.records} SFT examples in {output_path}",
        file=sys.stderr,
    )
    return 0
