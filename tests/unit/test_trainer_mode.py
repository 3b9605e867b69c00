"""trainer_mode is derived once (posttrain.api.settings.trainer_mode) and every reader agrees: for each spelling
a config can use (model.trainer_mode, policy.trainer_mode, training.mode, training.use_qlora,
algorithm.variety, hyperparameters.train_kind), RL and SFT, the trainer's settings in the job file the operator
renders, the settings the local runner resolves, the job's status (trainerMode), the SFT spec's
model.trainerMode and the artifacts manifest the trainer writes all say the same mode."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fixtures.jobs import UID, job_object
from posttrain.api.config import normalized_config
from posttrain.api.convert import load, toml_to_cr
from posttrain.api.settings import settings_for
from posttrain.controller import render
from posttrain.controller.objects import parse_job
from posttrain.controller.render.taskapp import TaskAppTarget
from posttrain.controller.settings import OperatorSettings
from posttrain.controller.status import Observed, derive_status

REPO = Path(__file__).resolve().parents[2]
RL = (REPO / "examples" / "demo" / "rl.toml").read_text()
SFT = """
[algorithm]
type = "offline"
method = "sft"
variety = "lora"

[job]
model = "Qwen/Qwen3-0.6B"

[compute]
gpu_type = "H100"
gpu_count = 1

[training]

[hyperparameters]
n_epochs = 1
"""
OPERATOR = OperatorSettings(trainer_image="reg/trainer:1", rollout_image="reg/rollout:1", s3_bucket="bkt")
TARGET = TaskAppTarget(url="http://math.tasks.svc:8000", secret_name="task-key", name=None)


def _set(text: str, table: str, line: str) -> str:
    """`line` under [table] (the table's existing key of the same name replaced)."""
    key = line.split("=", 1)[0].strip()
    header = re.compile(rf"^\[{re.escape(table)}\][ \t]*$", re.M)
    assert header.search(text), table
    text = re.sub(rf"(\[{re.escape(table)}\][^\[]*?)^{key}\s*=.*\n", r"\1", text, count=1, flags=re.M)
    return header.sub(lambda m: f"{m.group(0)}\n{line}", text, count=1)


def _rl_policy_spelling(mode: str) -> str:
    """The model named by [policy] (model_name + trainer_mode) instead of [model]."""
    text = RL.replace('[model]\nbase = "HuggingFaceTB/SmolLM2-135M-Instruct"\ntrainer_mode = "lora"\nlabel = "demo-rl"\n', "")
    return text + f'\n[policy]\nmodel_name = "HuggingFaceTB/SmolLM2-135M-Instruct"\ntrainer_mode = "{mode}"\nlabel = "demo-rl"\n'


CASES = [
    ("rl", _set(RL, "model", 'trainer_mode = "full"'), "full"),
    ("rl", RL, "lora"),
    ("rl", _set(RL, "model", 'trainer_mode = "qlora"'), "qlora"),
    ("rl", _set(RL, "training", "use_qlora = true"), "qlora"),
    ("rl", _set(RL, "training", 'mode = "qlora"'), "qlora"),
    ("rl", _rl_policy_spelling("qlora"), "qlora"),
    ("rl", _rl_policy_spelling("full"), "full"),
    ("sft", _set(SFT, "algorithm", 'variety = "fft"'), "full"),
    ("sft", SFT, "lora"),
    ("sft", _set(SFT, "training", "use_qlora = true"), "qlora"),
    ("sft", _set(SFT, "algorithm", 'variety = "qlora"'), "qlora"),
    ("sft", _set(SFT, "training", 'mode = "lora"'), "lora"),
    ("sft", _set(SFT, "training", 'mode = "qlora"'), "qlora"),
    ("sft", _set(SFT, "hyperparameters", 'train_kind = "peft"'), "lora"),
    ("sft", _set(_set(SFT, "hyperparameters", 'train_kind = "fft"'), "algorithm", 'variety = "fft"'), "full"),
]
IDS = ["rl-model-full", "rl-model-lora", "rl-model-qlora", "rl-use_qlora", "rl-training.mode", "rl-policy-qlora",
       "rl-policy-full", "sft-fft", "sft-lora", "sft-use_qlora", "sft-variety-qlora", "sft-mode-lora",
       "sft-mode-qlora", "sft-train_kind-peft", "sft-train_kind-fft"]  # fmt: skip


def _manifest_mode(jobfile, tmp_path: Path, monkeypatch) -> str:
    """The trainer_mode of the manifest.json the trainer writes at the end (artifacts.finalize; the model
    save is stubbed: this is about the manifest)."""
    from posttrain_trainer import artifacts, modeling

    monkeypatch.setattr(modeling, "save_final", lambda *a, **k: None)
    job = jobfile.model_copy(update={"storage": None, "workdir": str(tmp_path)})
    artifacts.finalize(job, None, None, metrics={}, steps=0)
    return json.loads((tmp_path / "manifest.json").read_text())["trainer_mode"]


@pytest.mark.parametrize(("kind", "text", "expected"), CASES, ids=IDS)
def test_every_reader_says_the_same_trainer_mode(kind, text, expected, tmp_path, monkeypatch):
    cr, _ = toml_to_cr(text, file="job.toml", task_url="http://math.tasks.svc:8000",
                       dataset="s3://bkt/data/train.jsonl", env={})  # fmt: skip
    job = parse_job(job_object(cr["kind"], cr["spec"], name="ex", namespace="default", uid=UID))
    out = render.render_job(job, OPERATOR, TARGET if job.is_rl else None)
    operator = out.jobfile.settings.trainer_mode
    _, config, _ = load(text, file="job.toml")
    local = settings_for(kind, normalized_config(config)).trainer_mode
    status = derive_status(job, observed=Observed(deployments={}, trainer=None, others=set()), expected=None,
                           verification=None, now=datetime(2026, 11, 28, tzinfo=UTC))["trainerMode"]  # fmt: skip
    manifest = _manifest_mode(out.jobfile, tmp_path, monkeypatch)
    assert (operator, local, status, manifest) == (expected,) * 4
    if kind == "sft":
        assert cr["spec"]["model"]["trainerMode"] == expected
