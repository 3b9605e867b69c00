"""`posttrain verify-task-app` against the real math task app process: good key, wrong key, app down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from posttrain.localhost import free_port

POSTTRAIN = [sys.executable, "-m", "posttrain.cli"]
REPO = Path(__file__).resolve().parents[2]


def _verify(url: str, key: str | None, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ENVIRONMENT_API_KEY"}
    if key is not None:
        env["MY_TASK_KEY"] = key
    return subprocess.run(
        [*POSTTRAIN, "verify-task-app", url, "--api-key-env", "MY_TASK_KEY", *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )


def test_good_task_app_passes_every_check(math_taskapp):
    result = _verify(math_taskapp.url, math_taskapp.api_key)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for check in ("health", "task_info", "rollout"):
        assert any(line.strip().startswith(f"PASS  {check}") for line in lines), result.stdout
    assert "verdict: OK" in result.stdout
    as_json = json.loads(_verify(math_taskapp.url, math_taskapp.api_key, "--json").stdout)
    assert [c["verdict"] for c in as_json] == ["PASS", "PASS", "PASS"]


def test_wrong_key_fails_health_with_a_hint(math_taskapp):
    result = _verify(math_taskapp.url, "sk_env_wrong")
    assert result.returncode == 1
    assert "FAIL  health" in result.stdout and "HTTP 400 unauthorised" in result.stdout
    assert "MY_TASK_KEY" in result.stdout
    assert "SKIP  task_info" in result.stdout and "verdict: FAILED" in result.stdout
    assert "sk_env_wrong" not in result.stdout


def test_down_task_app_is_unreachable():
    result = _verify(f"http://127.0.0.1:{free_port()}", "k")
    assert result.returncode == 1
    assert "FAIL  health" in result.stdout and "Connection refused" in result.stdout


def test_missing_key_env_is_a_usage_error(math_taskapp):
    result = _verify(math_taskapp.url, None)
    assert result.returncode == 2
    assert "MY_TASK_KEY is not set" in result.stderr and "Traceback" not in result.stderr
