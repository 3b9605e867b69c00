"""The shapes task app (examples/taskapps/shapes) against posttrain's own task-app verification (the checks
`posttrain train --local` and the operator run before a job): /task_info with several seeds must be a list.
In process (FastAPI's TestClient); the rollouts through vLLM are in tests/integration/test_rl_vision.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from posttrain.taskapp_client import TaskAppClient, verify

APP = Path(__file__).resolve().parents[2] / "examples" / "taskapps" / "shapes" / "app.py"
KEY = "sk_env_unit_shapes_1"


@pytest.fixture
def shapes(monkeypatch) -> TestClient:
    monkeypatch.setenv("ENVIRONMENT_API_KEY", KEY)
    spec = importlib.util.spec_from_file_location("shapes_taskapp", APP)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "shapes_taskapp", module)
    spec.loader.exec_module(module)
    return TestClient(module.create_app(), headers={"X-API-Key": KEY})


def test_task_info_gives_one_object_per_seed_and_a_list_for_several(shapes):
    assert "taskset" in shapes.get("/task_info").json()
    one = shapes.get("/task_info", params={"seed": 3}).json()
    assert one["task_metadata"]["seed"] == 3 and one["observation"]["type"] == "image"
    several = shapes.get("/task_info", params=[("seed", 3), ("seed", 4)]).json()
    assert [info["task_metadata"]["seed"] for info in several] == [3, 4]
    assert several[0] == one


def test_posttrains_verification_passes(shapes):
    client = TaskAppClient("http://testserver", api_key=KEY)
    client._http = shapes  # the same requests, served in process
    checks = verify(client)
    assert [(c.name, c.ok) for c in checks] == [("health", True), ("task_info", True)], checks
    assert "10 seeds resolve" in checks[1].detail
