"""The operator's prober and posttrain.api.urls: a refused URL or address is never requested, routes are
joined onto the URL's path, the connection goes to the address that was checked (real HTTP servers on
127.0.0.1, tests/fixtures/hostile_taskapp.py)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from posttrain.controller.verify import (
    ADDRESS_REFUSED,
    PERMANENT,
    UNREACHABLE,
    URL_REFUSED,
    VERIFIED,
    TaskAppProber,
    address_policy,
    policy_from_env,
)

KEY = "sk_env_addresses_0007"
LOOPBACK_ALLOWED = address_policy("127.0.0.0/8,::1/128")


def check(url: str, addresses=LOOPBACK_ALLOWED, deadline: float = 5.0):
    async def go():
        prober = TaskAppProber(addresses=addresses)
        try:
            return await prober.check(url, KEY, deadline=deadline)
        finally:
            await prober.close()

    return asyncio.run(go())


def test_query_fragment_and_user_info_are_refused_before_any_request(hostile_taskapp) -> None:
    for url in (f"{hostile_taskapp.url}/internal/admin?x=", f"{hostile_taskapp.url}/internal/admin#",
                hostile_taskapp.url.replace("http://", "http://user:pw@") + "/ok"):  # fmt: skip
        attempt = check(url)
        assert not attempt.ok and attempt.reason == URL_REFUSED and not attempt.retryable, url
        assert "pw" not in attempt.message and "internal" not in attempt.message
    assert sum(hostile_taskapp.requests.values()) == 0


def test_routes_are_joined_onto_the_base_path(hostile_taskapp) -> None:
    attempt = check(hostile_taskapp.at("ok", "deep/er") + "/")
    assert attempt.ok and attempt.reason == VERIFIED
    assert hostile_taskapp.requests["ok"] == 2


def test_loopback_is_refused_unless_the_settings_allow_it(hostile_taskapp) -> None:
    attempt = check(hostile_taskapp.at("ok"), addresses=address_policy())
    assert not attempt.ok and attempt.reason == ADDRESS_REFUSED and ADDRESS_REFUSED in PERMANENT
    assert attempt.message == "the task app's host resolves to a loopback address: the operator does not connect there"
    # a name is resolved and every address it has is checked
    attempt = check(hostile_taskapp.at("ok").replace("127.0.0.1", "localhost"), addresses=address_policy())
    assert attempt.reason == ADDRESS_REFUSED
    assert sum(hostile_taskapp.requests.values()) == 0
    assert check(hostile_taskapp.at("ok")).ok


def test_a_name_connects_to_the_checked_address_with_its_own_host_header(hostile_taskapp) -> None:
    first = socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)[0][4][0]
    if first != "127.0.0.1":
        pytest.skip(f"localhost resolves to {first} first here (the test app listens on 127.0.0.1)")
    attempt = check(hostile_taskapp.at("ok").replace("127.0.0.1", "localhost"))
    assert attempt.ok, attempt


def test_the_api_servers_port_is_refused_even_where_loopback_is_allowed(hostile_taskapp) -> None:
    port = int(hostile_taskapp.url.rsplit(":", 1)[1])
    api = address_policy("127.0.0.0/8", api_server=f"127.0.0.1:{port}")
    attempt = check(hostile_taskapp.at("ok"), addresses=api)
    assert attempt.reason == ADDRESS_REFUSED and "API server" in attempt.message
    assert sum(hostile_taskapp.requests.values()) == 0


def test_metadata_and_link_local_addresses_are_refused_without_a_connection() -> None:
    for url in ("http://169.254.169.254/latest", "http://[fd00:ec2::254]/", "http://100.100.100.200/",
                "http://[::ffff:169.254.169.254]/", "http://169.254.10.1:8000"):  # fmt: skip
        attempt = check(url, deadline=2.0)
        assert attempt.reason == ADDRESS_REFUSED, (url, attempt)


def test_a_host_that_does_not_resolve_is_unreachable_without_echoing_it() -> None:
    attempt = check("http://no-such-host.invalid:8000")
    assert attempt.reason == UNREACHABLE and "no-such-host" not in attempt.message


def test_the_init_containers_policy_comes_from_the_rendered_environment() -> None:
    policy = policy_from_env({"POSTTRAIN_TASK_APP_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
                              "POSTTRAIN_API_SERVER_ADDRESSES": "127.0.0.1:6443",
                              "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"})  # fmt: skip
    assert {str(ip) for ip, _ in policy.api_server} == {"127.0.0.1", "10.96.0.1"}
    assert policy.allowed and not policy.denied
