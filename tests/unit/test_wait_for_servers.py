"""The trainer waits for its rollout servers before the first rollout (posttrain_trainer.rollouts.wait_for_servers):
a local run starts the trainer while vLLM boots. A real HTTP server on 127.0.0.1 plays a rollout server that
answers 503 while it starts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from posttrain_trainer.rollouts import ServersNotReady, wait_for_servers


class _Starting(BaseHTTPRequestHandler):
    """/health: 503 for the first `starting` requests, then 200 (or 404 for a server without the route)."""

    starting = 0
    final_status = 200
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).seen.append(self.path)
        status = 503 if len(type(self).seen) <= type(self).starting else type(self).final_status
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Starting]]]:
    handler = type("Handler", (_Starting,), {"seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_waits_while_the_server_answers_503(server):
    url, handler = server
    handler.starting = 3
    wait_for_servers([url + "/"], timeout_s=30, interval_s=0.05)
    assert handler.seen == ["/health"] * 4


def test_a_server_without_a_health_route_counts_as_up(server):
    url, handler = server
    handler.final_status = 404
    wait_for_servers([url], timeout_s=5, interval_s=0.05)
    assert handler.seen == ["/health"]


def test_gives_up_after_the_deadline_naming_the_server(server):
    url, handler = server
    handler.starting = 10_000
    with pytest.raises(ServersNotReady, match=f"rollout server {url} not ready after 0 s"):
        wait_for_servers([url], timeout_s=0.3, interval_s=0.05)


def test_nothing_listening_is_waited_for_too():
    with pytest.raises(ServersNotReady):
        wait_for_servers(["http://127.0.0.1:1"], timeout_s=0.2, interval_s=0.05)
