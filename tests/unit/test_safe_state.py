"""Pickle-free training state (trainer_image/posttrain_trainer/safe_state.py): round trips and refusals."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from posttrain_trainer import safe_state as ss


def test_optimizer_like_state_round_trips(tmp_path):
    state = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4, 2)}, 1: {"step": torch.tensor(3.0)}},
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1], "foreach": None}],
    }
    files = ss.save_state(state, tmp_path, "optimizer")
    assert files == ["optimizer.json", "optimizer.safetensors"]
    back = ss.load_state(tmp_path, "optimizer")
    assert set(back["state"]) == {0, 1}  # int keys stay ints (load_state_dict needs them)
    assert torch.equal(back["state"][0]["exp_avg"], state["state"][0]["exp_avg"])
    assert back["param_groups"][0]["betas"] == (0.9, 0.999)


def test_rng_state_round_trips(tmp_path):
    random.seed(5)
    np.random.seed(5)
    state = [{"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}]
    ss.save_state(state, tmp_path, "rng")
    back = ss.load_state(tmp_path, "rng")[0]
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.setstate(back["python"])
    np.random.set_state(back["numpy"])
    torch.set_rng_state(back["torch"])
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(1), expected[2])


def test_objects_are_refused_at_save(tmp_path):
    with pytest.raises(TypeError, match="only data"):
        ss.save_state({"fn": object()}, tmp_path, "x")


def test_tied_tensors_are_saved(tmp_path):
    weight = torch.randn(3, 3)
    ss.save_tensors({"embed": weight, "lm_head": weight}, tmp_path / "m.safetensors")


def test_manifest_names_the_changed_file(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    manifest = ss.file_manifest(tmp_path, ["a.json"])
    ss.verify_files(tmp_path, manifest, where="ckpt")
    (tmp_path / "a.json").write_text("[]")
    with pytest.raises(ss.CheckpointIntegrityError, match="a.json does not match"):
        ss.verify_files(tmp_path, manifest, where="ckpt")
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.pt").write_bytes(b"x")
    with pytest.raises(ss.CheckpointIntegrityError, match="b.pt is not in"):
        ss.verify_files(tmp_path, manifest, where="ckpt")
    with pytest.raises(ss.CheckpointIntegrityError, match="missing"):
        ss.verify_files(tmp_path / "empty", {"../x": "0"}, where="ckpt")
