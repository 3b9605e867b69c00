"""posttrain convert: a synth-ai TOML (RL or SFT) -> the RLJob / SFTJob custom resource YAML.

Flags mirror `synth-ai train`: --type is detected as synth does when absent; --model overrides the model (a
fine-tuned id becomes model.source); --task-url wins over TASK_APP_URL and [services].task_url. Without --name
the object's name is derived from its content, so the same TOML always gives the same object. The original
TOML travels in spec.originalToml. An SFT config's local dataset and validation files are checked with the
trainer's rules and uploaded to S3 (S3_ENDPOINT, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY), or refused: the
custom resource never names a file only this machine has."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posttrain.api.convert import read_config, to_yaml, toml_to_cr
from posttrain.api.exitcodes import CLI_USER_ERROR
from posttrain.api.overrides import parse_set
from posttrain.commands import experimental, judge_key
from posttrain.commands.argtypes import http_url, job_name, namespace, object_name
from posttrain.commands.validate import strict_warnings

# Shown at the end of --help (cli.py adds them).
EXAMPLES = """\
  posttrain convert --config examples/rl_qwen3_4b.toml --task-app math --api-key-secret math-task-app-key -n team-a > rljob.yaml
  posttrain convert -c examples/sft_lora.toml --dataset s3://posttrain/datasets/math_chat.jsonl -o sftjob.yaml
  posttrain convert -c rl.toml --task-app math --strict | kubectl apply --server-side -f -
  posttrain convert -c crafter_rl_stepwise_hosted_judge.toml --task-app crafter --judge-key-secret judge-key:OPENAI_API_KEY
  posttrain convert -c rl.toml --task-app math --set training.iterations_per_epoch=1
"""


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
    parser.add_argument("--name", type=job_name, help="metadata.name (default: derived from the content)")
    parser.add_argument("--namespace", "-n", type=namespace, help="metadata.namespace (default: none, kubectl's)")
    parser.add_argument("--model", help="override the model: a base id, or a fine-tuned id (model.source)")
    parser.add_argument("--task-url", type=http_url, help="the task app URL (wins over TASK_APP_URL and services.task_url)")
    parser.add_argument("--task-app", type=object_name, help="name of a TaskApp in the namespace (instead of a URL)")
    parser.add_argument(
        "--api-key-secret", type=object_name, help="Secret holding the task app's key (key ENVIRONMENT_API_KEY)"
    )
    parser.add_argument(
        "--dataset", help="SFT: training JSONL (an s3:// URI, or a local file: checked and uploaded to S3)"
    )
    parser.add_argument(
        "--queue", type=object_name, help="Kueue LocalQueue (spec.scheduling.queueName): the job waits for admission"
    )
    parser.add_argument(
        "--priority-class", type=object_name,
        help="with --queue: Kueue WorkloadPriorityClass (spec.scheduling.workloadPriorityClassName); a higher one "
        "may preempt a lower one, which resumes from its last checkpoint",
    )  # fmt: skip
    parser.add_argument(
        "--set", dest="overrides", action="append", type=parse_set, default=None, metavar="KEY=VALUE",
        help="replace one TOML key, validated like it (repeatable): --set training.iterations_per_epoch=1",
    )  # fmt: skip
    parser.add_argument(
        judge_key.FLAG, dest="judge_key_secret", type=judge_key.parse, metavar="NAME[:KEY]",
        help="Secret (and key in it) holding the judge provider's API key: [judge].api_key_secret_ref "
        "(default key <PROVIDER>_API_KEY)",
    )  # fmt: skip
    experimental.add_flag(parser)
    parser.add_argument("--output", "-o", type=Path, help="write the YAML here (default: stdout)")
    parser.add_argument("--strict", action="store_true", help="treat warnings as errors: exit 2 when there are any (CI)")
    parser.set_defaults(func=run)


def all_overrides(args: argparse.Namespace, text: str) -> tuple[list[tuple[str, object]], list[str]]:
    """--set pairs, then --judge-key-secret's (it wins): (overrides, warnings)."""
    from posttrain.api.convert import parse_toml

    out = list(args.overrides or [])
    if args.judge_key_secret is None:
        return out, []
    judge = judge_key.overrides(parse_toml(text, str(args.config)), args.judge_key_secret)
    if not judge:
        return out, [f"{judge_key.FLAG} is ignored: the config has no [judge]"]
    return out + judge, []


def local_datasets(args: argparse.Namespace, text: str) -> tuple[str | None, str | None]:
    """(train URI, validation URI) for an SFT config: s3:// URIs as they are; a local --dataset / [job].data /
    [data].validation_path checked with the trainer's rules and uploaded to S3, or refused (a cluster job
    cannot read this machine's files)."""
    from posttrain import dataset_upload
    from posttrain.api.convert import detect_kind, parse_toml
    from posttrain.api.overrides import apply_overrides
    from posttrain.toml_locate import locate

    raw = apply_overrides(parse_toml(text, str(args.config)), args.overrides)
    if detect_kind(raw, args.job_type, str(args.config)) != "sft":
        return args.dataset, None
    job = raw.get("job") if isinstance(raw.get("job"), dict) else {}
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    out: list[str | None] = []
    for value, field in ((args.dataset or job.get("data") or job.get("data_path"), "job.data"),
                         (data.get("validation_path"), "data.validation_path")):  # fmt: skip
        if not value or str(value).startswith("s3://"):
            out.append(value)
            continue
        from_flag = field == "job.data" and bool(args.dataset)
        line = None if from_flag else locate(text, field)
        where = None if from_flag else (f"{args.config}:{line}" if line else str(args.config))
        flag = "--dataset" if from_flag else field
        path = dataset_upload.find_local(str(value), args.config, field=flag, file=where)
        dataset_upload.check_dataset(path)
        uri = dataset_upload.upload(path, field=flag, file=where, namespace=args.namespace)
        print(f"dataset: {path} -> {uri}", file=sys.stderr)
        if not args.namespace:
            print("warning: no --namespace: the dataset is outside every namespace's folder, which a job's "
                  "own S3 keys cannot read (docs/storage.md); pass -n NAMESPACE", file=sys.stderr)  # fmt: skip
        out.append(uri)
    return out[0], out[1]


def run(args: argparse.Namespace) -> int:
    from posttrain.inputs import check_output_path

    if args.priority_class and not args.queue:
        print("error: --priority-class: a priority orders jobs in a Kueue queue (fix: add --queue LOCALQUEUE)",
              file=sys.stderr)  # fmt: skip
        return CLI_USER_ERROR
    experimental.apply(args)
    text = read_config(args.config)
    if args.output is not None:
        check_output_path(args.output, flag="--output")
    overrides, warnings_before = all_overrides(args, text)
    dataset, validation = local_datasets(args, text)
    resource, warnings = toml_to_cr(
        text,
        kind=args.job_type,
        name=args.name,
        namespace=args.namespace,
        model=args.model,
        task_url=args.task_url,
        task_app=args.task_app,
        api_key_secret=args.api_key_secret,
        dataset=dataset,
        validation_dataset=validation,
        file=str(args.config),
        queue=args.queue,
        priority_class=args.priority_class,
        overrides=overrides or None,
    )
    warnings = warnings_before + warnings
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    strict_warnings(args, warnings)
    text_out = to_yaml(resource)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text_out)
        print(f"wrote {args.output} ({resource['kind']} {resource['metadata']['name']})", file=sys.stderr)
    else:
        sys.stdout.write(text_out)
    return 0
