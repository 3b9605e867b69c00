"""The math task app as a real process, calling a real policy (vLLM on the tiny model via the rollout server):
rollout shape per the synth contract, the cid kept, the call visible in the rollout server's captures."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from posttrain.taskapp_client import TaskAppClient, TaskAppError, check_rollout_response, rollout_request

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]

if not (REPO / "tests" / "fixtures" / "vllm.py").exists():
    # Until the rollout server's session fixture exists: plain vLLM's OpenAI server on the tiny model
    # (head_dim 32: vLLM's CPU attention rejects head_dim 16), a real policy without captures.

    @dataclass(frozen=True)
    class _Policy:
        url: str
        model: str
        captures: bool = False

    @pytest.fixture(scope="module")
    def policy_server(tmp_path_factory):
        from posttrain import hardware
        from posttrain.local.processes import ProcessSet, wait_http
        from posttrain.local.runner import _vllm_env
        from posttrain.localhost import free_port
        from posttrain.modelzoo import build_tiny_model

        model = build_tiny_model(REPO / ".models" / "tiny-random-qwen2-hd32", hidden_size=128)
        run = tmp_path_factory.mktemp("vllm")
        port = free_port()
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                "--served-model-name", "posttrain/tiny-random-qwen2", "--host", "127.0.0.1", "--port", str(port),
                "--dtype", hardware.vllm_dtype(hardware.probe()), "--max-model-len", "512"]  # fmt: skip
        with ProcessSet() as procs:
            proc = procs.start("vllm", argv, run / "vllm.log", env=_vllm_env(dict(os.environ), run, run, 1))
            wait_http(f"http://127.0.0.1:{port}/health", timeout=600, proc=proc, interval=1.0)
            yield _Policy(f"http://127.0.0.1:{port}", "posttrain/tiny-random-qwen2")


def _policy(policy_server) -> tuple[str, str]:
    """(base URL, served model name) of the session's policy server."""
    url = (
        getattr(policy_server, "url", None) or getattr(policy_server, "base_url", None) or str(policy_server)
    )
    model = (
        getattr(policy_server, "model", None) or getattr(policy_server, "served_model_name", None) or "policy"
    )
    return url.rstrip("/").removesuffix("/v1"), model


def test_rollout_against_a_real_policy(math_taskapp, policy_server):
    base, model = _policy(policy_server)
    cid = "it-taskapp-cid-001"
    request = rollout_request(
        seed=5, inference_url=f"{base}/v1/chat/completions?cid={cid}", model=model, env_name="math",
        policy_config={"temperature": 1.0, "max_tokens": 16}, run_id="run-it-1",
    )  # fmt: skip
    with TaskAppClient(math_taskapp.url, math_taskapp.api_key) as client:
        body = client.rollout(request)
        taskset = client.task_info()["taskset"]
    assert check_rollout_response(body) == []
    assert body["run_id"] == "run-it-1"
    assert body["trace_correlation_id"] == cid
    assert body["pipeline_metadata"]["inference_url"].endswith(f"?cid={cid}")
    (trajectory,) = body["trajectories"]
    (step,) = trajectory["steps"]
    assert trajectory["env_id"] == "math::train::5" and trajectory["length"] == 1
    assert step["done"] is True and step["reward"] in (0.0, 1.0)
    assert step["info"]["meta"]["inference_url"] == request["policy"]["config"]["inference_url"]
    assert isinstance(step["info"]["response"], str)
    metrics = body["metrics"]
    assert metrics["episode_returns"] == [step["reward"]]
    assert metrics["mean_return"] == step["reward"] == metrics["outcome_score"]
    assert taskset["rubric"]["outcome"]["criteria"][0]["id"] == "last_number_correct"

    # The rollout server captured exactly this call under the cid (the trainer reads tokens from here).
    if getattr(policy_server, "captures", True):
        captures = httpx.get(f"{base}/v1/captures/{cid}", timeout=10).json()
        assert len(captures) == 1 and captures[0]["completion_token_ids"]


def test_eval_mode_is_greedy_and_deterministic(math_taskapp, policy_server):
    base, model = _policy(policy_server)
    answers = []
    with TaskAppClient(math_taskapp.url, math_taskapp.api_key) as client:
        for i in range(2):
            request = rollout_request(
                seed=1_000_003, inference_url=f"{base}/v1?cid=eval-{i}", model=model, env_name="math",
                mode="eval", policy_config={"max_tokens": 12},
            )  # fmt: skip
            body = client.rollout(request)
            answers.append(body["trajectories"][0]["steps"][0]["info"]["response"])
            assert body["pipeline_metadata"]["split"] == "eval"
    assert answers[0] == answers[1]


def test_policy_errors_surface_as_502(math_taskapp, policy_server):
    base, _ = _policy(policy_server)
    request = rollout_request(seed=1, inference_url=f"{base}/v1?cid=bad-model", model="no-such-model")
    with TaskAppClient(math_taskapp.url, math_taskapp.api_key) as client, pytest.raises(TaskAppError) as err:
        client.rollout(request)
    assert err.value.status == 502 and err.value.code == "inference_failed"
