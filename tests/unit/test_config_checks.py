"""Values that used to pass: numeric bounds (finite floats, learning_rate <= 1, int64, sane maxima), URLs,
ops, tables; unknown keys and sections warned about with a did-you-mean and still carried to the trainer;
every refusal as `file:line: field: message (fix: ...)`; ReST-EM accepted as an RL variety."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from posttrain.api.config import normalized_config
from posttrain.api.convert import load, toml_to_cr
from posttrain.cli import main
from posttrain.errors import UserError

REPO = Path(__file__).resolve().parents[2]
BASE = (REPO / "examples" / "demo" / "rl.toml").read_text()
LINE = re.compile(
    r"^error: (?P<file>[^:]+):(?P<line>\d+): (?P<field>[\w.\[\]]+): (?P<message>.+) \(fix: .+\)$"
)


def _edit(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


BAD = {
    "learning_rate = 1e9": (re.sub(r"(?m)^learning_rate = \S+", "learning_rate = 1e9", BASE, count=1),
                            "training.learning_rate"),  # fmt: skip
    "temperature = inf": (
        _edit("temperature = 1.0", "temperature = inf"),
        "rollout.policy_config.temperature",
    ),
    "temperature = nan": (
        _edit("temperature = 1.0", "temperature = nan"),
        "rollout.policy_config.temperature",
    ),
    "num_epochs = 1e17": (_edit("num_epochs = 1", "num_epochs = 1e17"), "training.num_epochs"),
    "num_epochs = 2.5": (_edit("num_epochs = 1", "num_epochs = 2.5"), "training.num_epochs"),
    "int beyond int64": (_edit("num_epochs = 1", "num_epochs = 99999999999999999999"), "training.num_epochs"),
    "int64 in an unknown key": (
        _edit("[training]", "[training]\nmy_knob = -99999999999999999999"),
        "training.my_knob",
    ),
    "max_model_len = 1e10": (_edit("max_model_len = 512", "max_model_len = 1e10"), "vllm.max_model_len"),
    "task_url not a url": (
        _edit("[compute]", '[services]\ntask_url = "not a url"\n\n[compute]'),
        "services.task_url",
    ),
    "tags = 5": ("tags = 5\n" + BASE.replace('[tags]\ndemo = "math"\n', ""), "tags"),
    "ops bogus": (_edit("max_turns = 1\n", 'max_turns = 1\nops = ["bogus"]\n'), "rollout.ops"),
    "group_size 1 for GSPO": (_edit("group_size = 8", "group_size = 1"), "training.group_size"),
    "known extra out of range": (
        _edit("num_minibatches = 2", "num_minibatches = 0"),
        "training.num_minibatches",
    ),
    "eps_low above 1": (_edit("[training]", "[training]\neps_low = 3.0"), "training.eps_low"),
    "fsdp with DeepSpeed": (
        _edit("[training.lora]", "[training.parallelism]\nfsdp = true\nuse_deepspeed = true\n\n[training.lora]")
        .replace('trainer_mode = "lora"', 'trainer_mode = "full"'),
        "training.parallelism.fsdp",
    ),
    "fsdp with LoRA": (
        _edit("[training.lora]", "[training.parallelism]\nfsdp = true\n\n[training.lora]"),
        "training.parallelism.fsdp",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_values_are_refused_with_file_line_field_and_fix(name, tmp_path, capsys):
    text, field = BAD[name]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["validate", "--config", str(path)]) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert errors, name
    parsed = [LINE.match(line) for line in errors]
    assert all(parsed), errors
    assert any(m["field"] == field for m in parsed), errors
    for m in parsed:
        assert m["file"] == str(path)
        lines = text.splitlines()
        assert 1 <= int(m["line"]) <= len(lines)


def test_the_line_points_at_the_bad_key(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(BAD["learning_rate = 1e9"][0])
    main(["validate", "--config", str(path)])
    match = LINE.match(capsys.readouterr().err.strip())
    assert path.read_text().splitlines()[int(match["line"]) - 1].startswith("learning_rate = 1e9")
    assert "less than or equal to 1" in match["message"]


def test_unknown_keys_and_sections_warn_with_did_you_mean_and_are_kept(tmp_path, capsys):
    text = _edit("weight_sync_interval = 1", "weight_sync_intervall = 1").replace(
        "[tags]", "[frobnicate]\nx = 1\n\n[tags]"
    )
    text = text.replace("max_model_len = 512", "max_model_len = 512\nmax_modle_len = 3")
    path = tmp_path / "typo.toml"
    path.write_text(text)
    assert main(["validate", "--config", str(path)]) == 0
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    lines = text.splitlines()

    def find(key: str) -> str:
        [line] = [w for w in warnings if f": {key}:" in w]
        number = int(line.split(":")[2])
        assert lines[number - 1].lstrip("[").startswith(key.rsplit(".", 1)[-1]), (line, lines[number - 1])
        return line

    assert "did you mean 'weight_sync_interval'?" in find("training.weight_sync_intervall")
    assert "did you mean 'max_model_len'?" in find("vllm.max_modle_len")
    assert "unknown section [frobnicate]" in find("frobnicate")
    assert len(warnings) == 3, warnings
    numbers = [int(w.split(":")[2]) for w in warnings]
    assert numbers == sorted(numbers), warnings  # in line order, as the errors are
    # still carried to the trainer
    _, config, _ = load(text)
    normalized = normalized_config(config)
    assert normalized["training"]["weight_sync_intervall"] == 1 and normalized["frobnicate"] == {"x": 1}


def test_keys_posttrain_reads_are_not_unknown():
    text = _edit("[training]", "[training]\neps_low = 0.0003\nbeta = 0.01\nseed = 7\ncheckpoint_every = 2")
    _, _, warnings = load(text, file="rl.toml")
    assert warnings == []


def test_every_example_and_synth_fixture_loads_without_an_unknown_key_warning():
    paths = sorted((REPO / "examples").glob("*.toml")) + sorted((REPO / "examples" / "demo").glob("*.toml"))
    for path in paths:
        _, _, warnings = load(path.read_text(), file=str(path))
        assert not [w for w in warnings if "unknown" in w], (path, warnings)


def test_restem_is_an_rl_variety_and_converts_to_an_rljob():
    text = (REPO / "examples" / "restem_math.toml").read_text()
    kind, config, _ = load(text)
    assert kind == "rl" and (config.algorithm.method, config.algorithm.variety) == ("restem", "restem")
    resource, _ = toml_to_cr(text, task_app="math")
    assert resource["kind"] == "RLJob" and resource["spec"]["algorithm"]["variety"] == "restem"
    # method defaults to restem when only the variety is given
    short = text.replace('method = "restem"\n', "")
    assert load(short)[1].algorithm.method == "restem"
    with pytest.raises(UserError) as err:
        load(text.replace('method = "restem"', 'method = "policy_gradient"'))
    assert "GSPO, ReST-EM and DAPO" in str(err.value)


def test_model_override_follows_synth(tmp_path):
    """--model: a fine-tuned id becomes model.source and clears base; a base id replaces base."""
    text = BASE
    _, config, _ = load(text, model="rl:HuggingFaceTB/SmolLM2-135M-Instruct:local.x.0123abcd")
    assert config.model.source.startswith("rl:") and config.model.base is None
    _, config, _ = load(text, model="Qwen/Qwen3-1.7B")
    assert config.model.base == "Qwen/Qwen3-1.7B" and config.model.source is None
