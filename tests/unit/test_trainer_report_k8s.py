"""Reporter in kubernetes mode: the real kubernetes client sends a merge patch to the job's status subresource
(a local HTTP server stands in for the API server and records the request)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from posttrain.api.jobfile import JobFile
from posttrain_trainer.report import Reporter


@pytest.fixture
def api_server(tmp_path, monkeypatch):
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PATCH(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(
                {
                    "path": self.path.split("?", 1)[0],
                    "query": self.path.partition("?")[2],
                    "type": self.headers["Content-Type"],
                    "body": json.loads(body),
                    "auth": self.headers.get("Authorization"),
                }
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "t",
                "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
                "users": [{"name": "t", "user": {"token": "trainer-token"}}],
                "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield seen
    server.shutdown()


def test_progress_and_result_patch_status(api_server, capsys):
    job = JobFile.model_validate(
        {
            "kind": "rl",
            "base_model": "b",
            "model_path": "/m",
            "report": {"mode": "kubernetes"},
            "job": {"name": "math", "namespace": "team", "uid": "u-1"},
        }
    )
    reporter = Reporter(job)
    reporter.progress(
        step=2,
        total=10,
        loss=0.5,
        mean_return=0.25,
        judge_scores={"outcome": 1.0},
        tokens_per_second=12.5,
        last_checkpoint="s3://b/c/",
    )
    reporter.result("rl:b:team.math.u1", {"model": "s3://b/final/"})
    assert [r["path"] for r in api_server] == [
        "/apis/posttrain.dev/v1alpha1/namespaces/team/rljobs/math/status"
    ] * 2
    assert all(r["type"] == "application/merge-patch+json" for r in api_server)
    # managedFields then say who wrote progress (on the real node it read "OpenAPI-Generator")
    assert all(r["query"] == "fieldManager=posttrain-trainer" for r in api_server)
    progress = api_server[0]["body"]["status"]["progress"]
    assert (
        progress["step"] == 2
        and progress["meanReturn"] == 0.25
        and progress["judgeScores"] == {"outcome": 1.0}
    )
    assert (
        progress["tokensPerSecond"] == 12.5
        and progress["lastCheckpoint"] == "s3://b/c/"
        and "updatedAt" in progress
    )
    assert api_server[1]["body"] == {
        "status": {"result": {"fineTunedModel": "rl:b:team.math.u1", "artifacts": {"model": "s3://b/final/"}}}
    }
    assert "trainer-token" not in capsys.readouterr().out  # never logged


def test_patch_failure_does_not_stop_training(tmp_path, monkeypatch, capsys):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "t",
                "clusters": [{"name": "t", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "t", "user": {"token": "x"}}],
                "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    job = JobFile.model_validate(
        {"kind": "sft", "base_model": "b", "model_path": "/m", "report": {"mode": "kubernetes"}}
    )
    Reporter(job).progress(step=1, total=2, loss=1.0)
    assert "status patch failed" in capsys.readouterr().err


def test_status_patches_are_throttled_but_last_step_is_sent(api_server):
    job = JobFile.model_validate(
        {
            "kind": "sft",
            "base_model": "b",
            "model_path": "/m",
            "report": {"mode": "kubernetes"},
            "job": {"name": "j", "namespace": "n"},
        }
    )
    reporter = Reporter(job, min_patch_interval_s=60)
    for step in range(1, 11):
        reporter.progress(step=step, total=10, loss=1.0)
    assert [r["body"]["status"]["progress"]["step"] for r in api_server] == [1, 10]
    assert api_server[0]["path"].endswith("/namespaces/n/sftjobs/j/status")
