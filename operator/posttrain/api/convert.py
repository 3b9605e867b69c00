"""TOML <-> custom resource, and spec -> the normalised synth config the trainer reads.

- `config_to_spec(config, kind)`: a validated RLConfig/SFTConfig -> the RLJob/SFTJob spec (camelCase).
- `spec_to_config(spec)`: an RLJob/SFTJob spec (posttrain.api.resources.parse_spec) -> the normalised
  snake_case synth config (unknown keys inline). spec_to_config(parse_spec(config_to_spec(c))) ==
  normalized_config(c).
- `toml_to_cr(text, ...)`: what `posttrain convert` does (flags as in synth: --model, --task-url, ...).
- `load(text, ...)`: TOML text -> (kind, validated config, warnings), UserError with file:line for every
  problem; `toml_file_to_cr(path, ...)`: the custom resource from a file.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from posttrain.api import extras, model_ids
from posttrain.api.base import CR_CONTEXT, EXTRAS_KEY
from posttrain.api.config import (
    ConfigError,
    RLConfig,
    SFTConfig,
    infer_type,
    load_config,
    sft_trainer_mode,
)
from posttrain.api.depth_policy import SPEC_DEPTH, too_deep
from posttrain.api.literal_secrets import literal_secrets
from posttrain.api.overrides import apply_overrides, attribute
from posttrain.api.resources import API_VERSION, JOB_KINDS, RLJobSpec, SFTJobSpec
from posttrain.api.urls import UrlRefused, check_url
from posttrain.errors import Problem, UserError
from posttrain.toml_locate import locate

PLACEHOLDER_URLS = {"", "placeholder"}
SECRET_FIX = ("remove it: keep the key in a Secret and name it ([judge.api_key_secret_ref], --api-key-secret, "
              "apiKeySecretRef), or for a local run name an environment variable (api_key_env)")  # fmt: skip
# spec fields that are the operator's business, not the trainer's config (snake_case)
OPERATOR_ONLY = (
    "suspend",
    "task_app",
    "original_toml",
    "images",
    "scheduling",
    "active_deadline_seconds",
    "storage",
    "dataset",
    "validation_dataset",
)


# ------------------------------------------------------------------------------------ config <-> spec


def _dump_cr(model: Any) -> dict[str, Any]:
    return model.model_dump(by_alias=True, exclude_none=True, context=CR_CONTEXT)


def config_to_spec(config: RLConfig | SFTConfig, kind: str) -> dict[str, Any]:
    """A validated config -> the job spec (camelCase; unknown keys under each section's `extras`)."""
    data = _dump_cr(config)
    extras: dict[str, Any] = dict(data.pop(EXTRAS_KEY, {}) or {})
    if kind == "rl":
        assert isinstance(config, RLConfig)
        services = data.pop("services", None) or {}
        spec: dict[str, Any] = {}
        task_url = services.pop("taskUrl", None)
        if task_url and task_url not in PLACEHOLDER_URLS:
            spec["taskApp"] = {"url": task_url}
        judge_url = services.pop("judgeUrl", None)
        if judge_url:
            data.setdefault("judge", {})["url"] = judge_url
        services_extras = services.pop(EXTRAS_KEY, None)
        if services_extras:
            extras["services"] = services_extras
        spec.update(data)
    else:
        assert isinstance(config, SFTConfig)
        job = data.pop("job")
        model_id = job.pop("model")
        model: dict[str, Any] = {"source" if model_ids.is_fine_tuned_id(model_id) else "base": model_id}
        model["trainerMode"] = sft_trainer_mode(config)
        spec = {"model": model}
        if job:
            spec["job"] = job
        spec.update(data)
    if extras:
        spec[EXTRAS_KEY] = extras
    # validate the shape (raises on a programming error, not on user input: the config was valid)
    spec_class = RLJobSpec if kind == "rl" else SFTJobSpec
    if kind == "rl" and "taskApp" not in spec:
        probe = {**spec, "taskApp": {"url": "http://x"}}
        spec_class.model_validate(probe, context=CR_CONTEXT)
    else:
        spec_class.model_validate(spec, context=CR_CONTEXT)
    return spec


def spec_to_config(spec: RLJobSpec | SFTJobSpec) -> dict[str, Any]:
    """A job's spec -> the normalised snake_case synth config of its job file: the fields the spec sets
    (unknown keys inline, as in the TOML), without what only the operator acts on; an RL job's task app
    URL and judge URL back under [services], an SFT job's model back in [job]. The trainer's settings are
    resolved from it once, typed (posttrain.api.jobfile.build_jobfile, posttrain.api.settings); the trainer
    reads the dict itself only for what it forwards as it is (env and policy config, judge, step rewards)."""
    data = spec.model_dump(exclude_unset=True, exclude_none=True, by_alias=False)
    task_app = data.get("task_app") or {}
    for key in OPERATOR_ONLY:
        data.pop(key, None)
    if isinstance(spec, RLJobSpec):
        services = data.get("services") if isinstance(data.get("services"), dict) else {}
        if task_app.get("url"):
            services["task_url"] = task_app["url"]
        judge = data.get("judge")
        if isinstance(judge, dict):
            judge.pop("api_key_secret_ref", None)
            if judge.get("url"):
                services["judge_url"] = judge.pop("url")
            if not judge:
                data.pop("judge")
        if services:
            data["services"] = services
    else:
        model = data.pop("model", None) or {}
        job = data.get("job") or {}
        if model.get("source") or model.get("base"):
            job["model"] = model.get("source") or model.get("base")
        data["job"] = job
    return data


# ------------------------------------------------------------------------------------ TOML -> CR


def _problems_with_lines(problems: list[Problem], text: str | None, file: str | None) -> list[Problem]:
    out = []
    for p in problems:
        line = p.line or (locate(text, p.field) if text else None)
        out.append(Problem(p.message, file=file or p.file, line=line, field=p.field, fix=p.fix))
    return out


def _all_problems(
    problems: list[Problem], numbers: list[Problem], text: str, file: str | None
) -> list[Problem]:
    """Every problem once (a non-finite or oversized number the schema also refused is reported by the
    schema), in the order of the file's lines."""
    seen = {p.field for p in problems}
    merged = _problems_with_lines(problems + [n for n in numbers if n.field not in seen], text, file)
    return sorted(merged, key=lambda p: (p.line is None, p.line or 0))


def parse_toml(text: str, file: str | None = None) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        match = re.search(r"line (\d+)", str(err))
        raise UserError(
            Problem(
                f"not valid TOML: {err}",
                file=file,
                line=int(match.group(1)) if match else None,
                fix="fix the TOML syntax",
            )  # fmt: skip
        ) from err


def detect_kind(raw: dict[str, Any], requested: str | None, file: str | None = None) -> str:
    inferred = infer_type(raw)
    if requested and inferred and requested != inferred:
        raise UserError(Problem(f"--type {requested} but this is an {inferred} config", file=file,
                                fix=f"pass --type {inferred} or fix [algorithm]"))  # fmt: skip
    if requested is None and inferred in ("eval", "filter"):
        raise UserError(Problem(f"this is a synth {inferred} config ([{inferred}]), not an RL or SFT job", file=file,
                                field=inferred, fix=f"run it with posttrain {inferred} --config FILE; check it with "
                                "posttrain validate --config FILE"))  # fmt: skip
    kind = requested or inferred
    if kind not in ("rl", "sft"):
        raise UserError(Problem("cannot tell whether this is an RL or SFT config", file=file, field="algorithm",
                                fix="pass --type rl or --type sft (or add [algorithm])"))  # fmt: skip
    return kind


def apply_model_override(raw: dict[str, Any], kind: str, model: str) -> dict[str, Any]:
    """--model: a fine-tuned id becomes model.source (clearing base); a base id becomes model.base."""
    raw = copy.deepcopy(raw)
    if kind == "sft":
        raw.setdefault("job", {})["model"] = model
        return raw
    key, other = ("source", "base") if model_ids.is_fine_tuned_id(model) else ("base", "source")
    if isinstance(raw.get("model"), dict) or not isinstance(raw.get("policy"), dict):
        section = raw.setdefault("model", {})
        section[key] = model
        section.pop(other, None)
    else:
        policy = raw["policy"]
        for k in ("model", "model_name", "source"):
            policy.pop(k, None)
        policy["source" if key == "source" else "model_name"] = model
    return raw


def _with_misspelled_sections(problems: list[Problem], raw: dict[str, Any], kind: str) -> list[Problem]:
    """A misspelled section (`[trainig]`) is named beside the missing keys it causes, with a did-you-mean."""
    known = set((RLConfig if kind == "rl" else SFTConfig).model_fields)
    typos = extras.misspelled_sections(raw, known)
    if not typos:
        return problems
    missing = {(p.field or "").split(".", 1)[0] for p in problems if p.message == "required field is missing"}
    # only where the section it resembles lacks required keys: otherwise it stays a warning (kept, passed on)
    typos = {typo: suggestion for typo, suggestion in typos.items() if suggestion in missing}
    meant = {suggestion: typo for typo, suggestion in typos.items()}
    out = []
    for p in problems:
        section = (p.field or "").split(".", 1)[0]
        if section in meant and p.message == "required field is missing":
            p = Problem(f"{p.message} (the file has [{meant[section]}]: did you mean [{section}]?)",
                        field=p.field, fix=p.fix, file=p.file, line=p.line)  # fmt: skip
        out.append(p)
    for typo, suggestion in typos.items():
        out.append(Problem(f"unknown section [{typo}] (did you mean [{suggestion}]?)", field=typo,
                           fix=f"rename [{typo}] to [{suggestion}]"))  # fmt: skip
    return out


def load(
    text: str,
    *,
    kind: str | None = None,
    file: str | None = None,
    model: str | None = None,
    overrides: list[tuple[str, Any]] | None = None,
) -> tuple[str, RLConfig | SFTConfig, list[str]]:
    """TOML text -> (kind, validated config, warnings); UserError with file:line per problem. `overrides`:
    `--set KEY=VALUE` pairs (api/overrides.py), validated as the fields they replace."""
    try:
        return _load(text, kind=kind, file=file, model=model, overrides=overrides)
    except UserError as err:
        if not overrides:
            raise
        raise UserError(attribute(err.problems, overrides)) from err


def _load(
    text: str,
    *,
    kind: str | None,
    file: str | None,
    model: str | None,
    overrides: list[tuple[str, Any]] | None,
) -> tuple[str, RLConfig | SFTConfig, list[str]]:
    raw = apply_overrides(parse_toml(text, file), overrides)
    # The API server refuses a spec nested deeper than SPEC_DEPTH (api/depth_policy.py); a section's
    # unknown keys go one level down, under `extras`.
    deep = too_deep(raw, SPEC_DEPTH - 1)
    if deep is not None:
        problem = Problem(f"nested deeper than {SPEC_DEPTH - 1} levels of tables and arrays", field=deep,
                          fix="flatten this value; the cluster refuses deeper specs")  # fmt: skip
        raise UserError(_all_problems([problem], [], text, file))
    secrets = [Problem("a literal secret in the config (it would travel into the custom resource, git and "
                       "the job's files)", file=file, line=locate(text, path), field=path, fix=SECRET_FIX)
               for path in literal_secrets(raw)]  # fmt: skip
    if secrets:
        raise UserError(secrets)
    numbers = [Problem(m, field=path, fix=f) for path, m, f in extras.number_problems(raw)]
    kind = detect_kind(raw, kind, file)
    if model:
        raw = apply_model_override(raw, kind, model)
    try:
        config, warnings = load_config(raw, kind)
    except ConfigError as err:
        raise UserError(
            _all_problems(_with_misspelled_sections(err.problems, raw, kind), numbers, text, file)
        ) from err
    bounds = [Problem(m, field=path, fix=f) for path, m, f in extras.passthrough_problems(config)]
    if bounds or numbers:
        raise UserError(_all_problems(bounds, numbers, text, file))
    located = []
    for path, suggestion, is_table in extras.unknown_keys(config):
        line = locate(text, path) if text else None
        where = f"{file}:{line}: " if file and line else (f"{file}: " if file else "")
        located.append((line or 0, where + extras.unknown_key_warning(path, suggestion, is_table)))
    warnings += [warning for _, warning in sorted(located, key=lambda item: item[0])]  # in line order
    return kind, config, warnings


def _dns_label(text: str) -> str:
    text = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return re.sub(r"-{2,}", "-", text)[:40].strip("-")


def content_name(kind: str, spec: dict[str, Any]) -> str:
    """A name derived from the content: the same TOML and flags always give the same object."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:8]
    label = spec.get("model", {}).get("label") or (spec.get("tags") or {}).get("name") or ""
    prefix = _dns_label(str(label)) or kind
    return f"{prefix}-{digest}"


def toml_to_cr(
    text: str,
    *,
    kind: str | None = None,
    name: str | None = None,
    namespace: str | None = None,
    model: str | None = None,
    task_url: str | None = None,
    task_app: str | None = None,
    api_key_secret: str | None = None,
    dataset: str | dict[str, Any] | None = None,
    validation_dataset: str | dict[str, Any] | None = None,
    file: str | None = None,
    env: dict[str, str] | None = None,
    queue: str | None = None,
    priority_class: str | None = None,
    overrides: list[tuple[str, Any]] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """`posttrain convert`: TOML text -> (custom resource dict, warnings). `dataset` / `validation_dataset`
    are s3:// URIs (the command uploads local files first) or dataset refs ({"configMapRef": ...}); a local
    path, given or in the TOML, is refused: the cluster cannot read it. `queue` names a Kueue LocalQueue
    (spec.scheduling.queueName: the job's pods wait for Kueue's admission), `priority_class` its Kueue
    WorkloadPriorityClass (spec.scheduling.workloadPriorityClassName)."""
    env = dict(os.environ) if env is None else env
    kind, config, warnings = load(text, kind=kind, file=file, model=model, overrides=overrides)
    judge = config.judge if isinstance(config, RLConfig) else None
    if judge is not None and judge.cluster_problems():
        raise UserError([Problem(message, file=file, line=locate(text, f"judge.{field}"), field=f"judge.{field}",
                                 fix=_judge_fix(field, fix)) for field, message, fix in judge.cluster_problems()])  # fmt: skip
    spec = config_to_spec(config, kind)
    if kind == "rl":
        url = task_url or env.get("TASK_APP_URL") or (spec.get("taskApp") or {}).get("url")
        if task_app and (task_url or env.get("TASK_APP_URL")):
            raise UserError(Problem("--task-app and --task-url both name the task app", file=file,
                                    fix="pass one of them"))  # fmt: skip
        if task_app:
            spec["taskApp"] = {"name": task_app}
        elif url and url not in PLACEHOLDER_URLS:
            given = "--task-url" if task_url else ("TASK_APP_URL" if env.get("TASK_APP_URL") else None)
            spec["taskApp"] = {"url": _checked_task_url(url, given, text, file)}
        else:
            raise UserError(
                Problem(
                    "no task app: the config has no services.task_url",
                    file=file,
                    line=locate(text, "services.task_url"),
                    field="services.task_url",
                    fix="pass --task-url URL or --task-app NAME (a TaskApp), or set [services] task_url",
                )  # fmt: skip
            )
        if api_key_secret:
            spec["taskApp"]["apiKeySecretRef"] = {"name": api_key_secret, "key": "ENVIRONMENT_API_KEY"}
    else:
        if api_key_secret:
            warnings.append("--api-key-secret is ignored for SFT (no task app)")
        if task_url or task_app:
            warnings.append("--task-url/--task-app are ignored for SFT (no task app)")
        job = spec.get("job") or {}
        uri = dataset or job.get("data")
        validation = validation_dataset or (spec.get("data") or {}).get("validationPath")
        for value, field in ((uri, "job.data"), (validation, "data.validation_path")):
            if value and not isinstance(value, dict) and not str(value).startswith("s3://"):
                raise UserError(Problem(f"{value} is not an s3:// URI: a cluster job cannot read a local file",
                                        file=file, line=locate(text, field), field=field,
                                        fix="upload it (posttrain convert does so when S3_ENDPOINT and keys are "
                                            "set) or use an s3:// URI"))  # fmt: skip
        if uri:
            spec["dataset"] = uri if isinstance(uri, dict) else {"uri": uri}
        else:
            warnings.append(
                "the SFTJob names no dataset (spec.dataset): pass --dataset s3://... or use `posttrain train`, "
                "which uploads [job].data"
            )
        if validation:
            spec["validationDataset"] = validation if isinstance(validation, dict) else {"uri": validation}
    source = (spec.get("model") or {}).get("source")
    owner = model_ids.weights_namespace(str(source)) if source else None
    if namespace and owner and owner != namespace:
        warnings.append(
            f"model.source is a model of namespace {owner!r}: the operator fails this job unless {owner!r} "
            f"shares its models with {namespace!r} (POSTTRAIN_SHARED_MODELS, docs/storage.md)"
        )
    if queue:
        spec["scheduling"] = {"queueName": queue}
        if priority_class:
            spec["scheduling"]["workloadPriorityClassName"] = priority_class
    spec["originalToml"] = text
    metadata: dict[str, Any] = {"name": name or content_name(kind, spec)}
    if namespace:
        metadata["namespace"] = namespace
    # key order: taskApp first, then the TOML's sections, originalToml last (readable YAML)
    head = {k: spec[k] for k in ("taskApp", "model") if k in spec}
    spec = (
        head
        | {k: v for k, v in spec.items() if k not in head and k != "originalToml"}
        | {"originalToml": text}
    )
    resource = {"apiVersion": API_VERSION, "kind": JOB_KINDS[kind], "metadata": metadata, "spec": spec}
    return resource, warnings


def _judge_fix(field: str, fix: str) -> str:
    """A judge without its key's Secret: the flags that name one without editing the TOML come first."""
    if field != "api_key_secret_ref":
        return fix
    return ("pass --judge-key-secret NAME[:KEY] (convert) or --set judge.api_key_secret_ref.name=NAME, "
            f"naming a Secret that holds the key; or {fix}")  # fmt: skip


def _checked_task_url(url: str, given: str | None, text: str, file: str | None) -> str:
    """posttrain.api.urls' rule for a URL from the command line or the environment ([services].task_url
    was checked with the config); the problem names where the URL came from."""
    try:
        return check_url(url)
    except UrlRefused as err:
        where = {"file": None, "line": None} if given else {"file": file, "line": locate(text, "services.task_url")}
        raise UserError(Problem(f"the task app URL {err.reason}", field=given or "services.task_url", fix=err.fix,
                                **where)) from None  # fmt: skip


def read_config(path: str | Path) -> str:
    """A TOML config's text, or a one-line refusal: missing, not a regular file (a FIFO would hang), binary,
    not UTF-8, a byte-order mark (tomllib would call it an "Invalid statement")."""
    from posttrain.inputs import read_text_input

    return read_text_input(path, what="config", field="--config")


_read = read_config  # the name the commands used


def toml_file_to_cr(
    path: str | Path,
    kind: str | None = None,
    name: str | None = None,
    namespace: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """A TOML file -> the custom resource dict (see toml_to_cr)."""
    resource, _ = toml_to_cr(_read(path), kind=kind, name=name, namespace=namespace, file=str(path), **kwargs)
    return resource


def to_yaml(resource: dict[str, Any]) -> str:
    """Stable YAML: keys in model order, multi-line strings as literal blocks."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        if "\n" in value:
            return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
        return dumper.represent_scalar("tag:yaml.org,2002:str", value)

    _Dumper.add_representer(str, _str)
    return yaml.dump(resource, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110)
