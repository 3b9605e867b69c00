"""posttrain.api.settings: the trainer's settings, resolved once into the job file by the one builder the
operator and the local runner share, typed per algorithm, and the source of the pass-through keys."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fixtures.jobs import RL_SPEC, job_object, sft_spec
from posttrain.api import extras, settings
from posttrain.api.convert import toml_to_cr
from posttrain.api.jobfile import build_jobfile, dump_jobfile, load_jobfile
from posttrain.api.settings import GSPOSettings, RestemSettings, SFTSettings, settings_for
from posttrain.controller import render
from posttrain.controller.objects import parse_job
from posttrain.controller.render.taskapp import TaskAppTarget
from posttrain.controller.settings import OperatorSettings
from posttrain.errors import UserError
from pydantic import ValidationError

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
OPERATOR = OperatorSettings(trainer_image="reg/trainer:1", rollout_image="reg/rollout:1", s3_bucket="bkt")
TARGET = TaskAppTarget(url="http://math.tasks.svc:8000", secret_name="task-key", name=None)


def test_every_example_resolves_to_the_settings_the_trainer_parsed_before():
    """tests/golden/examples_trainer_settings.json: what rl_config/sft_config/restem_config parsed from each
    example's job file (operator) and local config on main, before the settings moved here."""
    trainer = json.loads((GOLDEN / "examples_trainer_settings.json").read_text())
    rendered = json.loads((GOLDEN / "examples_render.json").read_text())
    for name, case in trainer.items():
        jobfile = json.loads(rendered[name]["render"]["secret"]["data"]["job.json"])
        for where, old in case.items():
            config = jobfile["config"] if where == "operator" else rendered[name]["local_config"]
            new = settings_for(jobfile["kind"], config)
            dumped = new.model_dump(mode="json")
            if "iterations" in old:  # ReST-EM's was one field
                dumped["iterations"] = new.iterations
            assert {k: dumped[k] for k in old} == old, (name, where)


def test_the_job_file_carries_the_typed_settings_and_they_survive_the_file(tmp_path):
    job = parse_job(job_object("RLJob", RL_SPEC))
    out = render.render_job(job, OPERATOR, TARGET)
    assert isinstance(out.jobfile.settings, GSPOSettings)
    assert out.jobfile.settings.group_size == 2 and out.jobfile.settings.iterations == 2
    again = load_jobfile(dump_jobfile(out.jobfile, tmp_path / "job.json"))
    assert again.settings == out.jobfile.settings
    sft = render.render_job(parse_job(job_object("SFTJob", sft_spec())), OPERATOR, None)
    assert isinstance(sft.jobfile.settings, SFTSettings)
    restem = {**RL_SPEC, "algorithm": {"type": "online", "method": "restem", "variety": "restem"}}
    assert isinstance(render.render_job(parse_job(job_object("RLJob", restem)), OPERATOR, TARGET).jobfile.settings,
                      RestemSettings)  # fmt: skip


def test_an_older_job_file_without_settings_gets_them_from_its_config(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"kind": "rl", "base_model": "m", "model_path": "/m",
                                "config": {"training": {"group_size": 4, "minibatches": 2}}}))  # fmt: skip
    job = load_jobfile(path)
    assert isinstance(job.settings, GSPOSettings) and (job.settings.group_size, job.settings.num_minibatches) == (4, 2)


def _build(config: dict, default: int):
    return build_jobfile("rl", config, job={}, base_model="m", model_path="/m", storage={"endpoint": "s", "bucket": "b"},
                         checkpoint_default=default, report={}, workdir="/w", weight_sync={})  # fmt: skip


def test_one_builder_one_checkpoint_rule():
    # the job's own training.checkpoint_every wins; else the caller's default (operator: its setting, local: 0)
    assert _build({"training": {"checkpoint_every": 3}}, 10).checkpoint_every == 3
    assert _build({"training": {}}, 10).checkpoint_every == 10
    assert _build({}, 0).checkpoint_every == 0


def test_a_hand_written_spec_against_a_rule_fails_to_render_naming_the_field():
    # convert refuses this config (api/config.py); a custom resource written by hand reaches the operator,
    # whose job-file builder refuses it with the same rule (posttrain.api.settings.fsdp_problems)
    training = {**RL_SPEC["training"], "parallelism": {"fsdp": True, "useDeepspeed": True}}
    job = parse_job(job_object("RLJob", {**RL_SPEC, "training": training}))
    with pytest.raises(ValidationError, match="training.parallelism.fsdp: fsdp and use_deepspeed are both set"):
        render.render_job(job, OPERATOR, TARGET)


def test_the_cli_reports_the_same_rule_with_its_line():
    text = Path("examples/rl_full_zero3.toml").read_text()
    (field, message, _fix), *_ = settings.fsdp_problems(True, True, "full")
    broken = text.replace("[training.parallelism]", "[training.parallelism]\nfsdp = true", 1)
    assert broken != text
    with pytest.raises(UserError) as err:
        toml_to_cr(broken, task_url="http://t:8000", env={})
    assert any(p.field == field and p.message == message and p.line for p in err.value.problems)


def test_pass_through_keys_come_from_the_settings_models():
    # every key a settings model reads in a pass-through section, and the typed schema lacks, is known to
    # convert with the model's bounds
    derived = extras.settings_passthrough()
    assert {"num_minibatches", "minibatches", "eps_low", "overlong_buffer", "dynamic_sampling",
            "max_sampling_rounds", "reward_threshold", "sft_epochs"} <= set(derived["training"])  # fmt: skip
    assert "seed_start" in derived["data"] and "temperature" in derived["evaluation"]
    assert {"lr_scheduler_type", "seed", "max_grad_norm"} <= set(derived["hyperparameters"])
    assert "group_size" not in derived["training"]  # typed: [training] group_size is synth's own
    for section, keys in derived.items():
        assert extras.PASSTHROUGH[section].keys() >= keys.keys()
    text = re.sub(r"(?m)^max_sampling_rounds = \d+", "max_sampling_rounds = 0", Path("examples/demo/rl.toml").read_text())
    assert "max_sampling_rounds = 0" in text
    with pytest.raises(UserError) as err:
        toml_to_cr(text, task_url="http://t:8000", env={})
    assert [p.field for p in err.value.problems] == ["training.max_sampling_rounds"]


def test_the_rl_varieties_are_the_registry():
    from posttrain.api.config import RL_ALGORITHMS
    from posttrain.api.crdgen import SPEC_RULES
    from posttrain.api.resources import RLJobSpec

    assert {v for _, _, v in RL_ALGORITHMS} == set(settings.RL_ALGORITHMS) == {"gspo", "restem", "dapo"}
    rule = SPEC_RULES[RLJobSpec][0]["rule"]
    assert all(f"self.algorithm.variety == '{v}'" in rule for v in settings.RL_ALGORITHMS)


def test_an_explicit_sft_seed_of_zero_stays_zero():
    # unset: the default 42; any explicit seed, 0 included, is the seed the trainer uses
    assert SFTSettings.resolve({"hyperparameters": {}}).seed == 42
    assert SFTSettings.resolve({"hyperparameters": {"seed": 0}}).seed == 0
    assert SFTSettings.resolve({"hyperparameters": {"seed": 7}}).seed == 7
