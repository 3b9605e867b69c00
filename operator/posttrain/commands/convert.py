"""posttrain convert: a synth-ai TOML (RL or SFT) -> the RLJob / SFTJob custom resource YAML.

Flags mirror `synth-ai train`: --type is detected as synth does when absent; --model overrides the model (a
fine-tuned id becomes model.source); --task-url wins over TASK_APP_URL and [services].task_url. Without --name
the object's name is derived from its content, so the same TOML always gives the same object. The original
TOML travels in spec.originalToml."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posttrain.api.convert import _read, to_yaml, toml_to_cr
from posttrain.api.dataset import validate_jsonl
from posttrain.errors import Problem, UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="synth TOML -> RLJob/SFTJob YAML",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", "-c", required=True, type=Path, help="the synth TOML")
    parser.add_argument(
        "--type", dest="job_type", choices=["rl", "sft"], help="rl or sft (detected when absent)"
    )
    parser.add_argument("--name", help="metadata.name (default: derived from the content)")
    parser.add_argument("--namespace", "-n", help="metadata.namespace (default: none, kubectl's)")
    parser.add_argument("--model", help="override the model: a base id, or a fine-tuned id (model.source)")
    parser.add_argument("--task-url", help="the task app URL (wins over TASK_APP_URL and services.task_url)")
    parser.add_argument("--task-app", help="name of a TaskApp in the namespace (instead of a URL)")
    parser.add_argument(
        "--api-key-secret", help="Secret holding the task app's key (key ENVIRONMENT_API_KEY)"
    )
    parser.add_argument("--dataset", help="SFT: training JSONL (s3:// URI or a local file, checked)")
    parser.add_argument("--output", "-o", type=Path, help="write the YAML here (default: stdout)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    text = _read(args.config)
    if args.name and not _valid_name(args.name):
        raise UserError(Problem(f"invalid --name {args.name!r}", field="metadata.name",
                                fix="use lower-case letters, digits and '-' (at most 63)"))  # fmt: skip
    resource, warnings = toml_to_cr(
        text,
        kind=args.job_type,
        name=args.name,
        namespace=args.namespace,
        model=args.model,
        task_url=args.task_url,
        task_app=args.task_app,
        api_key_secret=args.api_key_secret,
        dataset=args.dataset,
        file=str(args.config),
    )
    if args.dataset and not args.dataset.startswith("s3://") and resource["kind"] == "SFTJob":
        spec_model = resource["spec"].get("model", {})
        report = validate_jsonl(args.dataset, max_images_per_message=spec_model.get("maxImagesPerMessage"))
        if report.problems:
            raise UserError(report.problems)
        warnings += report.warnings
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    text_out = to_yaml(resource)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text_out)
        print(f"wrote {args.output} ({resource['kind']} {resource['metadata']['name']})", file=sys.stderr)
    else:
        sys.stdout.write(text_out)
    return 0


def _valid_name(name: str) -> bool:
    import re

    return bool(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name))
