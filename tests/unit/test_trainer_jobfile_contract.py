"""Contract: the job file the operator renders (posttrain.controller.render.jobfile) is one the trainer
accepts (posttrain.api.jobfile.JobFile, read back from the JSON in the job's Secret), with the S3 prefix the
artifacts land under and the fine-tuned model id the trainer derives from it."""

from __future__ import annotations

import base64
import json

from fixtures.jobs import job_object, sft_spec
from posttrain.api.jobfile import JobFile
from posttrain.controller.objects import parse_job
from posttrain.controller.render.jobfile import render_config_secret, render_jobfile
from posttrain.controller.settings import load_settings
from posttrain_trainer.artifacts import job_model_id


def test_operator_jobfile_validates_in_the_trainer():
    spec = sft_spec(model={"base": "Qwen/Qwen3-4B", "trainerMode": "lora", "label": "x"},
                    hyperparameters={"nEpochs": 1})  # fmt: skip
    job = parse_job(job_object("SFTJob", spec, name="demo", namespace="team",
                               uid="1234abcd-0000-1111-2222-333344445555"))  # fmt: skip
    rendered = render_jobfile(
        job, load_settings(), dataset={"train": "s3://posttrain/datasets/train.jsonl", "validation": None}
    )
    text = base64.b64decode(render_config_secret(job, rendered)["data"]["job.json"])
    parsed = JobFile.model_validate(json.loads(text))
    assert parsed.kind == "sft" and parsed.plural == "sftjobs" and parsed.report.mode == "kubernetes"
    assert parsed.storage.prefix == "jobs/team/demo-1234abcd/"
    assert parsed.dataset.train == "s3://posttrain/datasets/train.jsonl"
    assert parsed.record["hyperparameters"] == {"n_epochs": 1}
    assert job_model_id(parsed) == "ft:Qwen/Qwen3-4B:team.demo.1234abcd"
