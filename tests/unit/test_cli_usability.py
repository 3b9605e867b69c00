"""The CLI as a user and a script meet it: numbers are numbers, a misspelled section is named,
--strict, flags checked like the fields they fill, examples in every --help, -o json|yaml|wide, shell
completion, one exit-code table, and no traceback when the reader of stdout goes away. The real `posttrain`
command runs in a subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from posttrain.api.exitcodes import CLI_EXIT_CODES
from posttrain.cli import SUBCOMMANDS, build_parser

REPO = Path(__file__).resolve().parents[2]
RL = REPO / "examples" / "demo" / "rl.toml"
SFT = REPO / "examples" / "sft_lora.toml"


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def _edit(tmp_path: Path, source: Path, old: str, new: str) -> Path:
    text = source.read_text()
    assert old in text
    path = tmp_path / source.name
    path.write_text(text.replace(old, new, 1))
    return path


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(needle))


def test_a_boolean_or_a_string_is_not_a_number(tmp_path: Path):
    path = _edit(tmp_path, RL, "temperature = 1.0", "temperature = true")
    path.write_text(path.read_text().replace("learning_rate = 2e-4", 'learning_rate = "2e-4"', 1))
    result = cli("validate", "--config", str(path))
    assert result.returncode == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    temp, lr = _line_of(path, "temperature = true"), _line_of(path, "learning_rate =")
    assert any(f"{path}:{temp}: rollout.policy_config.temperature: true is a boolean, not a number" in ln for ln in lines)
    assert any(
        f'{path}:{lr}: training.learning_rate: "2e-4" is a string, not a number (fix: write it without quotes: 2e-4)'
        in ln
        for ln in lines
    ), lines


def test_an_integer_key_refuses_a_boolean(tmp_path: Path):
    path = _edit(tmp_path, RL, "group_size = ", "group_size = true\n_was_group_size = ")
    result = cli("validate", "--config", str(path))
    assert result.returncode == 2
    assert "training.group_size: true is a boolean, not an integer" in result.stderr


def test_a_misspelled_section_is_named_with_a_did_you_mean(tmp_path: Path):
    path = _edit(tmp_path, RL, "[training]", "[trainig]")
    result = cli("validate", "--config", str(path))
    assert result.returncode == 2
    line = _line_of(path, "[trainig]")
    assert f"{path}:{line}: trainig: unknown section [trainig] (did you mean [training]?)" in result.stderr
    missing = [ln for ln in result.stderr.splitlines() if "required field is missing" in ln]
    assert missing and all("did you mean [training]?" in ln for ln in missing if "training." in ln)


def test_strict_makes_warnings_exit_2(tmp_path: Path):
    path = _edit(tmp_path, RL, "[training]", "[training]\nweight_sync_intervall = 1")
    assert cli("validate", "--config", str(path)).returncode == 0
    strict = cli("validate", "--strict", "--config", str(path))
    assert strict.returncode == 2
    assert "did you mean 'weight_sync_interval'?" in strict.stderr and "--strict" in strict.stderr
    conv = cli("convert", "--strict", "--config", str(path), "--task-app", "math")
    assert conv.returncode == 2 and conv.stdout == ""
    assert cli("convert", "--config", str(path), "--task-app", "math").returncode == 0
    # train refuses before it starts anything
    runs = tmp_path / "runs"
    train = cli("train", "--local", "--strict", "--type", "rl", "--config", str(path), "--runs-dir", str(runs))
    assert train.returncode == 2 and "--strict" in train.stderr
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--namespace", "Bad_NS"], "'Bad_NS' is not a valid namespace"),
        (["--task-url", "ftp://x"], "argument --task-url: is not an http or https URL"),
        (["--task-app", "Math App"], "is not a valid object name"),
        (["--api-key-secret", "key/../x"], "is not a valid object name"),
        (["--name", "Bad_Name"], "'Bad_Name' is not a valid job name"),
    ],
)
def test_convert_checks_flags_like_the_fields_they_fill(flags: list[str], says: str):
    result = cli("convert", "--config", str(REPO / "examples" / "rl_qwen3_4b.toml"), *flags)
    assert result.returncode == 2
    assert result.stdout == ""  # no YAML
    assert says in result.stderr and result.stderr.startswith("error: ")


def test_train_checks_its_flags_before_it_reaches_a_cluster(tmp_path: Path):
    for flags, says in ((["--name", "Bad_Name"], "not a valid job name"), (["-n", "Bad_NS"], "not a valid namespace"),
                        (["--task-url", "ftp://x"], "not an http or https URL")):  # fmt: skip
        result = cli("train", "--config", str(REPO / "examples" / "rl_qwen3_4b.toml"), *flags, cwd=tmp_path)
        assert result.returncode == 2 and says in result.stderr, result.stderr
        assert "kube" not in result.stderr  # refused before any cluster was asked


def test_every_help_has_examples():
    parser = build_parser()
    assert "examples:" in parser.format_help()
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    for name in SUBCOMMANDS:
        command = name.replace("_", "-")
        text = sub.choices[command].format_help()
        examples = text[text.index("examples:") :]
        assert f"posttrain {command}" in examples, command


def _fake_run(runs: Path, name: str, **fields) -> None:
    folder = runs / f"{name}-1a2b3c4d"
    folder.mkdir(parents=True)
    data = {"name": name, "kind": "rl", "uid": "1a2b3c4d", "phase": "Succeeded", "model": "tiny",
            "progress": {"step": 12, "total": 50, "meanReturn": 0.5}, **fields}  # fmt: skip
    (folder / "run.json").write_text(json.dumps(data))


def test_status_output_formats(tmp_path: Path):
    runs = tmp_path / "runs"
    _fake_run(runs, "demo-rl", fine_tuned_model="rl:tiny:local.demo-rl.1a2b3c4d")
    base = ["status", "--local", "--runs-dir", str(runs)]
    as_json = json.loads(cli(*base, "-o", "json").stdout)
    assert as_json[0]["name"] == "demo-rl-1a2b3c4d" and as_json[0]["step"] == 12
    assert yaml.safe_load(cli(*base, "-o", "yaml").stdout) == as_json
    assert json.loads(cli(*base, "--json").stdout) == as_json
    table = cli(*base).stdout
    assert "12/50" in table and "rl:tiny:local.demo-rl.1a2b3c4d" not in table
    wide = cli(*base, "-o", "wide").stdout
    assert "FINE-TUNED-MODEL" in wide and "rl:tiny:local.demo-rl.1a2b3c4d" in wide
    assert cli(*base, "-o", "xml").returncode == 2


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completion_completes_commands_flags_and_choices(tmp_path: Path):
    script = tmp_path / "posttrain.bash"
    result = cli("completion", "bash")
    assert result.returncode == 0
    script.write_text(result.stdout)
    probe = f"""
source {script}
t() {{ COMP_WORDS=("$@"); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); _posttrain; echo "${{COMPREPLY[*]}}"; }}
t posttrain con
t posttrain convert --na
t posttrain status -o ""
t posttrain completion ""
"""
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines() == ["convert", "--name --namespace", "json yaml wide", "bash zsh"], out.stderr
    zsh = cli("completion", "zsh").stdout
    assert "bashcompinit" in zsh and "complete -o filenames -F _posttrain posttrain" in zsh


def test_no_traceback_when_the_reader_goes_away():
    # `posttrain crds | head -1`, deterministically: the read end is closed before the command writes.
    proc = subprocess.Popen([sys.executable, "-m", "posttrain.cli", "crds"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and err == ""


def test_one_exit_code_table_holds_what_the_commands_return():
    from posttrain.commands import status

    for code in (0, 1, 2, 3, 4, 130, 141):
        assert code in CLI_EXIT_CODES
    assert (status.EXIT_FAILED, status.EXIT_NOT_FOUND, status.EXIT_TIMEOUT) == (1, 3, 4)
    assert cli("status", "nope", "--local", "--runs-dir", "/nonexistent").returncode == 3


def test_crds_prints_to_stdout_by_default(tmp_path: Path):
    result = cli("crds", cwd=tmp_path)
    assert result.returncode == 0
    docs = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "CustomResourceDefinition"]
    kinds = [doc["spec"]["names"]["kind"] for doc in docs]
    assert kinds == ["RLJob", "SFTJob", "TaskApp"]
    assert list(tmp_path.iterdir()) == []
