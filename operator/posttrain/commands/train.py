"""`posttrain train --type rl|sft --config FILE`: what `synth-ai train` does, against Kubernetes or this machine.

Cluster (default): convert the TOML into an RLJob/SFTJob (posttrain.api, the same conversion as `posttrain
convert`), server-side apply it to the current kube context, then poll its status and print phase and
progress until Succeeded or Failed. For SFT, --dataset (or [job].data) is validated and uploaded first: to
S3 when S3_ENDPOINT / S3_ACCESS_KEY_ID / S3_SECRET_ACCESS_KEY are set, else into a ConfigMap (small files).
Exit 0 only on Succeeded (1 Failed, 2 bad input, 4 poll timeout; --no-poll: 0 once applied).

--local: the same job on this machine with no cluster (posttrain.local.runner): embedded S3, the task app,
the vLLM rollout server, the trainer under torchrun with --nproc-per-node N CPU processes.

Env files (posttrain.envfiles): --env-file FILE (repeatable, a later file wins; over the environment too),
else ./.env filling what the environment lacks, as synth's CLI preloads it (ENVIRONMENT_API_KEY,
TASK_APP_URL, S3_*, judge keys). Values stay in this process's environment: never printed, and the task
app key reaches a cluster only as a Secret, never in the custom resource."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from posttrain.api.overrides import apply_overrides, parse_set
from posttrain.api.resources import LABEL_USE, USE_TASK_APP_KEY
from posttrain.commands import experimental
from posttrain.commands.argtypes import (
    http_url,
    job_name,
    namespace,
    object_name,
    positive_float,
    positive_int,
)
from posttrain.commands.status import (
    EXIT_FAILED,
    EXIT_TIMEOUT,
    GROUP,
    PLURALS,
    VERSION,
    get_job,
    load_kube,
    poll,
)
from posttrain.commands.validate import strict_warnings
from posttrain.errors import Problem, UserError

FIELD_MANAGER = "posttrain-cli"
CONFIGMAP_LIMIT = 900 * 1024


# Shown at the end of --help (cli.py adds them).
EXAMPLES = """\
  posttrain train --type rl --config examples/rl_qwen3_4b.toml --task-app math -n team-a
  posttrain train --local --type rl --config examples/demo/rl.toml
  posttrain train --local --type sft --config examples/demo/sft.toml --dataset examples/demo/sft_warmup.jsonl
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="run an RL or SFT job from a synth TOML (on the cluster, or --local on this machine)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--type", dest="job_type", choices=["rl", "sft"], help="job kind (default: from the TOML)"
    )
    parser.add_argument("--config", required=True, type=Path, help="synth TOML job config")
    parser.add_argument("--dataset", help="SFT training JSONL (overrides [job].data)")
    parser.add_argument(
        "--model",
        help="override the TOML's model as synth's --model does: a fine-tuned id (ft:/rl:...) becomes "
        "[model].source (clearing base), any other id [model].base",
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", type=parse_set, default=None, metavar="KEY=VALUE",
        help="replace one TOML key, validated like it (repeatable): --set training.iterations_per_epoch=1",
    )  # fmt: skip
    parser.add_argument("--name", type=job_name, help="job name (default: from [model].label or the file name)")
    parser.add_argument("-n", "--namespace", type=namespace, help="namespace (default: the kube context's)")
    parser.add_argument("--context", help="kube context (default: current)")
    parser.add_argument("--task-url", type=http_url, help="task app URL (overrides [services].task_url and TASK_APP_URL)")
    parser.add_argument("--env-file", type=Path, action="append", default=None,
                        help="KEY=VALUE file(s) loaded into the environment (repeatable, later wins; default ./.env)")  # fmt: skip
    parser.add_argument(
        "--task-app", dest="task_app_name", type=object_name, help="name of a TaskApp in the namespace (cluster mode)"
    )
    parser.add_argument(
        "--api-key-secret", type=object_name,
        help="Secret holding the task app key (key ENVIRONMENT_API_KEY); default: one made from $ENVIRONMENT_API_KEY",
    )
    parser.add_argument("--strict", action="store_true", help="treat warnings as errors: exit 2 when there are any (CI)")
    experimental.add_flag(parser)
    parser.add_argument("--no-poll", dest="poll", action="store_false", help="apply and return")
    parser.add_argument("--poll-timeout", type=positive_float, default=3600.0, help="seconds (default 3600)")
    parser.add_argument("--poll-interval", type=positive_float, default=5.0, help="seconds (default 5)")
    local = parser.add_argument_group("--local (no cluster)")
    local.add_argument("--local", action="store_true", help="run on this machine instead of a cluster")
    local.add_argument("--nproc-per-node", "--nproc", dest="nproc", type=positive_int, default=1,
                       help="trainer CPU processes under torchrun (default 1)")  # fmt: skip
    local.add_argument("--runs-dir", type=Path, help="run folders and the embedded S3 data (default .runs/)")
    local.add_argument("--model-path", help="local Hugging Face folder with the base model's weights")
    local.add_argument("--task-app-script", dest="task_app", type=Path,
                       help="task app script to start (default: the math task app)")  # fmt: skip
    parser.set_defaults(func=run)


# ------------------------------------------------------------------------------------------ config


def read_text(path: Path) -> str:
    from posttrain.api.convert import read_config

    return read_config(path)


def load_job(args: argparse.Namespace) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(kind, raw TOML dict, normalised synth config) through posttrain.api.convert (`posttrain convert`'s
    parser: lenient aliases, synth's rules, one problem per line); warnings go to stderr."""
    from posttrain.api import convert
    from posttrain.api.config import normalized_config

    text = read_text(args.config)
    overrides = getattr(args, "overrides", None)
    raw = apply_overrides(convert.parse_toml(text, str(args.config)), overrides)
    kind, config, warnings = convert.load(
        text, kind=args.job_type, file=str(args.config), model=args.model, overrides=overrides
    )
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    strict_warnings(args, warnings)  # before anything is applied or started
    return kind, raw, normalized_config(config)


# ------------------------------------------------------------------------------------------- dataset


def dataset_files(args: argparse.Namespace, raw: dict[str, Any]) -> dict[str, str | Path]:
    """{"train": ..., "validation": ...}: s3:// URIs as they are, local files (--dataset or [job].data;
    [data].validation_path) as checked paths."""
    from posttrain.dataset_upload import check_dataset, find_local

    job = raw.get("job") if isinstance(raw.get("job"), dict) else {}
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    out: dict[str, str | Path] = {}
    for role, value, field in (("train", args.dataset or job.get("data") or job.get("data_path"), "job.data"),
                               ("validation", data.get("validation_path"), "data.validation_path")):  # fmt: skip
        if not value:
            continue
        if str(value).startswith("s3://"):
            out[role] = str(value)
            continue
        flag = "--dataset" if role == "train" and args.dataset else field
        path = find_local(
            str(value), args.config, field=flag, file=None if flag == "--dataset" else str(args.config)
        )
        check_dataset(path)
        out[role] = path
    return out


def upload_dataset_s3(path: Path, field: str = "job.data", namespace: str | None = None) -> dict[str, Any] | None:
    """s3://$S3_BUCKET/jobs/<namespace>/datasets/<sha>-<name> when S3_ENDPOINT and the keys are set (returns
    the dataset ref), else None (the caller puts the file in a ConfigMap)."""
    from posttrain import dataset_upload

    if not dataset_upload.s3_configured():
        return None
    uri = dataset_upload.upload(path, field=field, namespace=namespace)
    print(f"dataset: {path} -> {uri}")
    return {"uri": uri}


KEY_SECRET = "posttrain-environment-api-key"


def apply_key_secret(api: Any, namespace: str, key: str) -> str:
    """$ENVIRONMENT_API_KEY into the Secret the job references (synth registers it with its backend; here
    it travels only as a Secret). Returns the Secret's name."""
    from kubernetes import client

    body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": KEY_SECRET, "labels": {"app.kubernetes.io/managed-by": "posttrain",
                                                        LABEL_USE: USE_TASK_APP_KEY}},
            "stringData": {"ENVIRONMENT_API_KEY": key}}  # fmt: skip
    client.CoreV1Api(api).patch_namespaced_secret(
        KEY_SECRET, namespace, body, field_manager=FIELD_MANAGER, force=True,
        _content_type="application/apply-patch+yaml",
    )  # fmt: skip
    print(f"task app key: $ENVIRONMENT_API_KEY -> Secret {namespace}/{KEY_SECRET}")
    return KEY_SECRET


def dataset_configmap(files: dict[str, Path]) -> dict[str, Any]:
    """Small local datasets as one ConfigMap (keys train.jsonl, validation.jsonl: the trainer pod mounts one
    ConfigMap), named by its content so that the job spec can name it before it exists."""
    data = {f"{role}.jsonl": path.read_bytes() for role, path in sorted(files.items())}
    size = sum(len(v) for v in data.values())
    if size > CONFIGMAP_LIMIT:
        raise UserError(Problem(f"the dataset files are {size} bytes: too big for a ConfigMap", field="job.data",
                                fix="set S3_ENDPOINT, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY to upload them to S3"))  # fmt: skip
    digest = hashlib.sha256(b"\0".join(k.encode() + b"=" + v for k, v in data.items())).hexdigest()[:12]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"posttrain-dataset-{digest}", "labels": {"posttrain.dev/role": "dataset"}},
            "data": {k: v.decode() for k, v in data.items()}}  # fmt: skip


def apply_configmap(body: dict[str, Any], api: Any, namespace: str, job_name: str) -> None:
    from kubernetes import client

    body = {**body, "metadata": {**body["metadata"],
                                 "labels": {**body["metadata"]["labels"], "posttrain.dev/job": job_name}}}  # fmt: skip
    client.CoreV1Api(api).patch_namespaced_config_map(
        body["metadata"]["name"], namespace, body, field_manager=FIELD_MANAGER, force=True,
        _content_type="application/apply-patch+yaml",
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ run


def run(args: argparse.Namespace) -> int:
    from posttrain.envfiles import load_env_files, url_notices

    loaded = load_env_files(args.env_file)
    experimental.apply(args)
    kind, raw, config = load_job(args)
    # before anything is sent: every URL taken from the environment, with where it came from
    unused = frozenset() if kind == "rl" else frozenset({"TASK_APP_URL"})
    for line in url_notices(loaded, os.environ, raw, given={"TASK_APP_URL": args.task_url}, unused=unused):
        print(line, file=sys.stderr, flush=True)
    if args.local:
        from posttrain.commands.validate import tracker_problems

        problems = tracker_problems(config, text=read_text(args.config), file=str(args.config))
        if problems:
            raise UserError(problems)
        return run_local(args, kind, config)
    return run_cluster(args, kind, raw)


def run_local(args: argparse.Namespace, kind: str, config: dict[str, Any]) -> int:
    from posttrain.local.runner import RUNS_DIR, LocalOptions
    from posttrain.local.runner import run_local as run

    if args.nproc < 1:
        raise UserError(Problem("--nproc-per-node must be >= 1"))
    options = LocalOptions(
        kind=kind,
        config_path=args.config,
        config=config,
        dataset=args.dataset,
        nproc=args.nproc,
        name=args.name,
        runs_dir=(args.runs_dir or RUNS_DIR).resolve(),
        task_url=args.task_url,
        task_app=args.task_app,
        model_path=args.model_path,
        timeout=args.poll_timeout if args.poll_timeout != 3600.0 else None,
    )
    result = run(options)
    if result.phase == "Succeeded":
        return 0
    return 130 if result.message == "interrupted" else EXIT_FAILED


def run_cluster(args: argparse.Namespace, kind: str, raw: dict[str, Any]) -> int:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api, namespace = load_kube(args.context)
    namespace = args.namespace or namespace
    from posttrain.api.convert import toml_to_cr

    uris: dict[str, str] = {}
    local_files: dict[str, Path] = {}
    if kind == "sft":
        for role, value in dataset_files(args, raw).items():
            if isinstance(value, Path):
                field = "data.validation_path" if role == "validation" else "job.data"
                ref = upload_dataset_s3(value, field, namespace)
                if ref is None:
                    local_files[role] = value
                    continue
                value = ref["uri"]
            uris[role] = value
    secret = args.api_key_secret
    if kind == "rl" and not secret and os.environ.get("ENVIRONMENT_API_KEY"):
        secret = apply_key_secret(api, namespace, os.environ["ENVIRONMENT_API_KEY"])
    refs: dict[str, Any] = {role: {"uri": uri} for role, uri in uris.items()}
    configmap = dataset_configmap(local_files) if local_files else None
    if configmap is not None:
        refs.update({role: {"configMapRef": {"name": configmap["metadata"]["name"], "key": f"{role}.jsonl"}}
                     for role in local_files})  # fmt: skip
    manifest, _ = toml_to_cr(
        read_text(args.config), kind=kind, name=args.name, namespace=namespace, model=args.model,
        task_url=args.task_url, task_app=args.task_app_name, api_key_secret=secret if kind == "rl" else None,
        dataset=refs.get("train"), validation_dataset=refs.get("validation"), file=str(args.config),
        overrides=args.overrides,
    )  # fmt: skip
    name = manifest["metadata"]["name"]
    if configmap is not None:
        apply_configmap(configmap, api, namespace, name)
        print(f"dataset: {', '.join(str(p) for p in local_files.values())} -> ConfigMap "
              f"{namespace}/{configmap['metadata']['name']}")  # fmt: skip

    objects = client.CustomObjectsApi(api)
    try:
        objects.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURALS[kind], name, manifest,
            field_manager=FIELD_MANAGER, _content_type="application/apply-patch+yaml",
        )  # fmt: skip
    except ApiException as err:
        raise UserError(Problem(f"the API server rejected {manifest.get('kind')} {namespace}/{name}: "
                                f"{_api_message(err)}", file=str(args.config))) from err  # fmt: skip
    print(
        f"applied {manifest.get('kind')} {namespace}/{name} (kubectl get {PLURALS[kind]} -n {namespace} {name})"
    )
    if not args.poll:
        return 0
    phase, job = poll(
        lambda: get_job(api, kind, namespace, name),
        timeout=args.poll_timeout,
        interval=args.poll_interval,
        out=lambda line: print(line, flush=True),
    )
    status = (job or {}).get("status") or {}
    if phase is None:
        print(f"still {status.get('phase') or 'Pending'} after {args.poll_timeout:.0f} s; "
              f"follow with: posttrain status {name} --type {kind} -n {namespace}")  # fmt: skip
        return EXIT_TIMEOUT
    if phase == "Succeeded":
        fine_tuned = status.get("fineTunedModel") or (status.get("result") or {}).get("fineTunedModel")
        print(f"fine_tuned_model: {fine_tuned}")
        model_uri = (status.get("artifacts") or {}).get("model")
        if model_uri:
            print(f"s3 uri: {model_uri}")
        return 0
    print(f"failed: {status.get('reason') or ''} {status.get('message') or ''}".rstrip(), file=sys.stderr)
    return EXIT_FAILED


def _api_message(err: Any) -> str:
    try:
        body = json.loads(err.body)
        return body.get("message") or str(err.reason)
    except (TypeError, ValueError):
        return f"HTTP {err.status} {err.reason}"
