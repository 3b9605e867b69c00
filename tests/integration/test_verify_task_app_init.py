"""The trainer's init container task-app check, run as rendered (its command and environment from
render_rljob) against real misbehaving HTTP servers on 127.0.0.1 (tests/fixtures/hostile_taskapp.py), in
an interpreter without pydantic-settings or kopf (the trainer image has neither). It is the operator's
prober: one deadline per attempt, bodies capped, fixed messages, nothing of a body in its output."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fixtures.jobs import RL_SPEC, job_object
from posttrain.controller import render
from posttrain.controller.objects import parse_job
from posttrain.controller.render.taskapp import TaskAppTarget
from posttrain.controller.settings import OperatorSettings

REPO = Path(__file__).resolve().parents[2]
KEY = "sk_env_init_container_0099"
# `posttrain` as the trainer image has it: no pydantic-settings, no kopf
SHIM = (
    "import sys; sys.modules['pydantic_settings'] = None; sys.modules['kopf'] = None; "
    "from posttrain.cli import main; sys.exit(main(sys.argv[1:]))"
)


def init_container(url: str, **settings: Any) -> dict[str, Any]:
    defaults = {"verify_timeout_seconds": 3, "verify_request_timeout": 1,
                "task_app_allowed_networks": "127.0.0.0/8"}  # fmt: skip
    config = OperatorSettings(**{**defaults, **settings})
    target = TaskAppTarget(url=url, secret_name="task-key")
    out = render.render_rljob(parse_job(job_object("RLJob", RL_SPEC)), config, target)
    job = next(c for c in out.children if c["kind"] == "Job")
    return job["spec"]["template"]["spec"]["initContainers"][0]


def run_init(container: dict[str, Any], key: str = KEY) -> tuple[int, str, float]:
    """Run the container's command as the kubelet would (its env; the Secret's value for secretKeyRef)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAIN_", "KUBERNETES_"))}
    for item in container["env"]:
        env[item["name"]] = key if "valueFrom" in item else item["value"]
    command = container["command"]
    assert command[0] == "posttrain"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", SHIM, *command[1:]], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=60)  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def test_a_good_task_app_passes(hostile_taskapp: Any) -> None:
    code, output, _ = run_init(init_container(hostile_taskapp.at("ok")))
    assert code == 0, output
    assert output.strip().splitlines()[-1] == "verify-task-app: Verified: GET /health 200, GET /task_info 200"


def test_an_endless_body_is_capped_and_never_printed(hostile_taskapp: Any) -> None:
    code, output, took = run_init(init_container(hostile_taskapp.at("huge")))
    assert code == 1 and "response larger than 1024 KiB" in output
    assert "aaaa" not in output and len(output) < 2000, output
    assert took < 20, took  # --retry-for 3: attempts with backoff, each capped


def test_a_trickle_is_cut_at_one_deadline_per_attempt(hostile_taskapp: Any) -> None:
    code, output, took = run_init(init_container(hostile_taskapp.at("trickle")))
    assert code == 1 and "GET /health did not finish within 1 s" in output, output
    assert took < 15, took  # a per-read timeout would never fire: a byte comes every 0.5 s


def test_the_key_a_task_app_echoes_never_reaches_the_pod_log(hostile_taskapp: Any) -> None:
    code, output, took = run_init(init_container(hostile_taskapp.at("echo")))
    assert code == 1 and "Unauthorized: GET /health -> HTTP 400 (the task app rejected the API key)" in output
    assert KEY not in output and KEY[:12] not in output and "bad key" not in output
    assert took < 10  # a rejected key is not retried


def test_the_operators_address_rules_hold_in_the_init_container(hostile_taskapp: Any) -> None:
    code, output, _ = run_init(init_container(hostile_taskapp.at("ok"), task_app_allowed_networks=""))
    assert code == 1 and "AddressRefused: the task app's host resolves to a loopback address" in output
    port = hostile_taskapp.url.rsplit(":", 1)[1]
    container = init_container(hostile_taskapp.at("ok"), api_server_addresses=f"127.0.0.1:{port}")
    code, output, _ = run_init(container)
    assert code == 1 and "the Kubernetes API server's address" in output
    assert sum(hostile_taskapp.requests.values()) == 0


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/admin?x=", "http://u:p@127.0.0.1:1"])
def test_a_refused_url_is_a_usage_error_naming_the_field(url: str) -> None:
    container = init_container("http://127.0.0.1:1")
    container["command"] = [*container["command"][:-1], url]
    code, output, _ = run_init(container)
    assert code == 2 and "url: the task app URL" in output and "Traceback" not in output
