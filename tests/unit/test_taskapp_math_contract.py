"""The math task app's pure parts and its HTTP contract up to the policy call (auth, malformed requests,
task_info), in process. The rollout against a real policy is in tests/integration/test_taskapp_math.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

APP_PATH = Path(__file__).resolve().parents[2] / "examples" / "taskapps" / "math" / "app.py"


def _load():
    spec = importlib.util.spec_from_file_location("math_taskapp", APP_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["math_taskapp"] = module
    spec.loader.exec_module(module)
    return module


taskapp = _load()
KEY = "sk_env_unit_test_key_123"


@pytest.fixture
def client(monkeypatch):
    monkeypatch.setenv("ENVIRONMENT_API_KEY", KEY)
    monkeypatch.delenv("ENVIRONMENT_API_KEY_ALIASES", raising=False)
    with TestClient(taskapp.create_app()) as c:
        yield c


def _rollout_body(**over):
    body = {
        "run_id": "r1",
        "mode": "rl",
        "env": {"env_name": "math", "seed": 3, "config": {}},
        "policy": {
            "policy_name": "p",
            "config": {"model": "m", "inference_url": "http://127.0.0.1:9/v1?cid=c1"},
        },
        "ops": ["agent", "env"],
    }
    body.update(over)
    return body


def test_problems_are_deterministic_and_splits_disjoint():
    first = [taskapp.make_problem(s)["question"] for s in range(50)]
    assert first == [taskapp.make_problem(s)["question"] for s in range(50)]
    assert len(set(first)) > 30
    train = {taskapp.make_problem(s)["question"] for s in range(2000)}
    held = {taskapp.make_problem(taskapp.EVAL_SEED_START + s)["question"] for s in range(300)}
    assert not train & held
    by_param = [taskapp.make_problem(s, split="eval") for s in range(300)]
    assert all(p["split"] == "eval" and taskapp._is_eval_problem(p["a"], p["op"], p["b"]) for p in by_param)
    assert not train & {p["question"] for p in by_param}


def test_difficulty_and_operations():
    p = taskapp.make_problem(7, {"difficulty": "easy"})
    assert 0 <= p["a"] <= 9 and 0 <= p["b"] <= 9
    p = taskapp.make_problem(7, {"difficulty": "hard"})
    assert 10 <= p["a"] <= 99 and 10 <= p["b"] <= 99
    p = taskapp.make_problem(7, {"a_digits": 3, "b_digits": 1, "operations": ["*"]})
    assert p["answer"] == p["a"] * p["b"] and 100 <= p["a"] <= 999
    with pytest.raises(taskapp.ProblemError):
        taskapp.make_problem(1, {"difficulty": "impossible"})
    with pytest.raises(taskapp.ProblemError):
        taskapp.make_problem(1, {"operations": ["/"]})


def test_reward_reads_the_last_number():
    p = taskapp.make_problem(0, {"difficulty": "easy"})
    answer = p["answer"]
    assert taskapp.score(p, f"The answer is {answer}.")[0] == 1.0
    assert taskapp.score(p, f"{answer + 1} ... no wait, {answer}")[0] == 1.0
    assert taskapp.score(p, f"{answer} then {answer + 1}")[0] == 0.0
    assert taskapp.score(p, "no idea")[0] == 0.0
    exact = taskapp.make_problem(0, {"difficulty": "easy", "reward": "exact"})
    assert taskapp.score(exact, f"{answer}")[0] == 1.0
    assert taskapp.score(exact, f"It is {answer}")[0] == 0.0
    assert taskapp.last_number("total: 1,234") == 1234.0


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://h:8000?cid=abc", "http://h:8000/v1/chat/completions?cid=abc"),
        ("http://h:8000/v1?cid=abc", "http://h:8000/v1/chat/completions?cid=abc"),
        ("http://h:8000/v1/chat/completions?cid=abc", "http://h:8000/v1/chat/completions?cid=abc"),
        (
            "http://h:8000/v1/chat/completions?cid=abc/v1/chat/completions",
            "http://h:8000/v1/chat/completions?cid=abc",
        ),
        ("http://h:8000/?cid=abc/v1/chat/completions", "http://h:8000/v1/chat/completions?cid=abc"),
    ],
)
def test_inference_url_normalisation_keeps_cid(given, expected):
    assert taskapp.chat_completions_url(given) == expected


def test_root_needs_no_key(client):
    assert client.get("/").json() == {"status": "ok", "service": "math"}


@pytest.mark.parametrize("path", ["/health", "/info", "/task_info"])
def test_auth_failures_are_400_unauthorised(client, path):
    for headers in ({}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer wrong"}):
        r = client.get(path, headers=headers)
        assert r.status_code == 400, (path, headers)
        error = r.json()["detail"]["error"]
        assert error["code"] == "unauthorised"
        assert KEY[:6] not in r.text


@pytest.mark.parametrize(
    "headers",
    [{"X-API-Key": KEY}, {"X-API-Keys": f"other,{KEY}"}, {"Authorization": f"Bearer {KEY}"}],
)
def test_every_documented_header_authorises(client, headers):
    r = client.get("/health", headers=headers)
    assert r.status_code == 200 and r.json()["healthy"] is True


def test_aliases_and_dev_fallback(monkeypatch):
    monkeypatch.delenv("ENVIRONMENT_API_KEY", raising=False)
    monkeypatch.setenv("DEV_ENVIRONMENT_API_KEY", "dev-key")
    monkeypatch.setenv("ENVIRONMENT_API_KEY_ALIASES", "alias-1, alias-2")
    with TestClient(taskapp.create_app()) as c:
        for key in ("dev-key", "alias-2"):
            assert c.get("/health", headers={"X-API-Key": key}).status_code == 200
        assert c.get("/health", headers={"X-API-Key": "nope"}).status_code == 400


def test_no_configured_key_is_503(monkeypatch):
    for name in ("ENVIRONMENT_API_KEY", "DEV_ENVIRONMENT_API_KEY", "dev_environment_api_key"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("ENVIRONMENT_API_KEY_ALIASES", raising=False)
    with TestClient(taskapp.create_app()) as c:
        r = c.get("/task_info", headers={"X-API-Key": "anything"})
        assert r.status_code == 503
        assert r.json()["detail"]["error"]["code"] == "missing_environment_api_key"


def test_task_info_taskset_and_seeds(client):
    h = {"X-API-Key": KEY}
    taskset = client.get("/task_info", headers=h).json()["taskset"]
    assert taskset["id"] == "math" and taskset["rubric"]["outcome"]["criteria"]
    one = client.get("/task_info?seed=3", headers=h).json()
    assert one["task"]["id"] == "math" and one["environment"] == "math"
    assert one["rubric"]["outcome"]["name"] == "correct_answer"
    assert one["task_metadata"]["seed"] == 3 and one["task_metadata"]["split"] == "train"
    many = client.get("/task_info?seed=0&seed=1&seed=2", headers=h).json()
    assert [i["task_metadata"]["seed"] for i in many] == [0, 1, 2]
    assert len(client.get("/task_info?seeds=0,1,2,3,4,5,6,7,8,9", headers=h).json()) == 10
    held = client.get(f"/task_info?seed={taskapp.EVAL_SEED_START}", headers=h).json()
    assert held["task_metadata"]["split"] == "eval"
    assert client.get("/task_info?seed=abc", headers=h).status_code == 422
    info = client.get("/info", headers=h).json()
    assert info["service"]["task"]["id"] == "math" and info["rubrics"]["outcome"]


def test_malformed_rollouts(client):
    h = {"X-API-Key": KEY}
    assert client.post("/rollout", headers=h, content=b"{not json").status_code == 422
    r = client.post("/rollout", headers=h, json={"run_id": "x"})
    assert r.status_code == 422 and r.json()["detail"]["error"]["code"] == "invalid_request"
    r = client.post("/rollout", headers=h, json=_rollout_body(mode="play"))
    assert r.status_code == 422
    no_url = _rollout_body(policy={"config": {"model": "m"}})
    r = client.post("/rollout", headers=h, json=no_url)
    assert r.status_code == 400 and r.json()["detail"]["error"]["code"] == "missing_inference_url"
    no_cid = _rollout_body(policy={"config": {"inference_url": "http://127.0.0.1:9/v1"}})
    r = client.post("/rollout", headers=h, json=no_cid)
    assert r.status_code == 400 and r.json()["detail"]["error"]["code"] == "missing_correlation_id"
    bad_env = _rollout_body(env={"seed": 1, "config": {"difficulty": "cosmic"}})
    r = client.post("/rollout", headers=h, json=bad_env)
    assert r.status_code == 422 and r.json()["detail"]["error"]["code"] == "invalid_env_config"


def test_malformed_rollout_without_key_is_auth_error_first(client):
    assert client.post("/rollout", json={"run_id": "x"}).status_code == 400


def test_unreachable_policy_is_502(client):
    r = client.post("/rollout", headers={"X-API-Key": KEY}, json=_rollout_body())
    assert r.status_code == 502
    assert r.json()["detail"]["error"]["code"] == "inference_unreachable"
