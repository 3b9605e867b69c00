"""posttrain convert: examples, determinism, flags, errors, spec <-> config round trips."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from fixtures.jobs import RL_SPEC, SFT_SPEC
from posttrain.api.config import normalized_config
from posttrain.api.convert import config_to_spec, load, spec_to_config, toml_to_cr
from posttrain.api.resources import RLJob, SFTJob, TaskApp, parse_spec
from posttrain.cli import main
from posttrain.errors import UserError

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.toml"))
FLAGS_MARK = "# posttrain convert flags:"


@pytest.fixture(autouse=True)
def _no_task_url_env(monkeypatch):
    monkeypatch.delenv("TASK_APP_URL", raising=False)
    monkeypatch.delenv("SDK_EXPERIMENTAL", raising=False)
    monkeypatch.delenv("POSTTRAIN_EXPERIMENTAL", raising=False)


def _flags(path: Path) -> list[str]:
    for line in path.read_text().splitlines():
        if line.startswith(FLAGS_MARK):
            return shlex.split(line[len(FLAGS_MARK) :])
    return []


def test_examples_exist():
    names = {p.stem for p in EXAMPLES}
    assert {
        "rl_qwen3_4b",
        "rl_from_ft",
        "rl_vision_qwen3vl4b",
        "rl_judge_blend",
        "sft_lora",
        "sft_full",
    } <= names


@pytest.mark.parametrize("toml_path", EXAMPLES, ids=lambda p: p.stem)
def test_committed_cr_equals_convert_output(toml_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["convert", "--config", str(toml_path.relative_to(REPO)), *_flags(toml_path)]) == 0
    committed = REPO / "examples" / "crs" / f"{toml_path.stem}.yaml"
    out = capsys.readouterr().out
    assert committed.is_file(), f"missing {committed}"
    assert committed.read_text() == out, f"{committed} is stale: posttrain convert --config {toml_path} ..."


@pytest.mark.parametrize("toml_path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_are_valid_resources_and_round_trip(toml_path):
    doc = yaml.safe_load((REPO / "examples" / "crs" / f"{toml_path.stem}.yaml").read_text())
    model = {"RLJob": RLJob, "SFTJob": SFTJob}[doc["kind"]]
    model.model_validate(doc, context={"cr": True})
    assert doc["spec"]["originalToml"] == toml_path.read_text()
    kind, config, _ = load(toml_path.read_text())
    expected = normalized_config(config)
    back = spec_to_config(parse_spec(doc["kind"], doc["spec"]))
    if "taskApp" in doc["spec"]:  # the flags chose the task app; the rest is the TOML's
        assert back.pop("services", {}).get("task_url") == doc["spec"]["taskApp"].get("url")
        expected.get("services", {}).pop("task_url", None)
        if not expected.get("services"):
            expected.pop("services", None)
    # a judge's key Secret is the operator's to wire (a secretKeyRef), not part of the trainer's config
    expected.get("judge", {}).pop("api_key_secret_ref", None)
    assert back == expected


def test_taskapp_example_is_valid():
    doc = yaml.safe_load((REPO / "examples" / "crs" / "taskapp-math.yaml").read_text())
    app = TaskApp.model_validate(doc)
    assert app.spec.image and app.spec.api_key_secret_ref.key == "ENVIRONMENT_API_KEY"


def _rl_text(**model: str) -> str:
    lines = "\n".join(f'{k} = "{v}"' for k, v in model.items())
    return (
        (REPO / "examples" / "rl_qwen3_4b.toml")
        .read_text()
        .replace('base = "Qwen/Qwen3-4B"\ntrainer_mode', f"{lines}\ntrainer_mode")
    )


def test_name_is_deterministic_and_content_derived():
    text = (REPO / "examples" / "rl_qwen3_4b.toml").read_text()
    a, _ = toml_to_cr(text, env={})
    b, _ = toml_to_cr(text, env={})
    assert a == b
    assert a["metadata"]["name"].startswith("math-rl-qwen3-4b-")
    c, _ = toml_to_cr(text.replace("learning_rate = 5e-5", "learning_rate = 4e-5"), env={})
    assert c["metadata"]["name"] != a["metadata"]["name"]
    d, _ = toml_to_cr(text, name="mine", namespace="team", env={})
    assert d["metadata"] == {"name": "mine", "namespace": "team"}


def test_task_url_precedence_and_secret():
    text = (REPO / "examples" / "rl_qwen3_4b.toml").read_text()
    cr, _ = toml_to_cr(text, env={})
    assert cr["spec"]["taskApp"] == {"url": "http://math-task-app:8000"}
    cr, _ = toml_to_cr(text, env={"TASK_APP_URL": "http://env:1"})
    assert cr["spec"]["taskApp"]["url"] == "http://env:1"
    cr, _ = toml_to_cr(
        text, task_url="http://flag:2", api_key_secret="k", env={"TASK_APP_URL": "http://env:1"}
    )
    assert cr["spec"]["taskApp"] == {
        "url": "http://flag:2",
        "apiKeySecretRef": {"name": "k", "key": "ENVIRONMENT_API_KEY"},
    }
    cr, _ = toml_to_cr(text, task_app="math", env={})
    assert cr["spec"]["taskApp"] == {"name": "math"}
    assert list(cr["spec"])[0] == "taskApp" and list(cr["spec"])[-1] == "originalToml"


def test_no_task_app_is_a_user_error(capsys, tmp_path):
    src = (REPO / "examples" / "rl_from_ft.toml").read_text()
    path = tmp_path / "rl.toml"
    path.write_text(src)
    assert main(["convert", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "services.task_url" in err and "--task-url" in err and "Traceback" not in err


def test_model_override():
    text = (REPO / "examples" / "rl_qwen3_4b.toml").read_text()
    cr, _ = toml_to_cr(text, model="rl:Qwen/Qwen3-4B:team.prev.0a1b2c3d", env={})
    assert cr["spec"]["model"]["source"] == "rl:Qwen/Qwen3-4B:team.prev.0a1b2c3d"
    assert "base" not in cr["spec"]["model"]
    cr, _ = toml_to_cr(text, model="qwen/qwen3-8b", env={})
    assert cr["spec"]["model"]["base"] == "Qwen/Qwen3-8B"
    sft = (REPO / "examples" / "sft_lora.toml").read_text()
    cr, _ = toml_to_cr(sft, model="Qwen/Qwen3-32B", dataset="s3://b/d.jsonl", env={})
    assert cr["spec"]["model"]["base"] == "Qwen/Qwen3-32B"


def test_sft_dataset_flag_and_type_detection(tmp_path, capsys):
    sft = REPO / "examples" / "sft_lora.toml"
    cr, warnings = toml_to_cr(sft.read_text(), dataset="s3://b/train.jsonl", env={})
    assert cr["kind"] == "SFTJob" and cr["spec"]["dataset"] == {"uri": "s3://b/train.jsonl"}
    # a local [job].data is never written into the spec: refused at its line (the command uploads it first)
    with pytest.raises(UserError) as err:
        toml_to_cr(sft.read_text(), env={}, file="sft_lora.toml")
    [problem] = err.value.problems
    assert problem.field == "job.data" and "a cluster job cannot read a local file" in problem.message
    assert sft.read_text().splitlines()[problem.line - 1].startswith("data = ")
    without = sft.read_text().replace('data = "examples/datasets/math_chat.jsonl"\n', "")
    cr, warnings = toml_to_cr(without, env={})
    assert "dataset" not in cr["spec"] and any("dataset" in w for w in warnings)
    # --type contradicting the content
    assert main(["convert", "--config", str(sft), "--type", "rl"]) == 2
    assert "--type rl" in capsys.readouterr().err
    # a local --dataset is checked
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert main(["convert", "--config", str(sft), "--dataset", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:1" in err and "at least 2" in err


def test_output_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "sub" / "job.yaml"
    flags = _flags(REPO / "examples" / "sft_full.toml")
    assert main(["convert", "--config", "examples/sft_full.toml", *flags, "-o", str(out)]) == 0
    assert out.read_text() == (REPO / "examples" / "crs" / "sft_full.yaml").read_text()


def test_invalid_name_and_missing_file(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as usage:  # refused by the parser, like every usage error
        main(["convert", "--config", "examples/sft_full.toml", "--name", "Bad_Name"])
    assert usage.value.code == 2
    assert main(["convert", "--config", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err
    assert "'Bad_Name' is not a valid job name" in err and "config not found" in err


def test_bad_toml_syntax_has_a_line(tmp_path, capsys):
    path = tmp_path / "x.toml"
    path.write_text('[algorithm]\ntype = "online"\nmethod = \n')
    assert main(["convert", "--config", str(path)]) == 2
    assert f"{path}:3" in capsys.readouterr().err


def test_unknown_keys_travel_in_extras_and_back():
    text = (REPO / "examples" / "rl_qwen3_4b.toml").read_text() + (
        '\n[data]\nsplit = "train"\nseed_start = 3\n[rollout.env_config.step_rewards]\nenabled = true\n'
    )
    text = text.replace("async_semaphore_max = 4", "async_semaphore_max = 4\nmy_knob = 7")
    text = text.replace('task_url = "http://math-task-app:8000"', 'task_url = "http://t"\nenvironment = "x"')
    cr, _ = toml_to_cr(text, env={})
    spec = cr["spec"]
    assert spec["extras"]["data"] == {"split": "train", "seed_start": 3}
    assert spec["extras"]["services"] == {"environment": "x"}
    assert spec["training"]["extras"] == {"my_knob": 7}
    assert spec["rollout"]["envConfig"]["extras"] == {"step_rewards": {"enabled": True}}
    config = spec_to_config(parse_spec("RLJob", spec))
    assert config["data"] == {"split": "train", "seed_start": 3}
    assert config["training"]["my_knob"] == 7 and config["services"] == {
        "task_url": "http://t",
        "environment": "x",
    }
    kind, model, _ = load(text)
    assert config == normalized_config(model)
    assert config_to_spec(model, kind)["training"]["extras"] == {"my_knob": 7}


def test_spec_to_config_keeps_what_the_spec_sets_and_drops_the_operators_fields():
    spec = {**SFT_SPEC, "hyperparameters": {"nEpochs": 1}, "suspend": True, "storage": {"bucket": "b"}}
    assert spec_to_config(parse_spec("SFTJob", spec)) == {
        "algorithm": {"type": "offline", "method": "sft", "variety": "fft"},
        "hyperparameters": {"n_epochs": 1},
        "job": {"model": "x"},
    }
    rl = parse_spec("RLJob", {**RL_SPEC, "training": {**RL_SPEC["training"], "extras": {"k": 1}}})
    config = spec_to_config(rl)
    assert config["training"]["k"] == 1 and config["training"]["num_epochs"] == 1
    assert config["services"] == {"task_url": "http://t"} and "task_app" not in config


def test_a_synth_backend_id_is_refused_by_validate_and_convert(capsys, tmp_path):
    """synth's own ids name weights on synth's backend; posttrain cannot resolve them: exit 2 with the fix,
    before anything reaches a cluster (where the CRD's pattern would refuse it too)."""
    src = (REPO / "examples" / "rl_from_ft.toml").read_text()
    path = tmp_path / "rl.toml"
    path.write_text(
        src.replace("ft:Qwen/Qwen3-4B:default.math-sft-full.7c1e2a9b", "ft:Qwen/Qwen3-4B:job_abc123")
    )
    for command in (
        ["validate", "--config", str(path)],
        ["convert", "--config", str(path), "--task-url", "http://t"],
    ):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert (
            f"{path}:26: model.source: 'ft:Qwen/Qwen3-4B:job_abc123' is not a posttrain fine-tuned id" in err
        )
        assert "(fix: use the fine_tuned_model id a posttrain job printed" in err and "Traceback" not in err


def test_overlong_and_retention_keys_travel_to_the_trainer():
    from posttrain_trainer.rl_config import parse_rl_config

    text = (REPO / "examples" / "rl_qwen3_4b.toml").read_text()
    text = text.replace(
        "[training]\n",
        '[training]\noverlong = "penalty"\noverlong_penalty = -0.5\nkeep_checkpoints = 4\nkeep_weight_versions = 1\n',
        1,
    )
    cr, _ = toml_to_cr(text, env={})
    training = cr["spec"]["training"]
    assert (training["overlong"], training["overlongPenalty"]) == ("penalty", -0.5)
    assert (training["keepCheckpoints"], training["keepWeightVersions"]) == (4, 1)
    assert "extras" not in training or not {"overlong", "keep_checkpoints"} & set(training["extras"])
    RLJob.model_validate(cr, context={"cr": True})
    config = spec_to_config(parse_spec("RLJob", cr["spec"]))
    cfg = parse_rl_config(config)
    assert (cfg.overlong, cfg.overlong_penalty) == ("penalty", -0.5)
    assert (cfg.keep_checkpoints, cfg.keep_weight_versions) == (4, 1)


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('overlong = "chop"', "training.overlong"),
        ("overlong_penalty = 0.5", "training.overlong_penalty"),
        ("keep_checkpoints = -1", "training.keep_checkpoints"),
        ("keep_weight_versions = 1.5", "training.keep_weight_versions"),
    ],
)
def test_validate_names_bad_overlong_and_retention_keys(tmp_path, capsys, line, field):
    text = (
        (REPO / "examples" / "rl_qwen3_4b.toml")
        .read_text()
        .replace("[training]\n", f"[training]\n{line}\n", 1)
    )
    path = tmp_path / "rl.toml"
    path.write_text(text)
    assert main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    row = text.splitlines().index(line) + 1
    assert f"{path}:{row}: {field}:" in err, err


def test_priority_class_sets_the_workload_priority_and_needs_a_queue(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    base = ["convert", "--config", "examples/rl_kueue.toml", "--task-app", "math"]
    assert main([*base, "--priority-class", "posttrain-high"]) == 2
    assert "--priority-class" in capsys.readouterr().err
    assert main([*base, "--queue", "gpus", "--priority-class", "posttrain-high"]) == 0
    scheduling = yaml.safe_load(capsys.readouterr().out)["spec"]["scheduling"]
    assert scheduling == {"queueName": "gpus", "workloadPriorityClassName": "posttrain-high"}
