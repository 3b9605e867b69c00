"""`posttrain eval`: a model against a task app, as `synth-ai eval` does for its stack: benchmark a model
before and after training on the same seeds.

  posttrain eval --task-url http://127.0.0.1:8100 --model HuggingFaceTB/SmolLM2-135M-Instruct
      --seeds 1000000-1000063 --split eval --env-name math [--samples 4] [--concurrency 8]
  posttrain eval --config crafter_eval.toml --task-url http://127.0.0.1:8001 --sqlite traces/v3/synth_ai.db

- synth's eval TOML (--config, an [eval] table: posttrain.api.eval_config says what each key does): its keys
  fill what the flags do not give (--task-url, --model, --seeds and every other flag win); its Python judges
  ([eval.judge]) score each rollout, printed per seed and as a mean, as synth's CLI prints them;

- the task app: --task-url URL (or --task-app NAME, a TaskApp in the cluster); its key from
  $ENVIRONMENT_API_KEY (--api-key-env NAME), or from --env-file FILE (KEY=VALUE lines; repeatable, a later
  file wins; without it ./.env fills what the environment lacks, as synth's CLI loads it; posttrain.envfiles);
- the model (--model): a base model id, a local Hugging Face folder, or a fine_tuned_model id (`ft:`/`rl:`,
  its weights read from S3), served here by a vLLM rollout server; or any OpenAI-compatible server given
  by --inference-url (then --model is the name it serves);
- which episodes: --seeds (ranges and lists), --split (env.config.split), --samples per seed (pass@k),
  --env-name / --env-config JSON / --policy-config JSON, --temperature (default 0: greedy), --max-tokens;
- --concurrency rollouts at a time, with a progress bar (--no-progress to hide it);
- traces: one JSONL row per episode (prompt, completion, reward, per-step info; the rows `posttrain filter`
  reads) at --output (default .runs/evals/<name>/traces.jsonl), and with --sqlite a synth v3 trace database
  (synth's session_traces, messages, events, outcome_rewards, event_rewards tables; the task app's own v3
  trace where it returns one), which `posttrain filter` and `synth-ai filter` read;
- the summary table: episodes, errors, mean reward, success rate (reward >= --success-threshold) and pass@k
  (estimated from --samples per seed, or as the task app reports it); summary.json beside the traces.
--cluster runs the same evaluation as a Kubernetes Job (the model served on its GPU) and follows it; its
traces and summary go to S3 (s3://<bucket>/jobs/<namespace>/evals/<name>/). Exit 0 when every rollout answered,
1 when some failed, 2 on a usage mistake."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from posttrain.commands import experimental
from posttrain.commands.argtypes import (
    finite_float,
    http_url,
    namespace,
    non_negative_float,
    object_name,
    positive_float,
    positive_int,
)
from posttrain.errors import Problem, UserError

EXIT_ROLLOUTS_FAILED = 1


def _seeds(text: str) -> list[int]:
    from posttrain.evaluation.summary import parse_seeds

    try:
        return parse_seeds(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError('expected a JSON object, e.g. \'{"difficulty": "easy"}\'')
    return value


# Shown at the end of --help (cli.py adds them).
EXAMPLES = """\
  posttrain eval --task-url http://127.0.0.1:8100 --model HuggingFaceTB/SmolLM2-135M-Instruct --seeds 0-99
  posttrain eval --task-app math --cluster -n team-a --model rl:Qwen/Qwen3-4B:team-a.math-rl.1a2b3c4d --split eval
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval", help="evaluate a model on a task app (locally or as a Kubernetes Job)", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--config", "-c", type=Path,
                        help="synth eval TOML ([eval] table); its keys fill what the flags do not give")  # fmt: skip
    task = parser.add_argument_group("task app")
    task.add_argument("--task-url", type=http_url, help="task app base URL (default: $TASK_APP_URL)")
    task.add_argument("--task-app", type=object_name, help="name of a TaskApp in the cluster namespace (instead of a URL)")
    task.add_argument("--api-key-env", default="ENVIRONMENT_API_KEY", help="env var holding the task app key")
    task.add_argument("--env-file", type=Path, action="append", default=None,
                      help="KEY=VALUE file(s) loaded into the environment (repeatable, later wins; default ./.env)")  # fmt: skip
    task.add_argument("--env-name", default=None, help="env.env_name sent to the task app (default: default)")
    task.add_argument("--policy-name", default=None, help="policy.policy_name sent to the task app (default: policy)")
    task.add_argument("--env-config", type=_json_object, default=None, help="JSON env.config")
    model = parser.add_argument_group("model")
    model.add_argument("--model", help="base id, local folder, or ft:/rl: fine_tuned_model id ([eval].model)")
    model.add_argument("--inference-url", help="an OpenAI-compatible server serving --model (no local vLLM)")
    model.add_argument("--model-path", help="weights of a base id (a local folder or an s3:// URI)")
    model.add_argument("--max-model-len", type=positive_int, default=1024, help="vLLM context (default 1024)")
    experimental.add_flag(model)
    episodes = parser.add_argument_group("episodes")
    episodes.add_argument(
        "--seeds", type=_seeds, default=None, help="e.g. 0-99 or 1,5,9 (default [eval].seeds, else 0-31)"
    )
    episodes.add_argument("--split", help="env.config.split, e.g. train or eval")
    episodes.add_argument(
        "--samples", type=positive_int, default=1, help="rollouts per seed (pass@k; default 1)"
    )
    episodes.add_argument("--temperature", type=non_negative_float, default=None,
                          help="sampling temperature (default 0, greedy; 1 with --samples > 1)")  # fmt: skip
    episodes.add_argument("--max-tokens", type=positive_int, default=None, help="max new tokens per call")
    episodes.add_argument(
        "--policy-config", type=_json_object, default=None, help="JSON merged into policy.config"
    )
    episodes.add_argument(
        "--max-turns", type=positive_int, default=None, help="ops = [agent, env] x N (default 1)"
    )
    episodes.add_argument(
        "--concurrency", type=positive_int, default=None, help="rollouts at a time (default 8)"
    )
    episodes.add_argument(
        "--timeout", type=positive_float, default=600.0, help="seconds per rollout (default 600)"
    )
    episodes.add_argument(
        "--success-threshold", type=finite_float, default=1.0, help="reward counted as a success"
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--output", "-o", type=Path, help="traces JSONL (default .runs/evals/<name>/traces.jsonl)"
    )
    out.add_argument("--sqlite", type=Path, help="also write the traces into this SQLite file (table traces)")
    out.add_argument("--name", help="evaluation name (default: from the model, task and seeds)")
    out.add_argument("--runs-dir", type=Path, default=None, help="local runs folder (default .runs/)")
    out.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    out.add_argument("--results-uri", help="also upload traces and summary to this s3:// prefix")
    cluster = parser.add_argument_group("--cluster (a Kubernetes Job)")
    cluster.add_argument("--cluster", action="store_true", help="run as a Kubernetes Job and follow it")
    cluster.add_argument("-n", "--namespace", type=namespace, help="namespace (default: the kube context's)")
    cluster.add_argument("--context", help="kube context (default: current)")
    cluster.add_argument("--image", help="image with posttrain and vLLM (default: $POSTTRAIN_ROLLOUT_IMAGE)")
    cluster.add_argument(
        "--gpus", type=int, default=1, choices=range(0, 65), metavar="N", help="GPUs (default 1)"
    )
    cluster.add_argument(
        "--api-key-secret", type=object_name, help="Secret with ENVIRONMENT_API_KEY (default: made from the key)"
    )
    cluster.add_argument("--no-wait", dest="wait", action="store_false", help="create the Job and return")
    cluster.add_argument(
        "--wait-timeout", type=positive_float, default=24 * 3600.0, help="seconds to follow it"
    )
    parser.set_defaults(func=run)


# -- inputs ------------------------------------------------------------------------------------------------


def task_and_key(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(task URL, key): flags win over --env-file, which wins over the environment (./.env fills gaps)."""
    from posttrain.api.sections import http_url
    from posttrain.envfiles import load_env_files

    load_env_files(args.env_file)
    key = os.environ.get(args.api_key_env)
    url = args.task_url or os.environ.get("TASK_APP_URL") or getattr(args, "config_task_url", None)
    if args.task_app and args.task_url:
        raise UserError(Problem("--task-app and --task-url both name the task app", field="--task-url",
                                fix="pass one of them"))  # fmt: skip
    if url:
        try:
            http_url(url)
        except ValueError as err:
            raise UserError(Problem(str(err).split(" -- fix: ")[0], field="--task-url",
                                    fix="pass e.g. http://127.0.0.1:8100")) from None  # fmt: skip
    if not url and not args.task_app:
        raise UserError(Problem("no task app", field="--task-url",
                                fix="pass --task-url URL (e.g. the math app: python examples/taskapps/math/app.py "
                                    "--port 8100) or --task-app NAME, or set TASK_APP_URL"))  # fmt: skip
    return url, key


def default_name(args: argparse.Namespace, task: str) -> str:
    from posttrain.evaluation.cluster import eval_job_name

    return args.name or eval_job_name(args.model, task, args.seeds)


def policy_config(args: argparse.Namespace) -> dict[str, Any]:
    config = dict(args.policy_config or {})
    if args.temperature is not None:  # the flag wins; else --policy-config's; else greedy (1.0 for samples)
        config["temperature"] = args.temperature
    else:
        config.setdefault("temperature", 1.0 if args.samples > 1 else 0.0)
    if args.max_tokens is not None:
        config["max_tokens"] = args.max_tokens
    return config


# -- local ---------------------------------------------------------------------------------------------------


DEFAULTS = {"env_name": "default", "policy_name": "policy", "env_config": {}, "policy_config": {},
            "max_turns": 1, "concurrency": 8}  # fmt: skip


def apply_config(args: argparse.Namespace) -> list[Any]:
    """--config's [eval] keys into the flags the command line left unset, then the defaults; returns the
    judges to score with. Also sets args.ops and args.record (synth's ops, return_trace, trace_format)."""
    from posttrain.evaluation.summary import parse_seeds

    args.ops, args.record, judges = None, {}, []
    if args.config is not None:
        from posttrain.api.convert import read_config
        from posttrain.api.eval_config import load_eval_config
        from posttrain.evaluation.judges import load_judges

        table, warnings = load_eval_config(read_config(args.config), str(args.config))
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        args.config_task_url = table.task_app_url  # after --task-url and TASK_APP_URL (task_and_key)
        given = {"model": table.model, "seeds": table.seeds, "split": table.split, "env_name": table.env_name,
                 "policy_name": table.policy_name, "env_config": table.env_config or None,
                 "policy_config": table.policy_config or None, "concurrency": table.concurrency}  # fmt: skip
        for name, value in given.items():
            if getattr(args, name) is None and value is not None:
                setattr(args, name, value)
        if args.max_turns is None:
            args.max_turns = table.turns()
        args.ops = table.ops
        args.record = {k: v for k, v in (("return_trace", table.return_trace), ("trace_format", table.trace_format))
                       if v is not None}  # fmt: skip
        if args.env_file is None and table.env_file:
            args.env_file = [args.config.parent / f for f in table.env_file]
        configured = (args.policy_config or {}).get("inference_url")
        if isinstance(configured, str) and args.inference_url is None and args.model_path is None:
            args.inference_url = configured  # synth: the task app calls this server
            print(f"eval: the model is called at [eval.policy_config].inference_url {configured} (not served "
                  "here; --inference-url names another server, --model-path serves weights here)", file=sys.stderr)  # fmt: skip
        judges = load_judges(table.judge_specs(), config=args.config, file=str(args.config))
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, dict(value) if isinstance(value, dict) else value)
    if args.seeds is None:
        args.seeds = parse_seeds("0-31")
    if not args.model:
        raise UserError(Problem("no model to evaluate", field="--model",
                                fix="pass --model ID (or set model in the --config file's [eval])"))  # fmt: skip
    return judges


def run(args: argparse.Namespace) -> int:
    experimental.apply(args)
    judges = apply_config(args)
    url, key = task_and_key(args)
    if args.cluster:
        if judges or args.ops or args.record:
            raise UserError(Problem("[eval] judge, ops, return_trace and trace_format are read by a local "
                                    "evaluation only", field="--cluster", file=str(args.config),
                                    fix="run without --cluster, or remove them from the config"))  # fmt: skip
        return run_cluster(args, url, key)
    if args.task_app:
        raise UserError(Problem("--task-app names a TaskApp in the cluster", field="--task-app",
                                fix="pass --cluster, or --task-url URL to reach the task app from here"))  # fmt: skip
    if not key:
        raise UserError(Problem(f"no task app key: ${args.api_key_env} is not set", field="--api-key-env",
                                fix=f"export {args.api_key_env}=<the task app's key> or pass --env-file FILE"))  # fmt: skip
    return run_local(args, url, key, judges)


def run_local(args: argparse.Namespace, url: str, key: str, judges: list[Any] | None = None) -> int:
    from posttrain.evaluation import report
    from posttrain.evaluation.collect import EvalPlan, collect
    from posttrain.evaluation.summary import format_table, summarize
    from posttrain.evaluation.traces import TraceWriter
    from posttrain.inputs import check_output_path
    from posttrain.local.runner import RUNS_DIR
    from posttrain.local.serving import check_inference_url, model_server

    runs_dir = Path(args.runs_dir or RUNS_DIR).resolve()
    name = default_name(args, url)
    run_dir = runs_dir / "evals" / name
    output = check_output_path(args.output or run_dir / "traces.jsonl", flag="--output")
    if args.sqlite is not None:
        check_output_path(args.sqlite, flag="--sqlite")
    if args.results_uri and not args.results_uri.startswith("s3://"):
        raise UserError(Problem(f"not an s3:// URI: {args.results_uri}", field="--results-uri",
                                fix="pass s3://bucket/prefix/"))  # fmt: skip
    rows: list[dict[str, Any]] = []

    def evaluate(inference_url: str, served_name: str) -> float:
        plan = EvalPlan(task_url=url, api_key=key, inference_url=inference_url, model=served_name,
                        seeds=args.seeds, samples=args.samples, split=args.split, env_name=args.env_name,
                        policy_name=args.policy_name, env_config=args.env_config,
                        policy_config=policy_config(args), concurrency=args.concurrency,
                        timeout_s=args.timeout, max_turns=args.max_turns, ops=args.ops, record=args.record,
                        judges=judges or [])  # fmt: skip
        with TraceWriter(output, args.sqlite, env_name=args.env_name, policy_name=args.policy_name) as writer:

            def keep(new: list[dict[str, Any]]) -> None:
                for row in new:
                    row["metadata"]["model"] = args.model  # the id the user evaluates, not the served name
                    writer.write(row)
                    row.pop("trace", None)  # kept only in the database
                    print(report.seed_line(row), flush=True)
                rows.extend(new)

            return collect(plan, keep, show_progress=args.progress)

    print(f"posttrain eval: {args.model} on {url} ({len(args.seeds)} seeds x {args.samples} sample(s), "
          f"split {args.split or 'default'}, concurrency {args.concurrency})", flush=True)  # fmt: skip
    if args.inference_url:
        seconds = evaluate(check_inference_url(args.inference_url), args.model)
    else:
        with model_server(args.model, run_dir=run_dir, runs_dir=runs_dir, model_path=args.model_path,
                          max_model_len=args.max_model_len) as served:  # fmt: skip
            seconds = evaluate(served.inference_url, served.served_name)
    summary = summarize(rows, model=args.model, threshold=args.success_threshold, seconds=seconds)
    summary_path = output.with_name("summary.json")
    summary_path.write_text(json.dumps(summary.as_dict(), indent=2))
    names = [judge.name for judge in judges or []]
    print("\n".join(report.summary_lines(rows, model=args.model, split=args.split, judges=names)))
    print("\n" + "\n".join(report.seed_table(rows, names)) + "\n")
    print(format_table([summary]))
    if summary.pass_at:
        print(f"pass@k {summary.pass_at_source}")
    print(f"traces: {output} ({len(rows)} rows){f'; sqlite: {args.sqlite}' if args.sqlite else ''}")
    print(f"summary: {summary_path}")
    if args.results_uri:
        upload_results(args.results_uri, [output, summary_path])
    return EXIT_ROLLOUTS_FAILED if summary.errors else 0


def upload_results(uri: str, files: list[Path]) -> None:
    from posttrain.dataset_upload import S3_VARIABLES, s3_configured

    if not s3_configured():
        raise UserError(Problem("cannot upload the results", field="--results-uri",
                                fix=f"set {', '.join(S3_VARIABLES)}"))  # fmt: skip
    from posttrain import storage

    bucket, prefix = storage.parse_s3_uri(uri)
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    client = storage.client_from_env({"endpoint": os.environ["S3_ENDPOINT"], "bucket": bucket})
    storage.ensure_bucket(client, bucket)
    for path in files:
        client.fput_object(bucket, prefix + path.name, str(path))
    print(f"results: s3://{bucket}/{prefix}")


# -- cluster -------------------------------------------------------------------------------------------------


def _forwarded_args(args: argparse.Namespace, task_url: str, base_model_uri: str = "") -> list[str]:
    """The flags the Job's `posttrain eval` gets (the key travels as a Secret, never as a flag). A base
    model id is read where the operator's jobs read it (POSTTRAIN_BASE_MODEL_URI, an s3:// folder)."""
    from posttrain.api.model_ids import is_fine_tuned_id

    model_path = args.model_path
    if model_path is None and not args.inference_url and not is_fine_tuned_id(args.model) and base_model_uri:
        uri = base_model_uri.format(base=args.model)
        model_path = uri if uri.startswith("s3://") else None  # else the id itself, as the operator serves it
    from posttrain.evaluation.summary import format_seeds

    out = ["--task-url", task_url, "--model", args.model, "--seeds", format_seeds(args.seeds),
           "--samples", str(args.samples), "--env-name", args.env_name, "--policy-name", args.policy_name,
           "--concurrency", str(args.concurrency), "--timeout", str(args.timeout), "--max-turns",
           str(args.max_turns), "--success-threshold", str(args.success_threshold),
           "--max-model-len", str(args.max_model_len)]  # fmt: skip
    for flag, value in (("--split", args.split), ("--inference-url", args.inference_url),
                        ("--model-path", model_path), ("--max-tokens", args.max_tokens),
                        ("--temperature", args.temperature), ("--name", args.name)):  # fmt: skip
        if value is not None:
            out += [flag, str(value)]
    if args.env_config:
        out += ["--env-config", json.dumps(args.env_config)]
    if args.policy_config:
        out += ["--policy-config", json.dumps(args.policy_config)]
    return out


def _task_app(api: Any, namespace: str, name: str) -> tuple[str, str | None]:
    """(URL, key Secret name) of a TaskApp object."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from posttrain.commands.status import GROUP, VERSION

    try:
        obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "taskapps", name
        )
    except ApiException as err:
        if err.status == 404:
            raise UserError(Problem(f"no TaskApp {namespace}/{name}", field="--task-app",
                                    fix="kubectl get taskapps -n NAMESPACE, or pass --task-url")) from None  # fmt: skip
        raise
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    url = status.get("url") or spec.get("url")
    if not url:
        from posttrain.controller.objects import parse_task_app
        from posttrain.controller.render.taskapp import task_app_service_url

        url = task_app_service_url(parse_task_app(obj))
    secret = (spec.get("apiKeySecretRef") or {}).get("name")
    return str(url), secret


def run_cluster(args: argparse.Namespace, url: str | None, key: str | None) -> int:
    from kubernetes import client

    from posttrain.commands.train import FIELD_MANAGER, apply_key_secret
    from posttrain.controller.settings import load_settings
    from posttrain.evaluation.cluster import job_phase, render_eval_job, results_uri
    from posttrain.kubeaccess import load_kube

    if args.output or args.sqlite or args.results_uri:
        raise UserError(Problem("--output / --sqlite / --results-uri are for a local evaluation", field="--cluster",
                                fix="a cluster evaluation stores its traces in S3 (printed at the end)"))  # fmt: skip
    api, namespace = load_kube(args.context)
    namespace = args.namespace or namespace
    settings = load_settings()
    secret = args.api_key_secret
    if args.task_app:
        url, app_secret = _task_app(api, namespace, args.task_app)
        secret = secret or app_secret
    if not secret:
        if not key:
            raise UserError(Problem(f"no task app key: ${args.api_key_env} is not set and no Secret is named",
                                    field="--api-key-secret",
                                    fix=f"export {args.api_key_env}=... or pass --api-key-secret NAME"))  # fmt: skip
        secret = apply_key_secret(api, namespace, key)
    name = default_name(args, url or args.task_app or "")
    results = results_uri(settings.s3_bucket, namespace, name)
    forwarded = _forwarded_args(args, url, settings.base_model_uri)
    manifest = render_eval_job(
        name=name, namespace=namespace, image=args.image or settings.rollout_image,
        eval_args=forwarded, results=results, api_key_secret=secret,
        s3_endpoint=settings.s3_endpoint, s3_secret=settings.s3_secret_name, gpus=args.gpus,
        pull_policy=settings.image_pull_policy,
    )  # fmt: skip
    batch = client.BatchV1Api(api)
    batch.patch_namespaced_job(name, namespace, manifest, field_manager=FIELD_MANAGER, force=True,
                               _content_type="application/apply-patch+yaml")  # fmt: skip
    print(f"applied Job {namespace}/{name}: posttrain eval {' '.join(shlex.quote(a) for a in forwarded)}")
    print(f"results will be at {results} (logs: posttrain logs {name} -n {namespace})", flush=True)
    if not args.wait:
        return 0
    deadline = time.monotonic() + args.wait_timeout
    last = None
    while True:
        job = batch.read_namespaced_job(name, namespace).to_dict()
        phase, message = job_phase(_camel(job))
        if phase != last:
            print(f"phase: {phase:<13}{message}".rstrip(), flush=True)
            last = phase
        if phase in ("Succeeded", "Failed"):
            break
        if time.monotonic() > deadline:
            print(
                f"still {phase} after {args.wait_timeout:.0f} s; follow with: posttrain logs {name} -f -n {namespace}"
            )
            return 4
        time.sleep(2.0)
    if phase == "Failed":
        print(f"failed: see `posttrain logs {name} -n {namespace}`", file=sys.stderr)
        return EXIT_ROLLOUTS_FAILED
    print_remote_summary(results)
    return 0


def _camel(job: dict[str, Any]) -> dict[str, Any]:
    """The kubernetes client's to_dict() is snake_case; job_phase reads the API's field names."""
    status = job.get("status") or {}
    return {"status": {"active": status.get("active"),
                       "conditions": [{"type": c.get("type"), "status": c.get("status"), "reason": c.get("reason"),
                                       "message": c.get("message")} for c in status.get("conditions") or []]}}  # fmt: skip


def print_remote_summary(results: str) -> None:
    from posttrain.dataset_upload import s3_configured

    if not s3_configured():
        print(f"results: {results} (set S3_ENDPOINT and keys here to print the summary)")
        return
    from posttrain import storage
    from posttrain.evaluation.summary import Summary, format_table

    bucket, prefix = storage.parse_s3_uri(results)
    client = storage.client_from_env({"endpoint": os.environ["S3_ENDPOINT"], "bucket": bucket})
    try:
        data = storage.get_json(client, bucket, prefix + "summary.json")
    except Exception as err:  # an evaluation that uploaded nothing: say where to look
        print(f"results: {results} (no summary.json: {type(err).__name__})")
        return
    pass_at = {int(k.split("@")[1]): v for k, v in (data.get("pass_at") or {}).items()}
    summary = Summary(**{**data, "pass_at": pass_at})
    print(format_table([summary]))
    print(f"results: {results}")
