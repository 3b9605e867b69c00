"""vLLM's compile cache loads back: the rollout server started twice on the tiny model with one fresh
VLLM_CACHE_ROOT compiles on the first start and, on the second, loads the compiled model from the cache
(posttrain_rollout.vllm_plugins) instead of compiling again, and answers exactly as the first did. The
rollout server serves eagerly on a CPU (vllm_args.cpu_eager): the test asks for compilation back
(`--vllm-arg=--no-enforce-eager`), as a user who wants it would."""

from __future__ import annotations

import time

import pytest
from fixtures.vllm import STOP_GRACE_S, greedy_token_ids, start_rollout_server
from posttrain import reaper
from posttrain.localhost import stop_group

pytestmark = pytest.mark.vllm


def test_second_start_loads_the_compiled_model_from_the_cache(vllm_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # beside VLLM_CACHE_ROOT (vllm_args)
    answers, logs, startup = [], [], []
    for start in ("first", "second"):
        began = time.monotonic()
        proc, server = start_rollout_server(
            vllm_model_dir, tmp_path / start, extra=["--vllm-arg=--no-enforce-eager"]
        )
        startup.append(time.monotonic() - began)
        try:
            answers.append(greedy_token_ids(server))
        finally:
            stop_group(proc, STOP_GRACE_S)
            reaper.unwatch(proc.pid)
        logs.append(server.log_path.read_text(errors="replace"))
    print(f"rollout server start: first {startup[0]:.1f} s (compiles), second {startup[1]:.1f} s (cache)")
    assert "saved AOT compiled function" in logs[0], logs[0][-3000:]
    assert "load failure" not in logs[1], logs[1][-3000:]
    assert "Directly load AOT compilation" in logs[1], logs[1][-3000:]
    assert answers[1] == answers[0]
