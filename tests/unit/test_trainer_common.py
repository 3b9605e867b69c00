"""Pure parts of the trainer's common infrastructure: job file, reporting, batch plan, ids, LoRA settings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from posttrain.api.jobfile import JobFile, load_jobfile
from posttrain_trainer.artifacts import job_model_id
from posttrain_trainer.optim import BatchPlan, accumulation_groups
from posttrain_trainer.report import Reporter, camel_progress

JOB = {
    "kind": "sft",
    "job": {"name": "demo", "namespace": "team-a", "uid": "1234abcd-ef56-7890-abcd-ef1234567890"},
    "config": {"hyperparameters": {"n_epochs": 1}, "unknown_section": {"x": 1}},
    "base_model": "posttrain/tiny-random-qwen2",
    "model_path": "/models/tiny",
    "dataset": {"train": "s3://b/data/train.jsonl"},
    "storage": {"endpoint": "127.0.0.1:9000", "bucket": "b", "prefix": "jobs/team-a/demo-1234abcd"},
    "report": {"mode": "file", "path": "/tmp/x.jsonl"},
    "a_future_field": True,
}


def test_jobfile_roundtrip_and_defaults(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(JOB))
    job = load_jobfile(path)
    assert job.plural == "sftjobs" and job.job.group == "posttrain.dev" and job.job.version == "v1alpha1"
    assert job.storage.prefix == "jobs/team-a/demo-1234abcd/"
    assert job.record["unknown_section"] == {"x": 1}
    assert job.task_app is None and job.endpoints.policy == []
    assert job.weight_sync.via == "path" and job.checkpoint_every == 0
    assert job.model_extra["a_future_field"] is True


def test_jobfile_imports_no_torch():
    code = "import sys, posttrain.api.jobfile; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_jobfile_rejects_bad_kind():
    with pytest.raises(ValueError):
        JobFile.model_validate({**JOB, "kind": "dpo"})


def test_job_model_id():
    assert job_model_id(JobFile.model_validate(JOB)) == "ft:posttrain/tiny-random-qwen2:team-a.demo.1234abcd"
    rl = JobFile.model_validate({**JOB, "kind": "rl", "job": {**JOB["job"], "uid": "ab-cd-ef-01-23-45"}})
    assert job_model_id(rl) == "rl:posttrain/tiny-random-qwen2:team-a.demo.abcdef01"


def test_progress_keys_are_camel_case():
    progress = camel_progress(
        step=3,
        total=10,
        loss=1.23456789,
        mean_return=0.5,
        tokens_per_second=100.0,
        judge_scores={"outcome": 0.2},
        eval_score=float("nan"),
        junk=1,
    )
    assert progress["step"] == 3 and progress["meanReturn"] == 0.5 and progress["tokensPerSecond"] == 100.0
    assert progress["judgeScores"] == {"outcome": 0.2} and progress["loss"] == 1.234568
    assert progress["evalScore"] is None and "junk" not in progress and progress["updatedAt"].endswith("Z")


def test_reporter_file_mode(tmp_path, capsys):
    job = JobFile.model_validate({**JOB, "report": {"mode": "file", "path": str(tmp_path / "r.jsonl")}})
    reporter = Reporter(job)
    reporter.progress(step=1, total=2, loss=2.0)
    reporter.result("ft:x:y.z.12345678", {"model": "s3://b/final/"})
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert lines[0]["progress"]["step"] == 1 and lines[0]["progress"]["loss"] == 2.0
    assert lines[1] == {
        "result": {"fine_tuned_model": "ft:x:y.z.12345678", "artifacts": {"model": "s3://b/final/"}}
    }
    assert "[posttrain] progress" in capsys.readouterr().out


def test_batch_plan():
    assert (
        BatchPlan.from_hyperparameters({"batch_size": 4, "gradient_accumulation_steps": 2}, 2).global_batch
        == 16
    )
    plan = BatchPlan.from_hyperparameters({"global_batch": 8, "per_device_batch": 2}, 2)
    assert (plan.micro_batch, plan.grad_accum) == (2, 2)
    plan = BatchPlan.from_hyperparameters({"global_batch": 8}, 1)
    assert (plan.micro_batch, plan.grad_accum, plan.global_batch) == (8, 1, 8)
    with pytest.raises(ValueError):
        BatchPlan.from_hyperparameters({"global_batch": 7, "per_device_batch": 2}, 2)
    assert [len(g) for g in accumulation_groups(range(5), 2)] == [2, 2, 1]


def test_vision_batch_plan_is_one_per_device_with_the_same_global_batch():
    plan = BatchPlan.from_hyperparameters({"batch_size": 4, "gradient_accumulation_steps": 2}, 2)
    one = plan.one_per_device()
    assert (one.micro_batch, one.grad_accum, one.global_batch) == (1, 8, plan.global_batch)


def test_trainer_settings_document_every_field_and_are_named_apart_from_the_api():
    import importlib

    from posttrain_trainer.restem_config import RestemTrainerConfig
    from posttrain_trainer.rl_config import RLTrainerConfig
    from posttrain_trainer.sft_config import SFTTrainerConfig, ValidationSettings

    api_names = {
        name
        for module in ("config", "sections", "resources")
        for name in vars(importlib.import_module(f"posttrain.api.{module}"))
    }
    for settings in (RLTrainerConfig, SFTTrainerConfig, ValidationSettings, RestemTrainerConfig):
        assert settings.__name__ not in api_names
        undocumented = [name for name, info in settings.model_fields.items()
                        if not info.description and name != "algorithm"]  # fmt: skip
        assert undocumented == [], settings.__name__


def test_fsdp_is_read_from_parallelism_and_refused_beside_deepspeed_or_lora():
    from posttrain_trainer.rl_config import parse_rl_config
    from pydantic import ValidationError

    def config(parallelism: dict, mode: str = "full") -> dict:
        return {"model": {"trainer_mode": mode}, "training": {"group_size": 2, "parallelism": parallelism}}

    assert parse_rl_config(config({"fsdp": True})).parallel.fsdp
    assert not parse_rl_config(config({})).parallel.fsdp
    with pytest.raises(ValidationError, match="training.parallelism.fsdp: fsdp and use_deepspeed"):
        parse_rl_config(config({"fsdp": True, "use_deepspeed": True}))
    with pytest.raises(ValidationError, match='training.parallelism.fsdp: .* not trainer_mode = "lora"'):
        parse_rl_config(config({"fsdp": True}, mode="lora"))


def test_progress_carries_the_step_of_total_kubectl_shows():
    # `kubectl get rljobs` shows PROGRESS 12/50 from status.progress.display (a JSONPath cannot join two fields)
    assert camel_progress(step=12, total=50)["display"] == "12/50"
    assert camel_progress(step=3)["display"] == "3"
    assert "display" not in camel_progress(loss=1.0)
