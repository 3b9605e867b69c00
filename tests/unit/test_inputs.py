"""Unreadable inputs and unwritable outputs are one `error:` line and exit 2, never a traceback or a hang:
non-UTF-8, binary, a FIFO, a BOM (named as such), a directory given for -o."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from posttrain.cli import main

REPO = Path(__file__).resolve().parents[2]
RL = REPO / "examples" / "demo" / "rl.toml"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {
        "latin1": tmp_path / "latin1.toml",
        "binary": tmp_path / "binary.toml",
        "bom": tmp_path / "bom.toml",
        "utf16": tmp_path / "utf16.toml",
        "fifo": tmp_path / "fifo.toml",
    }
    out["latin1"].write_bytes(RL.read_bytes().replace(b'label = "demo-rl"', b'label = "d\xe9mo"'))
    out["binary"].write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00" * 20)
    out["bom"].write_bytes(b"\xef\xbb\xbf" + RL.read_bytes())
    out["utf16"].write_bytes(RL.read_text().encode("utf-16"))
    os.mkfifo(out["fifo"])
    return out


EXPECT = {
    "latin1": "is not UTF-8: byte 0xe9",
    "binary": "is binary (a NUL byte",
    "bom": "starts with a UTF-8 byte-order mark (BOM)",
    "utf16": "is UTF-16",
    "fifo": "is a FIFO (named pipe), not a regular file",
}


@pytest.mark.parametrize("kind", sorted(EXPECT))
@pytest.mark.parametrize("command", ["validate", "convert", "train-local"])
def test_unreadable_configs(kind, command, files, capsys):
    path = files[kind]
    argv = {"validate": ["validate", "--config", str(path)],
            "convert": ["convert", "--config", str(path), "--task-url", "http://t:1"],
            "train-local": ["train", "--local", "--config", str(path)]}[command]  # fmt: skip
    assert main(argv) == 2  # returns at once: a FIFO is never opened
    err = capsys.readouterr().err
    [line] = err.splitlines()
    assert line.startswith(f"error: {path}") and EXPECT[kind] in line and "(fix: " in line, line
    if kind in ("latin1", "bom", "binary"):
        assert line.startswith(f"error: {path}:"), line  # with the line number


def test_the_bad_byte_is_located(files, capsys):
    main(["validate", "--config", str(files["latin1"])])
    line = capsys.readouterr().err
    number = int(line.split(":")[2])
    assert b"d\xe9mo" in files["latin1"].read_bytes().splitlines()[number - 1]


def test_convert_refuses_a_directory_for_output(tmp_path, capsys):
    assert main(["convert", "--config", str(RL), "--task-url", "http://t:1", "-o", str(tmp_path)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {tmp_path}: --output: is a directory") and "(fix: " in line


def test_filter_refuses_binary_input_and_a_directory_output(tmp_path, capsys):
    binary = tmp_path / "rollouts.jsonl"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    assert main(["filter", "--input", str(binary), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert ":1: --input: rollouts file is binary" in capsys.readouterr().err  # file:line: field: message
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": "1+1?", "completion": "2", "reward": 1}) + "\n")
    out_dir = tmp_path / "out.jsonl"
    out_dir.mkdir()
    assert main(["filter", "--input", str(good), "--output", str(out_dir)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_a_fifo_never_hangs_the_cli(files):
    """The same through the console script, with a timeout: nothing opens the FIFO for reading."""
    done = subprocess.run([sys.executable, "-m", "posttrain.cli", "validate", "--config", str(files["fifo"])],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "FIFO" in done.stderr and "Traceback" not in done.stderr
