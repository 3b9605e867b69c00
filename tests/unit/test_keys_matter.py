"""Every key the TOML models accept changes what runs, or says plainly that it does not.

The keys come from the models (every leaf of RLConfig and SFTConfig, walked; no hand list). For each key, a
valid value other than the base config's is generated from the field's type, bounds and Literal choices (a
small table gives a sample where generation cannot: ids, URLs, GPU splits). The key matters when that value
changes at least one of
  - the trainer's typed settings in the job file the operator renders (posttrain.controller.render), and the
    settings the local runner resolves (posttrain.api.settings.settings_for of the normalised config),
  - the task app's /rollout request the trainer builds from those settings
    (posttrain_trainer.rollouts.build_rollout_request),
  - the objects the operator renders (Deployments, the trainer Job, Services, the job's Secret, ...);
the job file's `config` (the record of the TOML, which nothing reads) is left out of the comparison. A key
that changes none of them must be in posttrain.api.inert (RL_INERT / SFT_INERT, with its reason; `validate`
warns about it) or be one whose value posttrain fixes (RL_FIXED). A key listed as inert that does change
something is a stale entry."""

from __future__ import annotations

import base64
import json
import re
import typing
from functools import cache
from pathlib import Path
from typing import Any, Literal

import annotated_types
import pytest
from fixtures.jobs import UID, job_object
from posttrain.api.config import RLConfig, SFTConfig, normalized_config
from posttrain.api.convert import load, toml_to_cr
from posttrain.api.fields import metadata_of, strip_annotated
from posttrain.api.inert import RECORD_ONLY, RL_FIXED, RL_INERT, SFT_INERT
from posttrain.api.settings import SFT_EVAL_KEYS, settings_for
from posttrain.controller import render
from posttrain.controller.objects import parse_job
from posttrain.controller.render.taskapp import TaskAppTarget
from posttrain.controller.settings import OperatorSettings
from posttrain.errors import UserError
from posttrain_trainer.rollouts import build_rollout_request
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

REPO = Path(__file__).resolve().parents[2]
RL_BASE = (REPO / "examples" / "demo" / "rl.toml").read_text() + '\n[services]\ntask_url = "http://math.tasks.svc:8000"\n'
SFT_BASE = (REPO / "examples" / "sft_lora.toml").read_text().replace(
    'data = "examples/datasets/math_chat.jsonl"', 'data = "s3://bkt/data/train.jsonl"'
)
# [policy] names the model and sets the sampling defaults: the base for the [policy] keys (with [model] and
# rollout.policy_config's sampling keys present, those win over [policy]'s: docs/reference/toml.md)
RL_POLICY_BASE = (
    RL_BASE.replace('[model]\nbase = "HuggingFaceTB/SmolLM2-135M-Instruct"\ntrainer_mode = "lora"\nlabel = "demo-rl"\n', "")
    .replace("temperature = 1.0\ntop_p = 1.0\n", "")
    .replace("max_tokens = 16 ", "# max_tokens = 16 ")
    + '\n[policy]\nmodel_name = "HuggingFaceTB/SmolLM2-135M-Instruct"\ntrainer_mode = "lora"\nlabel = "demo-rl"\n'
)
# [compute.topology] with the reference's GPUs and placement left to derive (one GPU spare): the base for the
# GPU split and the reference placement
RL_SPLIT_BASE = (
    RL_BASE.replace("gpus_for_ref = 0\n", "").replace('reference_placement = "none"\n', "")
    .replace("gpus_for_training = 1\n", "").replace("gpu_count = 2", "gpu_count = 3")
)
# no [training.validation]: the base for the evaluation keys synth also reads from [hyperparameters]
# ([training.validation] wins where both are given)
SFT_NO_VALIDATION_BASE = SFT_BASE[: SFT_BASE.index("[training.validation]")] + SFT_BASE[SFT_BASE.index("[training.lora]"):]
SFT_DATA_PATH_BASE = SFT_BASE.replace('data = "s3://bkt/data/train.jsonl"', 'data_path = "s3://bkt/data/train.jsonl"')
OPERATOR = OperatorSettings(trainer_image="reg/trainer:1", rollout_image="reg/rollout:1", s3_bucket="bkt")


class With:
    """A sample that needs companion keys to be valid (a GPU split that must add up); the comparison is
    against the base with the same companions, so only the key itself makes the difference."""

    def __init__(self, value: Any, **companions: Any):
        self.value = value
        self.companions = [(k.replace("__", "."), v) for k, v in companions.items()]


# Where a value cannot be generated from the type alone: ids, URLs, GPU splits that must add up, names the
# trainer knows. Each is a valid value for its key, other than the base's.
SAMPLES: dict[str, list[Any]] = {
    "compute.topology.tensor_parallel": [With(2, compute__topology__gpus_for_vllm=2)],
    "compute.nodes": [With(2, compute__topology__gpus_for_training=2)],
    "compute.topology.reference_placement": ["dedicated"],
    "reference.placement": ["dedicated"],
    "training.parallelism.fsdp": [With(True, model__trainer_mode="full")],
    "model.base": ["Qwen/Qwen3-4B"],
    "policy.model_name": ["Qwen/Qwen3-4B"],
    "policy.inference_url": ["http://vllm.example:8000"],
    "job.model": ["Qwen/Qwen3-8B"],
    "services.task_url": ["http://other-task.tasks.svc:8000"],
    "services.judge_url": ["http://judge.tasks.svc:8000"],
    "judge.url": ["http://judge.tasks.svc:8000"],
    "compute.gpu_type": ["H100", "A100"],
    "compute.topology.type": ["multi_node"],
    "rollout.ops": [["agent", "env", "env"], ["env", "agent"]],
    "training.step_rewards_strategy": ["per_achievement"],
    "training.rewards.step_rewards_strategy": ["per_achievement"],
    "training.lora.target_modules": [["q_proj", "v_proj"]],
    "training.weight_sync.targets": [["policy", "reference"]],
    "training.weight_sync.mode": ["lora"],
    "vllm.tool_call_parser": ["llama3_json"],
    "vllm.limit_mm_per_prompt": [{"image": 2}],
    "data.validation_path": ["s3://bkt/data/val.jsonl"],
    "job.data": ["s3://bkt/data/other.jsonl"],
    "job.data_path": ["s3://bkt/data/other.jsonl"],
    "training.validation.metric_for_best_model": ["perplexity"],
    "hyperparameters.metric_for_best_model": ["perplexity"],
    "training.validation.evaluation_strategy": ["epoch"],
    "hyperparameters.evaluation_strategy": ["epoch"],
    "training.mode": ["full_finetune", "qlora"],
    "rl:algorithm.variety": ["dapo", "restem"],  # (an SFT config's variety must agree with its other keys)
}
# the judge's keys ([judge], [rubric], services.judge_url) are tested with the judge's settings
# (tests/unit/test_judge_settings.py)
SKIP_PREFIXES = ("judge.", "rubric.", "services.judge_url")


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def leaves(model: type[BaseModel], path: str = "") -> list[tuple[str, FieldInfo]]:
    """Every leaf key of a TOML model with its field, walked from the model."""
    out = []
    for name, field in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        sub = _models(field.annotation)
        out += leaves(sub[0], key) if sub else [(key, field)]
    return out


def _bounds(field: FieldInfo) -> tuple[float | None, float | None, bool]:
    lo = hi = None
    strict = False
    for meta in metadata_of(field):
        if isinstance(meta, annotated_types.Ge):
            lo = meta.ge
        elif isinstance(meta, annotated_types.Gt):
            lo, strict = meta.gt, True
        elif isinstance(meta, annotated_types.Le):
            hi = meta.le
        elif isinstance(meta, annotated_types.Lt):
            hi = meta.lt
    return lo, hi, strict


def _scalar(annotation: Any) -> Any:
    annotation = strip_annotated(annotation)
    if typing.get_origin(annotation) in (typing.Union, __import__("types").UnionType):
        args = [strip_annotated(a) for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else tuple(args)
    return annotation


def candidates(kind: str, key: str, field: FieldInfo) -> list[Any]:
    """Valid values for a key, generated from its type, bounds and choices (SAMPLES where that cannot)."""
    for name in (f"{kind}:{key}", key):
        if name in SAMPLES:
            return SAMPLES[name]
    kind = _scalar(field.annotation)
    origin = typing.get_origin(kind)
    if origin is Literal:
        return list(typing.get_args(kind))
    if kind is bool:
        return [True, False]
    if kind in (int, float):
        lo, hi, strict = _bounds(field)
        if hi is not None and hi <= 0:
            values = [hi - 0.5, hi - 2.0]
        else:
            start = 0 if lo is None else lo
            values = [start + 1, start + 2, start + 3, start + 7] if kind is int else [
                start + 0.25, start + 0.5, start + 0.75, start + 3.0]  # fmt: skip
            if lo is not None and not strict and kind is int:
                values.append(lo)
        values = [v for v in values if (hi is None or v <= hi) and (lo is None or v > lo or (v == lo and not strict))]
        return [int(v) if kind is int else float(v) for v in values]
    if kind is str:
        return ["posttrain-sample"]
    if origin is list:
        (item,) = typing.get_args(kind)
        item = strip_annotated(item)
        if typing.get_origin(item) is Literal:
            return [[typing.get_args(item)[0]], [typing.get_args(item)[-1]]]
        return [[3, 5]] if item is int else [["posttrain-sample"]]
    if origin is dict:
        _, value = typing.get_args(kind)
        value = strip_annotated(value)
        return [{"image": 2}] if value is int else [{"sample": 0.5}] if value is float else [{"sample": "x"}]
    raise AssertionError(f"{key}: no value generated for {kind!r}; add one to SAMPLES")


def _comparable(out: Any) -> dict[str, Any]:
    secret = dict(out.secret)
    data = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
    jobfile = json.loads(data.pop("job.json"))
    jobfile.pop("config", None)  # the record of the TOML: nothing reads it
    secret["data"] = data
    return {"children": out.children, "secret": secret, "jobfile": jobfile}


def observe(kind: str, base: str, overrides: list[tuple[str, Any]]) -> dict[str, Any] | None:
    """What a config does: the operator's rendered objects and job file (less its record), the local
    runner's settings and the rollout request; None when the value is refused."""
    try:
        cr, _ = toml_to_cr(base, file="job.toml", env={}, overrides=overrides)
        name = re.sub(r"-[0-9a-f]{8}$", "", cr["metadata"]["name"])  # the label's part, not the config's hash
        job = parse_job(job_object(cr["kind"], cr["spec"], name=name, namespace="default", uid=UID))
        url = (cr["spec"].get("taskApp") or {}).get("url")
        target = TaskAppTarget(url=url, secret_name="task-key", name=None) if url else None
        operator = _comparable(render.render_job(job, OPERATOR, target))
        _, config, _ = load(base, file="job.toml", overrides=overrides)
        local = settings_for(kind, normalized_config(config))
    except (UserError, ValidationError, ValueError):
        return None
    seen = {"operator": operator, "local": local.model_dump(mode="json")}
    if kind == "rl":
        seen["request"] = build_rollout_request(settings=local.rollout, model="m", run_id="r", seed=1, url="u")
    return json.loads(json.dumps(seen, default=str, sort_keys=True))


def base_of(kind: str, key: str) -> str:
    if kind == "rl" and key.startswith("policy."):
        return RL_POLICY_BASE
    if kind == "rl" and key.startswith(("compute.", "reference.")):
        return RL_SPLIT_BASE
    if kind == "sft" and key.startswith("hyperparameters.") and key.rpartition(".")[2] in SFT_EVAL_KEYS:
        return SFT_NO_VALIDATION_BASE
    if kind == "sft" and key == "job.data_path":
        return SFT_DATA_PATH_BASE
    return RL_BASE if kind == "rl" else SFT_BASE


@cache
def _observed(kind: str, base: str, companions: str) -> dict[str, Any] | None:
    return observe(kind, base, json.loads(companions))


def _current(kind: str, base: str, key: str) -> Any:
    """The key's value in the base config (None when unset)."""
    _, config, _ = load(base, file="job.toml")
    node: Any = normalized_config(config)
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def matters(kind: str, key: str, field: FieldInfo) -> tuple[bool, list[Any], list[Any]]:
    """(some valid value of the key changes what runs, the values tried that were valid, all tried)."""
    base = base_of(kind, key)
    current = _current(kind, base, key)
    tried = [c for c in candidates(kind, key, field) if (c.value if isinstance(c, With) else c) != current]
    valid = []
    for sample in tried:
        value, companions = (sample.value, sample.companions) if isinstance(sample, With) else (sample, [])
        baseline = _observed(kind, base, json.dumps(companions))
        assert baseline is not None, f"{key}: the companions {companions} are refused on their own"
        seen = observe(kind, base, [*companions, (key, value)])
        if seen is None:
            continue
        valid.append(value)
        if seen != baseline:
            return True, valid, tried
    return False, valid, tried


RL_KEYS = [(k, f) for k, f in leaves(RLConfig) if not k.startswith(SKIP_PREFIXES)]
SFT_KEYS = leaves(SFTConfig)
# checked against what an iteration does: posttrain.api.inert.inert_warnings warns when it disagrees
CHECKED = ("rollout.episodes_per_batch", "training.max_turns", "reference.tp")


def test_the_keys_come_from_the_models():
    assert len(RL_KEYS) > 100 and len(SFT_KEYS) > 50
    assert "training.group_size" in dict(RL_KEYS) and "hyperparameters.learning_rate" in dict(SFT_KEYS)


@pytest.mark.parametrize(("kind", "key", "field"), [("rl", k, f) for k, f in RL_KEYS] + [("sft", k, f) for k, f in SFT_KEYS],
                         ids=[f"rl:{k}" for k, _ in RL_KEYS] + [f"sft:{k}" for k, _ in SFT_KEYS])  # fmt: skip
def test_a_key_changes_what_runs_or_is_declared_inert(kind, key, field):
    inert = RL_INERT if kind == "rl" else SFT_INERT
    declared = key in inert or key in RECORD_ONLY or (kind == "rl" and key in (*RL_FIXED, *CHECKED))
    changed, valid, tried = matters(kind, key, field)
    if not valid:  # every other value is refused: validation pins the key (it matters by being checked)
        assert key not in SAMPLES and f"{kind}:{key}" not in SAMPLES, f"{key}: no sample in SAMPLES is valid"
        assert tried, f"{key}: no value to try"
        return
    if declared:
        assert not changed, f"{key} is declared inert but a value of it changes what runs: drop it from the list"
    else:
        assert changed, (f"{key} = {valid} changes neither the trainer's settings, the rollout request nor the "
                         "rendered objects: make it matter or list it in posttrain.api.inert with its reason")  # fmt: skip
