"""Every key the RL and SFT TOML models accept does something, or says plainly that it does not.

The walker visits every leaf key of RLConfig and SFTConfig and fails unless the key is
  - read by a consumer (the trainer, the rollout server, the operator's rendering and status, the local runner,
    the CLI commands, the conversion to a custom resource): its name occurs in their code, or
  - forwarded to the task app ([rollout.env_config], [rollout.policy_config]: checked in the request), or
  - listed in posttrain.api.inert with its reason, and then `validate` and `convert` warn when a config sets it.
The name check is static (a read of the same name elsewhere would satisfy it); the request keys are checked
by building the request. Keys posttrain itself reads beyond the schema (posttrain.api.extras.PASSTHROUGH)
are read by construction."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from posttrain.api.config import RLConfig, SFTConfig
from posttrain.api.convert import load
from posttrain.api.inert import RL_FIXED, RL_INERT, SFT_INERT
from posttrain.api.rollout_settings import RolloutSettings
from posttrain.cli import main
from posttrain_trainer.rollouts import build_rollout_request
from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "operator" / "posttrain"
CONSUMERS = [
    *(REPO / "trainer_image" / "posttrain_trainer").glob("*.py"),
    *(REPO / "rollout_image" / "posttrain_rollout").glob("*.py"),
    *(OPERATOR / "controller").rglob("*.py"),
    *(OPERATOR / "local").glob("*.py"),
    *(OPERATOR / "commands").glob("*.py"),
    *(OPERATOR / "evaluation").glob("*.py"),
    *(OPERATOR / "api" / f for f in ("topology.py", "convert.py", "reward.py", "jobfile.py", "model_ids.py",
                                     "rollout_settings.py", "settings.py")),
]
FORWARDED = ("rollout.env_config.", "rollout.policy_config.")
# Checked against what an iteration does (posttrain.api.inert.inert_warnings warns when they disagree).
CHECKED = {"rollout.episodes_per_batch", "training.max_turns", "reference.tp", *RL_FIXED}


def _models(annotation: typing.Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def leaves(model: type[BaseModel], path: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        sub = _models(field.annotation)
        out += leaves(sub[0], key) if sub else [key]
    return out


CONSUMER_TEXT = "\n".join(p.read_text() for p in CONSUMERS)


def _read(key: str) -> bool:
    return re.search(rf"\b{re.escape(key.rsplit('.', 1)[-1])}\b", CONSUMER_TEXT) is not None


@pytest.mark.parametrize(
    ("model", "inert"), [(RLConfig, RL_INERT), (SFTConfig, SFT_INERT)], ids=["rl", "sft"]
)
def test_every_accepted_key_is_read_forwarded_or_declared_inert(model, inert):
    keys = leaves(model)
    assert len(keys) > 50  # the walk reached the nested sections
    silent = [
        k for k in keys
        if k not in inert and k not in CHECKED and not k.startswith(FORWARDED) and not _read(k)
    ]  # fmt: skip
    assert silent == [], f"accepted keys that do nothing and say nothing: {silent}"
    stale = [k for k in inert if k not in keys and not k.startswith("data.")]  # data.* may be PASSTHROUGH
    assert stale == [], f"inert entries that are no accepted key: {stale}"
    assert all(len(reason) > 20 for reason in inert.values())


RL_BASE = (REPO / "examples" / "demo" / "rl.toml").read_text()
SFT_BASE = (REPO / "examples" / "sft_lora.toml").read_text()
VALUES = {bool: "true", int: "2", float: "0.5", str: '"x"'}


def _with(base: str, key: str, value: str) -> str:
    """base + key = value in its table (under its header line, or a new table appended at the end)."""
    table, leaf = key.rsplit(".", 1)
    header = re.compile(rf"^\[{re.escape(table)}\][ \t]*$", re.M)
    if header.search(base):
        return header.sub(lambda m: f"{m.group(0)}\n{leaf} = {value}", base, count=1)
    return f"{base}\n[{table}]\n{leaf} = {value}\n"


def _value(model: type[BaseModel], key: str) -> str:
    node: typing.Any = model
    for part in key.split(".")[:-1]:
        node = _models(node.model_fields[part].annotation)[0]
    annotation = node.model_fields[key.rsplit(".", 1)[-1]].annotation
    literal = next((a for a in (annotation, *typing.get_args(annotation)) if typing.get_origin(a) is typing.Literal), None)
    if literal is not None:  # a value of the key's own choices, not the first one
        return f'"{typing.get_args(literal)[-1]}"'
    if any(typing.get_origin(a) is list for a in (annotation, *typing.get_args(annotation))):
        return '["x"]'
    for kind, text in VALUES.items():
        if kind in typing.get_args(annotation) or annotation is kind:
            return text
    return "2"


@pytest.mark.parametrize(
    ("base", "model", "inert"),
    [(RL_BASE, RLConfig, RL_INERT), (SFT_BASE, SFTConfig, SFT_INERT)],
    ids=["rl", "sft"],
)
def test_each_inert_key_warns_with_its_reason(base, model, inert):
    for key, reason in inert.items():
        value = {"data.seeds": "[1, 2]", "policy.inference_url": '"http://vllm:8000"'}.get(key) or _value(model, key)
        _, _, warnings = load(_with(base, key, value), file="job.toml")
        mine = [w for w in warnings if w.startswith(f"{key}:")]
        assert mine and reason in mine[0], (key, warnings)


def test_validate_and_convert_print_the_warning(tmp_path, capsys):
    path = tmp_path / "rl.toml"
    path.write_text(_with(RL_BASE, "model.supports_vision", "true"))
    assert main(["validate", "--config", str(path)]) == 0
    assert (
        "model.supports_vision: accepted for synth compatibility but has no effect" in capsys.readouterr().err
    )
    assert main(["convert", "--config", str(path), "--task-url", "http://t:1"]) == 0
    assert (
        "model.supports_vision: accepted for synth compatibility but has no effect" in capsys.readouterr().err
    )


def test_fixed_keys_warn_only_when_they_differ():
    assert not [w for w in load(RL_BASE, file="rl.toml")[2] if "has no effect" in w]
    text = RL_BASE.replace("batches_per_step = 1", "batches_per_step = 3").replace(
        "episodes_per_batch = 64", "episodes_per_batch = 10"
    )
    warnings = load(text, file="rl.toml")[2]
    assert any(w.startswith("rollout.batches_per_step = 3 has no effect") for w in warnings)
    assert any(
        w.startswith("rollout.episodes_per_batch = 10 has no effect") and "= 64 rollouts" in w
        for w in warnings
    )


def test_forwarded_and_policy_sampling_keys_reach_the_request():
    config = {
        "policy": {"top_k": 20, "repetition_penalty": 1.1, "stop_sequences": ["</s>"], "temperature": 0.3},
        "rollout": {"env_name": "e", "policy_name": "p", "max_turns": 2, "env_config": {"difficulty": "hard"},
                    "policy_config": {"use_tools": False, "max_llm_calls": 3}},
    }  # fmt: skip
    body = build_rollout_request(settings=RolloutSettings.from_config(config), model="m", run_id="r", seed=0, url="http://p?cid=r")
    policy = body["policy"]["config"]
    assert (policy["top_k"], policy["repetition_penalty"], policy["stop"]) == (20, 1.1, ["</s>"])
    assert (policy["temperature"], policy["use_tools"], policy["max_llm_calls"]) == (0.3, False, 3)
    assert body["env"]["config"] == {"difficulty": "hard"}
