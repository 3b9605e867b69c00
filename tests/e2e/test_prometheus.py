"""A real Prometheus (Debian's `prometheus`, on loopback, a generated config) scrapes the operator on the dev
control plane and a running `posttrain train --local` GSPO job (rank 0's /metrics and its rollout server's
vLLM metrics through the proxy); PromQL then finds the job's reward series and the operator's phase counts
(docs/monitoring.md). The job is the tiny model for a few iterations."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.operator_env import operator_env, wait_for
from fixtures.operator_process import rljob_manifest
from fixtures.tiny_rl import tiny_rl_toml
from posttrain.localhost import free_ports, stop_group

pytestmark = [pytest.mark.cluster, pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")
ITERATIONS = 6


def prometheus_config(operator: int, trainer: int, rollout_targets: Path) -> dict[str, Any]:
    def static(job: str, port: int) -> dict[str, Any]:
        return {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}

    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "5s"},
        "scrape_configs": [
            static("posttrain-operator", operator),
            static("posttrain-trainer", trainer),
            # the rollout server's port is the local runner's pick: written once it prints it
            {"job_name": "posttrain-rollout", "file_sd_configs": [{"files": [str(rollout_targets)],
                                                                   "refresh_interval": "1s"}]},
        ],
    }  # fmt: skip


def ready(url: str, proc: subprocess.Popen, log: Path) -> bool:
    if proc.poll() is not None:
        pytest.fail(f"prometheus exited {proc.returncode}: {log.read_text()[-2000:]}")
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def query(url: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    r.raise_for_status()
    return r.json()["data"]["result"]


@pytest.fixture(scope="module")
def vllm_tiny_dir() -> Path:
    """The tiny random Qwen2 with head_dim 32 (vLLM's CPU attention needs it), as tests/e2e/test_train_local.py."""
    from posttrain.modelzoo import build_tiny_model

    return build_tiny_model(REPO / ".models" / "tiny-random-qwen2-hd32", hidden_size=128)


@pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is absent (Debian: apt-get install prometheus; "
                    "hack/setup.sh installs it as root)")  # fmt: skip
def test_prometheus_scrapes_a_local_job_and_the_operator(
    cluster: Any, namespace: str, math_taskapp: Any, vllm_tiny_dir: Path, tmp_path: Path
) -> None:
    op_port, trainer_port, prom_port = free_ports(3)
    targets = tmp_path / "rollout-targets.json"
    targets.write_text("[]")
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps(prometheus_config(op_port, trainer_port, targets)))  # YAML is a JSON superset
    prom_url = f"http://127.0.0.1:{prom_port}"
    settings = {"POSTTRAIN_METRICS_PORT": str(op_port), "POSTTRAIN_METRICS_HOST": "127.0.0.1"}
    with operator_env(cluster, namespace, tmp_path / "operator.log", settings=settings) as env:
        env.secret("task-key", math_taskapp.api_key)
        env.create("rljobs", rljob_manifest("scraped", math_taskapp.url))
        env.wait_phase("rljobs", "scraped", "Running", timeout=60)
        prom = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--web.enable-lifecycle"],
            stdout=(tmp_path / "prometheus.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        job_log = tmp_path / "job.log"
        job = None
        try:
            wait_for(lambda: ready(prom_url, prom, tmp_path / "prometheus.log"), 60, "prometheus ready")
            toml = tmp_path / "rl.toml"
            toml.write_text(tiny_rl_toml(label="prom-rl", trainer_mode="full", iterations=ITERATIONS))
            job_env = {k: v for k, v in os.environ.items() if k not in ("TASK_APP_URL", "KUBECONFIG")}
            job_env.update(POSTTRAIN_METRICS_PORT=str(trainer_port), POSTTRAIN_LIVE_EVERY="2")
            job = subprocess.Popen(
                [sys.executable, "-m", "posttrain.cli", "train", "--local", "--runs-dir", str(tmp_path / "runs"),
                 "--type", "rl", "--config", str(toml), "--name", "prom-rl", "--model-path", str(vllm_tiny_dir)],
                stdout=job_log.open("w"), stderr=subprocess.STDOUT, cwd=REPO, env=job_env, start_new_session=True,
            )  # fmt: skip
            rollout = wait_for(lambda: re.search(r"starting policy rollout server on (127\.0\.0\.1:\d+)",
                                                 job_log.read_text()), 120, "the rollout server's port")  # fmt: skip
            targets.write_text(json.dumps([{"targets": [rollout.group(1)]}]))
            assert job.wait(timeout=600) == 0, job_log.read_text()[-4000:]
            assert f"metrics: http://127.0.0.1:{trainer_port}/metrics" in job_log.read_text()

            # the trainer has exited: its series are stale now, their samples are still in the TSDB
            rewards = query(prom_url, "last_over_time(posttrain_trainer_reward_mean[15m])")
            assert len(rewards) == 1, rewards
            labels = rewards[0]["metric"]
            assert labels["job"] == "posttrain-trainer" and labels["job_namespace"] == "local"
            assert labels["job_name"].startswith("prom-rl"), labels
            assert 0.0 <= float(rewards[0]["value"][1]) <= 1.0
            (steps,) = query(prom_url, "max_over_time(posttrain_trainer_step[15m])")
            assert float(steps["value"][1]) >= 1
            assert query(prom_url, "last_over_time(posttrain_trainer_phase_seconds{phase='rollout'}[15m])")
            assert query(prom_url, "last_over_time(vllm:num_requests_running[15m])"), "vLLM via the proxy"

            phase = f'posttrain_operator_jobs{{kind="rljob", namespace="{namespace}", phase="Running"}}'
            (running,) = wait_for(lambda: query(prom_url, phase) or None, 20, "the operator's phase count")
            assert float(running["value"][1]) == 1
            assert query(prom_url, 'sum(posttrain_operator_reconcile_total{kind="rljob"}) > 0')
        finally:
            if job is not None and job.poll() is None:
                stop_group(job)
            stop_group(prom)
