"""The RL trainer as a real process (`python -m posttrain_trainer rl`) for 3 iterations, with every server it
talks to on 127.0.0.1: the math task app, the real rollout server (posttrain_rollout.server: captures,
finish_reason, weight sync from S3) in front of a scripted model, a judge server that counts its replies, and
SeaweedFS for checkpoints and weight versions. The tiny random Qwen2 is trained; the scripted model lets each
group hold one right answer, one response cut at max_tokens and one empty response.

What must hold:
  - the judge answers every rollout of every iteration (the trainer keeps one event loop per job), and a
    rollout the judge rejects fails and is counted (judge_failed in the iteration event and in progress);
  - truncated and empty responses are counted per iteration; overlong = "mask" trains only the right answers;
  - the sampler/trainer mismatch and the weight-version staleness are reported every iteration, with
    old_logprobs = "sampler" (truncated importance sampling) and GSPO-token in the update;
  - keep_checkpoints = 1 and keep_weight_versions = 1 leave one checkpoint and one weight version in S3, the
    served one;
  - the same job as ReST-EM keeps each group's right answer, trains on it, and honours keep_checkpoints."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from posttrain import storage as s3
from posttrain.localhost import free_port
from posttrain_rollout.server import Proxy, create_app
from posttrain_trainer import checkpoint as ckpt

REPO = Path(__file__).resolve().parents[2]
QUESTION = re.compile(r"What is (-?\d+) ([-+*]) (-?\d+)\?")
ITERATIONS, SEEDS, GROUP = 3, 2, 3


def _serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    return server, thread, f"http://127.0.0.1:{port}"


class Scripted:
    """The model behind the rollout server (chat, reload_weights, reset_prefix_cache) and the judge."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.reloads: list[str] = []
        self.judge_requests = 0
        self.judge_replies = 0
        self.reject_judge_requests: set[int] = set()  # 1-based request numbers answered with HTTP 400
        self.model = FastAPI()
        self.judge = FastAPI()

        @self.model.get("/health")
        async def health() -> dict[str, Any]:
            return {}

        @self.model.post("/v1/chat/completions")
        async def chat(request: Request) -> dict[str, Any]:
            body = await request.json()
            question = body["messages"][-1]["content"]
            a, op, b = QUESTION.search(question).groups()
            answer = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
            kind = self.calls[question] % 3
            self.calls[question] += 1
            text, tokens, finish = [
                (str(answer), [31, 32], "stop"),
                ("Let me think step by step about the", [41] * int(body["max_tokens"]), "length"),
                ("", [], "stop"),
            ][kind]
            return {
                "prompt_token_ids": [1, 2, 3, 4],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "token_ids": tokens,
                        "logprobs": {"content": [{"token": "t", "logprob": -0.5} for _ in tokens]},
                        "finish_reason": finish,
                    }
                ],
            }

        @self.model.post("/collective_rpc")
        async def rpc(request: Request) -> dict[str, Any]:
            folder = Path((await request.json())["kwargs"]["weights_path"])
            assert any(folder.glob("*.safetensors")), folder
            self.reloads.append(folder.name)
            return {"results": [None]}

        @self.model.post("/reset_prefix_cache")
        async def reset() -> dict[str, Any]:
            return {}

        @self.judge.post("/v1/chat/completions")
        async def judge(request: Request) -> dict[str, Any]:
            await request.json()
            self.judge_requests += 1
            if self.judge_requests in self.reject_judge_requests:
                raise HTTPException(400, "rejected by the test")
            await asyncio.sleep(0.02)  # calls overlap, so they queue on the judge client's semaphore
            self.judge_replies += 1
            return {"choices": [{"index": 0, "message": {"role": "assistant", "content": '{"score": 0.5}'}}]}


def _job(tmp: Path, model_dir: Path, taskapp, policy_url: str, judge_url: str, storage: dict) -> Path:
    uid = str(uuid.uuid4())
    config = {
        "rollout": {
            "env_name": "math",
            "policy_name": "math-single-step",
            "max_turns": 1,
            "env_config": {"difficulty": "easy"},
            "policy_config": {"temperature": 1.0, "max_tokens": 5},
            "error_budget": 0.25,
        },
        "training": {
            "num_epochs": 1,
            "iterations_per_epoch": ITERATIONS,
            "batch_size": SEEDS,
            "group_size": GROUP,
            "learning_rate": 1e-4,
            "num_minibatches": 1,
            "overlong": "mask",
            "keep_checkpoints": 1,
            "keep_weight_versions": 1,
            "old_logprobs": "sampler",
            "tis_cap": 2.0,
            "gspo_variant": "token",
        },
        "rubric": {"enabled": True, "weights": {"env": 0.5, "outcome": 0.5, "event": 0.0}},
        "judge": {
            "timeout_s": 10,
            "options": {
                "provider": "self-hosted",
                "model": "judge",
                "base_url": judge_url,
                "max_concurrency": 2,
                "outcome": True,
                "event": False,
            },
        },
    }
    job = {
        "kind": "rl",
        "job": {"name": "rl-rollouts", "namespace": "test", "uid": uid},
        "config": config,
        "base_model": "posttrain/tiny-random-qwen2",
        "model_path": str(model_dir),
        "task_app": {"url": taskapp.url},
        "endpoints": {"policy": [policy_url]},
        "storage": {**storage, "prefix": f"jobs/test/rl-rollouts-{uid[:8]}/"},
        "weight_sync": {"via": "s3", "shared_dir": str(tmp / "weights")},
        "report": {"mode": "file", "path": str(tmp / "report.jsonl")},
        "workdir": str(tmp / "work"),
        "checkpoint_every": 1,
    }
    (tmp / "job.json").write_text(json.dumps(job))
    return tmp / "job.json"


def test_trainer_judges_every_iteration_counts_truncation_and_prunes(
    s3_env, tiny_model_dir, math_taskapp, tmp_path
):
    scripted = Scripted()
    per_iteration = SEEDS * GROUP
    scripted.reject_judge_requests = {per_iteration + 1}  # the first judge call of iteration 2
    model, model_thread, model_url = _serve(scripted.model)
    proxy = Proxy(model_url, served_model_name="tiny", run_dir=tmp_path / "rollout")
    rollout, rollout_thread, rollout_url = _serve(create_app(proxy))
    judge, judge_thread, judge_url = _serve(scripted.judge)
    try:
        job_path = _job(tmp_path, tiny_model_dir, math_taskapp, rollout_url, judge_url, s3_env.storage())
        env = {
            **os.environ,
            "ENVIRONMENT_API_KEY": math_taskapp.api_key,
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        out = subprocess.run(
            [sys.executable, "-m", "posttrain_trainer", "rl", "--config", str(job_path)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    finally:
        for server, thread in ((rollout, rollout_thread), (judge, judge_thread), (model, model_thread)):
            server.should_exit = True
            thread.join(10)

    lines = [json.loads(line) for line in (tmp_path / "report.jsonl").read_text().splitlines()]
    iterations = [line for line in lines if line.get("event") == "iteration"]
    assert len(iterations) == ITERATIONS
    # the judge answered every rollout of every iteration, except the one request it rejected
    assert scripted.judge_requests == ITERATIONS * per_iteration
    assert scripted.judge_replies == ITERATIONS * per_iteration - 1
    assert [(e["judged"], e["judge_failed"], e["failed_rollouts"]) for e in iterations] == [
        (6, 0, 0),
        (5, 1, 1),
        (6, 0, 0),
    ]
    progress = [line["progress"] for line in lines if "progress" in line and line["progress"].get("step")]
    assert [p.get("judgeFailed") for p in progress[:ITERATIONS]] == [0, 1, 0]
    # one right answer, one cut at max_tokens, one empty response per group; mask trains the right ones only
    assert [(e["truncated"], e["empty_responses"], e["train_sequences"]) for e in iterations][0::2] == [
        (2, 2, 2)
    ] * 2
    middle = iterations[1]  # one rollout (whichever reached the judge first) failed
    assert middle["truncated"] + middle["empty_responses"] in (3, 4) and middle["train_sequences"] in (1, 2)
    assert [p.get("truncated") for p in progress[:ITERATIONS]][0::2] == [2, 2]
    # every reward is on the judge's scale: 0.5 * env + 0.5 * 0.5 (right: 0.75, cut and empty: 0.25)
    assert [round(p["meanReturn"], 4) for p in progress[:ITERATIONS]][0::2] == [round(1.25 / 3, 4)] * 2

    # the sampler's logprobs (the scripted model's -0.5 per token) against the trainer's (the tiny random
    # model: about -ln(vocabulary) per token): measured every iteration, in the event and in progress; every
    # capture was served by the version synced just before its iteration
    for event, p in zip(iterations, progress[:ITERATIONS], strict=True):
        assert event["sampler_mismatch"] > 3.0 and event["sampler_kl"] > 1.0, event
        assert p["samplerMismatch"] == round(event["sampler_mismatch"], 6) and p["samplerKl"] > 1.0
        assert (event["max_staleness"], event["unexpected_versions"]) == (0, 0)

    # retention: one checkpoint (the newest) and one weight version (the served one) left in S3
    prefix = json.loads(job_path.read_text())["storage"]["prefix"]
    client = s3.client_from_env(s3_env.storage())
    assert ckpt.list_checkpoints(client, s3_env.bucket, prefix) == [ITERATIONS - 1]
    versions = {
        k.split("weights/")[1].split("/")[0]
        for k in s3.list_prefix(client, s3_env.bucket, prefix + "weights/")
    }
    assert versions == {f"v{ITERATIONS - 1}"} and proxy.gate.version == ITERATIONS - 1
    assert scripted.reloads == ["v1", "v2"]
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == [f"v{ITERATIONS - 1}"]


def test_restem_trainer_keeps_the_right_answers_and_prunes_checkpoints(
    s3_env, tiny_model_dir, math_taskapp, tmp_path
):
    """The same job as ReST-EM ([algorithm] variety = "restem"): each iteration keeps the one right answer
    of each group, fine-tunes on it and syncs; keep_checkpoints = 1 leaves only the newest checkpoint."""
    scripted = Scripted()
    model, model_thread, model_url = _serve(scripted.model)
    proxy = Proxy(model_url, served_model_name="tiny", run_dir=tmp_path / "rollout")
    rollout, rollout_thread, rollout_url = _serve(create_app(proxy))
    try:
        job_path = _job(
            tmp_path, tiny_model_dir, math_taskapp, rollout_url, "http://127.0.0.1:9", s3_env.storage()
        )
        job = json.loads(job_path.read_text())
        for key in ("rubric", "judge"):
            del job["config"][key]
        job["config"]["algorithm"] = {"variety": "restem"}
        job["config"]["training"].update(sft_epochs=1, sft_batch_size=2, micro_batch=2)
        job_path.write_text(json.dumps(job))
        env = {**os.environ, "ENVIRONMENT_API_KEY": math_taskapp.api_key, "OMP_NUM_THREADS": "1"}
        out = subprocess.run(
            [sys.executable, "-m", "posttrain_trainer", "rl", "--config", str(job_path)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    finally:
        for server, thread in ((rollout, rollout_thread), (model, model_thread)):
            server.should_exit = True
            thread.join(10)

    lines = [json.loads(line) for line in (tmp_path / "report.jsonl").read_text().splitlines()]
    iterations = [line for line in lines if line.get("event") == "restem_iteration"]
    assert [e["kept"] for e in iterations] == [SEEDS] * ITERATIONS  # one distinct right answer per prompt
    assert all(e["sft_steps"] == 1 for e in iterations)
    assert [e["step"] for e in lines if e.get("event") == "checkpoint"] == [1, 2]
    prefix = job["storage"]["prefix"]
    client = s3.client_from_env(s3_env.storage())
    assert ckpt.list_checkpoints(client, s3_env.bucket, prefix) == [ITERATIONS - 1]
    assert scripted.reloads == ["v1", "v2", "v3"]
