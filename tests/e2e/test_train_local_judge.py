"""A judge's score reaches the reward, end to end: `posttrain train --local` (two iterations of GSPO on the tiny
model against the math task app, a real vLLM rollout server and torchrun trainer) with `[judge] reward_blend =
{ env = 0, outcome = 1 }` and the judge at a base_url on loopback: a small OpenAI-compatible server in this
test that scores every episode 1.0 and counts its calls. The config names no rubric_overrides, so the judge
must be asked with the math app's own /task_info rubric.

What must hold: the judge is called once per training rollout (outcome only: events are not judged), the
mean_return the run reports for every iteration is the judge's score (1.0, whatever the task app's return),
and the job records the rubric it used and its source (task_info) in its manifest and its trace store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fixtures.loopback import served
from fixtures.tiny_rl import tiny_rl_toml

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ITERATIONS, BATCH, GROUP = 2, 2, 2  # tiny_rl_toml's batch_size is 2
JUDGE_MODEL = "loopback-judge"


class Judge:
    """An OpenAI-compatible /v1/chat/completions that gives every episode 1.0 in the reply format posttrain's
    judge client parses ({"criteria": {...}, "score": ...}), keeping each prompt it was sent."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.app = FastAPI()

        @self.app.post("/v1/chat/completions")
        async def complete(request: Request) -> dict[str, Any]:
            body = await request.json()
            assert body["model"] == JUDGE_MODEL
            self.prompts.append(body["messages"][-1]["content"])
            reply = json.dumps({"criteria": {"last_number_correct": 1.0}, "score": 1.0})
            return {"id": "j", "object": "chat.completion", "model": JUDGE_MODEL,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                 "finish_reason": "stop"}]}  # fmt: skip


@pytest.fixture
def judge() -> Iterator[tuple[Judge, str]]:
    state = Judge()
    with served(state.app) as base:
        yield state, f"{base}/v1"


def test_a_loopback_judge_scores_every_rollout_and_its_score_is_the_reward(judge, tmp_path):
    from posttrain.api import traces
    from posttrain.modelzoo import build_tiny_model

    state, url = judge
    model_dir = build_tiny_model(REPO / ".models" / "tiny-random-qwen2-hd32", hidden_size=128)
    more = f"""
[judge]
reward_blend = {{ env = 0, outcome = 1 }}

[judge.options]
provider = "self-hosted"
model = "{JUDGE_MODEL}"
base_url = "{url}"
event = false
outcome = true
timeout_s = 60
"""
    config = tmp_path / "rl_judge.toml"
    config.write_text(tiny_rl_toml(label="e2e-judge", trainer_mode="lora", iterations=ITERATIONS, group_size=GROUP,
                                   more=more))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("TASK_APP_URL", "KUBECONFIG", "POSTTRAIN_TASKAPP")}
    result = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "--local", "--runs-dir", str(tmp_path / "runs"),
         "--type", "rl", "--config", str(config), "--model-path", str(model_dir)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-3000:]

    # the judge was asked once per training rollout, with the math app's rubric (no overrides in the config)
    rollouts = ITERATIONS * BATCH * GROUP
    assert len(state.prompts) == rollouts, (len(state.prompts), out[-3000:])
    assert all("last_number_correct" in p and "exact result of the arithmetic problem" in p for p in state.prompts)

    # every iteration's mean_return is the blended reward: the judge's 1.0, not the task app's return
    reported = [float(v) for v in re.findall(r"^\s+step \d+/2\s+mean_return (\S+)", out, re.M)]
    assert reported == [1.0] * ITERATIONS, out[-3000:]
    run_dir = Path(re.search(r"run folder (\S+)", out).group(1))
    metrics = [json.loads(line) for line in next(run_dir.rglob("metrics.jsonl")).read_text().splitlines()]
    iterations = [m for m in metrics if "judged" in m]
    assert [m["judged"] for m in iterations] == [BATCH * GROUP] * ITERATIONS, metrics
    assert all(m["mean_return"] == 1.0 and m["judge_scores"] == {"outcome": 1.0} for m in iterations), iterations

    # the rubric used and its source: in the manifest and in the trace store
    manifest = json.loads(next(run_dir.rglob("manifest.json")).read_text())
    rubric = manifest["metrics"]["judge_rubric"]
    assert rubric["source"] == "task_info" and rubric["outcome"]["source"] == "task_info"
    assert rubric["outcome"]["rubric"]["criteria"][0]["id"] == "last_number_correct"
    store = next(run_dir.rglob(traces.FILE_NAME))
    assert traces.read_job_metadata(store)["judge_rubric"] == rubric
    rows = [row for _, row in traces.read_sessions(store)]
    assert len(rows) == rollouts and all(r["reward"] == 1.0 for r in rows)
    assert {r["metadata"]["judge_rubric_source"] for r in rows} == {"task_info"}
