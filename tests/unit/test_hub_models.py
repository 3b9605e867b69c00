"""Hub models: a base id the machine has no folder for is downloaded from the Hugging Face
Hub into the user's HF cache (HF_HOME) through huggingface_hub's snapshot_download, from HF_ENDPOINT (here a
Hub served on 127.0.0.1 holding the tiny model built locally); HF_HUB_OFFLINE=1 keeps to the cache; an
unreachable Hub keeps the error that names --model-path. `train --local` and `eval` resolve their model
through the same function (posttrain.local.models.resolve_model)."""

from __future__ import annotations

import pytest
from posttrain.cli import main
from posttrain.errors import UserError
from posttrain.local.models import resolve_model
from posttrain.localhost import free_port

from tests.fixtures.hub_server import serve_hub
from tests.fixtures.models import tiny_model_dir  # noqa: F401

REPO_ID = "Qwen/Qwen3-0.6B"  # an allowlisted id, so `train`'s config rules accept it; here it holds the tiny model


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return home


def test_a_hub_id_is_downloaded_into_the_hf_cache_then_read_offline(tiny_model_dir, hf_home, monkeypatch):  # noqa: F811
    with serve_hub({REPO_ID: tiny_model_dir}) as (endpoint, log):
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        resolved = resolve_model(REPO_ID, None, bucket="posttrain")
    folder = resolved.model_path
    assert folder.startswith(str(hf_home / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots")), folder
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        assert (tiny_model_dir / name).read_bytes() == (hf_home / "hub" / folder.split("/hub/", 1)[1] / name).read_bytes()
    assert any(line.startswith("GET /api/models/Qwen/Qwen3-0.6B/revision/") for line in log), log
    assert any("/resolve/" in line and line.endswith("/model.safetensors") for line in log), log
    # the Hub gone and HF_HUB_OFFLINE=1: the cached copy
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model(REPO_ID, None, bucket="posttrain").model_path == folder


def test_without_the_hub_the_error_names_model_path(hf_home, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(UserError) as err:
        resolve_model(REPO_ID, None, bucket="posttrain", config_file="rl.toml")
    (problem,) = err.value.problems
    assert "cannot be reached" in problem.message and "--model-path" in (problem.fix or ""), problem
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as err:
        resolve_model(REPO_ID, None, bucket="posttrain")
    assert "HF_HUB_OFFLINE is set" in err.value.problems[0].message


def test_a_repo_the_hub_lacks_is_named(tiny_model_dir, hf_home, monkeypatch):  # noqa: F811
    with serve_hub({"other/model": tiny_model_dir}) as (endpoint, _):
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        with pytest.raises(UserError) as err:
            resolve_model(REPO_ID, None, bucket="posttrain")
    assert "has no model 'Qwen/Qwen3-0.6B'" in err.value.problems[0].message


def test_eval_without_the_hub_names_model_path(tiny_model_dir, hf_home, monkeypatch, tmp_path, capsys):  # noqa: F811
    """`eval --model <hub id>` reaches the same download before it starts a model server: with the Hub
    unreachable it stops with the --model-path error (exit 2), not a vLLM failure."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("ENVIRONMENT_API_KEY", "k")
    code = main(["eval", "--task-url", "http://127.0.0.1:9", "--model", REPO_ID, "--seeds", "0",
                 "--no-progress", "--runs-dir", str(tmp_path / "runs")])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "no local weights for base model 'Qwen/Qwen3-0.6B'" in err and "--model-path" in err, err
