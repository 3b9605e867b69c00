"""A policy endpoint's replicas (posttrain_trainer.replicas): a Service name that resolves to several pods
becomes one URL per pod, so that a weight sync reaches every replica, a rollout's policy calls and its
capture GET name the same replica, and every replica's busy seconds count. Two real HTTP servers on
127.0.0.1:P and 127.0.0.2:P (Linux answers every 127.x address on loopback) stand for two pods of one
Deployment; a resolver maps a made-up name to both."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from posttrain.api.rollout_settings import RolloutSettings
from posttrain_trainer import replicas
from posttrain_trainer.replicas import expand, replica_urls
from posttrain_trainer.rollouts import RolloutClient, RolloutLoop, inference_url, plan_rollouts
from posttrain_trainer.utilisation import ServerClocks
from posttrain_trainer.weightsync import WeightSyncer, WeightSyncError

NAME = "policy.replicas.test"


def resolver(table: dict[str, list[str]], calls: list[str] | None = None):
    """socket.getaddrinfo over a fixed table (an unknown name fails as DNS does)."""

    def resolve(host, port, *args, **kwargs):
        if calls is not None:
            calls.append(host)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        out = []
        for address in table[host]:
            if ":" in address:
                out.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0)))
            else:
                out.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)))
        return out

    return resolve


# -- pure: the expansion --------------------------------------------------------------------------------


def test_a_name_with_several_addresses_becomes_one_url_per_address_sorted_and_deduplicated():
    resolve = resolver({NAME: ["10.0.0.12", "10.0.0.9", "10.0.0.12", "fd00::2", "10.0.0.9"]})
    assert replica_urls(f"http://{NAME}:8000", resolve) == [
        "http://10.0.0.9:8000",
        "http://10.0.0.12:8000",
        "http://[fd00::2]:8000",
    ]
    # the path stays; no port stays no port
    assert replica_urls(f"http://{NAME}/base", resolve)[0] == "http://10.0.0.9/base"


def test_one_address_an_ip_localhost_https_and_a_failed_name_stay_one_url(caplog):
    calls: list[str] = []
    resolve = resolver({"one.test": ["10.0.0.5"], "localhost": ["127.0.0.1", "::1"]}, calls)
    assert replica_urls("http://one.test:8000", resolve) == ["http://one.test:8000"]
    assert replica_urls("http://10.0.0.7:8000", resolve) == ["http://10.0.0.7:8000"]
    assert replica_urls("http://[fd00::7]:8000", resolve) == ["http://[fd00::7]:8000"]
    assert replica_urls("http://127.0.0.1:9000", resolve) == ["http://127.0.0.1:9000"]  # a local run
    assert replica_urls("http://localhost:9000", resolve) == ["http://localhost:9000"]
    assert replica_urls(f"https://{NAME}:8443", resolver({NAME: ["10.0.0.1", "10.0.0.2"]})) == [
        f"https://{NAME}:8443"
    ]
    assert calls == ["one.test"]  # IP literals and localhost are never resolved
    replicas._warned.discard("http://gone.test:8000")
    with caplog.at_level(logging.WARNING, logger="posttrain_trainer"):
        assert replica_urls("http://gone.test:8000", resolve) == ["http://gone.test:8000"]
        assert replica_urls("http://gone.test:8000", resolve) == ["http://gone.test:8000"]
    assert len([r for r in caplog.records if "gone.test" in r.getMessage()]) == 1  # logged once


def test_expand_keeps_each_endpoints_replicas_in_order_once():
    resolve = resolver({"a.test": ["10.0.0.2", "10.0.0.1"], "b.test": ["10.0.1.1"]})
    assert expand(["http://a.test:8000", "http://b.test:8000", "http://10.0.0.1:8000"], resolve) == [
        "http://10.0.0.1:8000",
        "http://10.0.0.2:8000",
        "http://b.test:8000",
    ]


# -- two real replicas ----------------------------------------------------------------------------------


class Replica:
    """A stand-in rollout server: records policy calls under their cid (its captures), weight syncs, and
    counts busy seconds."""

    def __init__(self, host: str, port: int):
        self.host = host
        self.captures: dict[str, list[dict[str, Any]]] = {}
        self.weights: list[dict[str, Any]] = []
        self.busy = 0.0
        self.version = 0
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                return json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")

            def do_POST(self):
                url = urlsplit(self.path)
                body = self._body()
                if url.path == "/v1/weights":
                    replica.weights.append(body)
                    replica.version = body["version"]
                    return self._answer(200, {"weight_version": body["version"]})
                if url.path == "/v1/chat/completions":
                    cid = parse_qs(url.query)["cid"][0]
                    replica.busy += 1.0
                    replica.captures.setdefault(cid, []).append(
                        {"prompt_token_ids": [1, 2], "completion_token_ids": [3], "logprobs": [-0.5],
                         "finish_reason": "stop", "weight_version": 0}  # fmt: skip
                    )
                    choice = {"index": 0, "message": {"role": "assistant", "content": "x"}}
                    return self._answer(200, {"choices": [choice]})
                return self._answer(404, {})

            def do_GET(self):
                path = urlsplit(self.path).path
                if path == "/v1/weights":
                    return self._answer(200, {"weight_version": replica.version, "busy_seconds": replica.busy})
                cid = path.rsplit("/", 1)[1]
                if path.startswith("/v1/captures/") and cid in replica.captures:
                    return self._answer(200, replica.captures[cid])
                return self._answer(404, {"error": "no capture"})

            def do_DELETE(self):
                self._answer(200, {})

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class TaskApp(Replica):
    """A stand-in task app: each /rollout calls the policy once through its inference_url."""

    def __init__(self, host: str, port: int):
        super().__init__(host, port)
        self.server.RequestHandlerClass.do_POST = self._rollout  # type: ignore[method-assign]

    @staticmethod
    def _rollout(handler):
        body = handler._body()
        url = body["policy"]["config"]["inference_url"]
        httpx.post(url, json={"messages": [{"role": "user", "content": "q"}]}, timeout=10).raise_for_status()
        handler._answer(200, {"metrics": {"episode_returns": [1.0]}, "trajectories": []})


@pytest.fixture
def two_replicas(monkeypatch) -> Iterator[tuple[list[Replica], Any]]:
    monkeypatch.delenv("POSTTRAIN_ROLLOUT_TOKEN", raising=False)
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    servers = [Replica("127.0.0.1", port), Replica("127.0.0.2", port)]
    try:
        yield servers, resolver({NAME: ["127.0.0.2", "127.0.0.1"]})
    finally:
        for server in servers:
            server.close()


def _url(server: Replica) -> str:
    return f"http://{NAME}:{server.server.server_address[1]}"


def posting_syncer(endpoints: list[str], resolve: Any) -> WeightSyncer:
    """A WeightSyncer with only what its POSTs to the servers need (no job, no model)."""
    syncer = WeightSyncer.__new__(WeightSyncer)
    syncer.endpoints, syncer.timeout_s, syncer.resolve = endpoints, 30.0, resolve
    syncer.served, syncer._served_lock = None, threading.Lock()
    return syncer


def test_weight_sync_reaches_every_replica(two_replicas, tmp_path):
    servers, resolve = two_replicas
    syncer = posting_syncer([_url(servers[0])], resolve)
    answers = syncer.post(str(tmp_path), "full", 3)
    assert [a["weight_version"] for a in answers] == [3, 3]
    assert [s.weights for s in servers] == [[{"path": str(tmp_path), "format": "full", "version": 3}]] * 2
    # a replica that does not answer fails the sync, as one server always did
    port = servers[0].server.server_address[1]
    syncer.resolve = resolver({NAME: ["127.0.0.1", "127.0.0.3"]})
    with pytest.raises(WeightSyncError, match=rf"127\.0\.0\.3:{port}"):
        syncer.post(str(tmp_path), "full", 4)


def test_rollouts_alternate_replicas_and_fetch_captures_where_they_were_made(two_replicas):
    servers, resolve = two_replicas
    port = servers[0].server.server_address[1]
    policy = expand([_url(servers[0])], resolve)
    assert policy == [f"http://127.0.0.1:{port}", f"http://127.0.0.2:{port}"]
    specs = plan_rollouts("rep", 0, [5, 6], 2, policy)
    assert [s.endpoint for s in specs] == policy * 2
    for spec in specs:  # the task app's inference_url and the trainer's capture GET name one replica
        assert urlsplit(inference_url(spec.endpoint, spec.cid)).netloc == urlsplit(spec.endpoint).netloc

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    task_port = probe.getsockname()[1]
    probe.close()
    task = TaskApp("127.0.0.1", task_port)
    try:
        client = RolloutClient(
            task_url=f"http://127.0.0.1:{task_port}",
            settings=RolloutSettings.from_config({"rollout": {"env_name": "math"}}),
            model="m",
            api_key="k",
        )
        with RolloutLoop() as loop:
            results = loop.collect(client, specs)
    finally:
        task.close()
    assert all(r.ok for r in results), [r.error for r in results]
    assert [len(s.captures) for s in servers] == [2, 2]  # each replica served its own half
    assert {s.cid for s in specs[0::2]} == set(servers[0].captures)
    assert {s.cid for s in specs[1::2]} == set(servers[1].captures)


def test_busy_seconds_come_from_every_replica(two_replicas):
    servers, resolve = two_replicas
    clocks = ServerClocks([_url(servers[0])], resolve=resolve)
    assert sorted(clocks._last[1].values()) == [0.0, 0.0] and len(clocks._last[1]) == 2
    servers[1].busy = 1e9  # one replica busy throughout, the other idle: the mean idle share is one half
    assert clocks.idle_share() == pytest.approx(0.5)


def test_a_replica_that_appears_after_a_sync_gets_those_weights_before_it_is_used(two_replicas, tmp_path):
    servers, _ = two_replicas
    port = servers[0].server.server_address[1]
    first, second = (f"http://127.0.0.{n}:{port}" for n in (1, 2))
    syncer = posting_syncer([first], None)
    assert syncer.bring_up_to_date([first, second]) == []  # before any sync every replica has the base weights
    syncer.post(str(tmp_path), "full", 5)  # one replica then
    assert servers[0].weights and not servers[1].weights
    # a second replica (a replaced pod, base weights: version 0) answers now
    assert syncer.bring_up_to_date([first, second]) == [second]
    assert servers[1].weights == [{"path": str(tmp_path), "format": "full", "version": 5}]
    assert len(servers[0].weights) == 1  # the first one, at version 5, was not sent the weights again
