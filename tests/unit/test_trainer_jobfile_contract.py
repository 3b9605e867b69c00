"""Contract: the job file the operator renders (posttrain.controller.render.render_jobfile) is one the trainer
accepts (posttrain.api.jobfile.JobFile), with the S3 prefix the artifacts land under."""

from __future__ import annotations

import pytest

render = pytest.importorskip("posttrain.controller.render")
settings_mod = pytest.importorskip("posttrain.controller.settings")


def test_operator_jobfile_validates_in_the_trainer():
    from posttrain.api.jobfile import JobFile
    from posttrain_trainer.artifacts import job_model_id

    job = {
        "apiVersion": "posttrain.dev/v1alpha1",
        "kind": "SFTJob",
        "metadata": {"name": "demo", "namespace": "team", "uid": "1234abcd-0000-1111-2222-333344445555"},
        "spec": {"model": {"base": "Qwen/Qwen3-4B", "trainerMode": "lora", "label": "x"}},
    }
    settings = settings_mod.load_settings()
    raw = render.render_jobfile(
        job,
        settings,
        kind="sft",
        config={"hyperparameters": {"n_epochs": 1}},
        dataset={"train": "s3://posttrain/datasets/train.jsonl", "validation": None},
    )
    parsed = JobFile.model_validate(raw)
    assert parsed.kind == "sft" and parsed.plural == "sftjobs" and parsed.report.mode == "kubernetes"
    assert parsed.storage.prefix == "jobs/team/demo-1234abcd/"
    assert parsed.dataset.train == "s3://posttrain/datasets/train.jsonl"
    assert job_model_id(parsed) == "ft:Qwen/Qwen3-4B:team.demo.1234abcd"
