"""posttrain.api.urls: the task-app URL rules and the address rules (pure), and that the CRDs' CEL rule says
the same as the Python rule."""

from __future__ import annotations

import ipaddress
import re

import pytest
from posttrain.api.urls import (
    API_SERVER,
    DENIED,
    LINK_LOCAL,
    LOOPBACK,
    METADATA,
    NOT_UNICAST,
    URL_PATTERN,
    AddressPolicy,
    UrlRefused,
    address_refusal,
    check_url,
    endpoints,
    join_url,
    networks,
)

GOOD = [
    "http://task-app:8000",
    "https://tasks.example.com",
    "http://10.0.0.7:8100/apps/math/",
    "HTTP://Task-App.ns.svc.cluster.local:80/v1",
    "http://[fd00::1]:8000",
    "https://h/a%20b/c;d=e",
]
BAD = {
    "http://h:8000/internal/admin?x=": "query",
    "http://h:8000/internal/admin?": "query",
    "http://h:8000/internal/admin#": "fragment",
    "http://h/#/health": "fragment",
    "http://user:pw@h:8000": "user info",
    "http://user@h": "user info",
    "http://a@b@h/": "user info",
    "ftp://h/": "http or https",
    "file:///etc/passwd": "http or https",
    "gopher://h:70/": "http or https",
    "//h:8000": "http or https",
    "http://": "no host",
    "http://h:99999": "invalid port",
    "http://h:0": "invalid port",
    "http://h:80x": "invalid port",
    "http://h /x": "whitespace",
    "http://h/x\ny": "whitespace",
    "http://evil.example\\@h/": "backslash",
    "http://hé.example/": "non-ASCII",
    "http://h%2f.example/": "characters",
    "": "empty",
}
PORT_RANGE = {"http://h:99999", "http://h:0"}  # the CEL rule checks the port's digits, not its range


@pytest.mark.parametrize("url", GOOD)
def test_good_urls_pass_and_match_the_crd_pattern(url):
    assert check_url(f"  {url} ") == url
    assert re.fullmatch(URL_PATTERN, url)


@pytest.mark.parametrize("url,why", sorted(BAD.items()))
def test_bad_urls_are_refused_with_the_reason_and_not_the_url(url, why):
    with pytest.raises(UrlRefused) as err:
        check_url(url)
    assert why in err.value.reason
    assert "pw" not in str(err.value)
    if url.strip() and url not in PORT_RANGE:
        assert not re.fullmatch(URL_PATTERN, url.strip()), "the CEL rule must refuse it too"


def test_routes_are_joined_onto_the_path():
    assert join_url("http://h:8000/internal/admin", "/health") == "http://h:8000/internal/admin/health"
    assert join_url("http://h:8000/", "/task_info") == "http://h:8000/task_info"
    assert join_url("http://h:8000", "health") == "http://h:8000/health"
    with pytest.raises(UrlRefused):
        join_url("http://h:8000/internal/admin?x=", "/health")


CLOUD = AddressPolicy()


@pytest.mark.parametrize(
    "address,why",
    [
        ("169.254.169.254", METADATA),
        ("fd00:ec2::254", METADATA),
        ("100.100.100.200", METADATA),
        ("168.63.129.16", METADATA),
        ("::ffff:169.254.169.254", METADATA),
        ("64:ff9b::a9fe:a9fe", METADATA),  # NAT64 form of 169.254.169.254
        ("169.254.1.1", LINK_LOCAL),
        ("fe80::1", LINK_LOCAL),
        ("127.0.0.1", LOOPBACK),
        ("127.8.9.10", LOOPBACK),
        ("::1", LOOPBACK),
        ("0.0.0.0", LOOPBACK),
        ("::ffff:127.0.0.1", LOOPBACK),
        ("224.0.0.1", NOT_UNICAST),
        ("255.255.255.255", NOT_UNICAST),
    ],
)
def test_refused_addresses(address, why):
    assert address_refusal(address, 80, CLOUD) == why


@pytest.mark.parametrize("address", ["10.0.0.7", "192.168.1.2", "8.8.8.8", "fd00::1", "100.64.0.1"])
def test_ordinary_addresses_pass(address):
    assert address_refusal(address, 8000, CLOUD) is None


def test_settings_allow_loopback_but_never_the_api_server_port():
    api = endpoints("127.0.0.1:6443,10.96.0.1:443")
    policy = AddressPolicy(allowed=networks("127.0.0.0/8"), api_server=api)
    assert address_refusal("127.0.0.1", 8100, policy) is None
    assert address_refusal("::ffff:127.0.0.1", 8100, policy) is None
    assert address_refusal("127.0.0.1", 6443, policy) == API_SERVER
    assert address_refusal("::ffff:127.0.0.1", 6443, policy) == API_SERVER
    # the in-cluster API server's address is refused on every port unless allowed
    assert address_refusal("10.96.0.1", 443, policy) == API_SERVER
    assert address_refusal("10.96.0.1", 8080, policy) == API_SERVER
    assert address_refusal("10.96.0.1", 8080, AddressPolicy(allowed=networks("10.96.0.0/12"),
                                                            api_server=api)) is None  # fmt: skip
    assert address_refusal("169.254.169.254", 80, policy) == METADATA


def test_denied_networks_win_over_allowed_ones():
    policy = AddressPolicy(allowed=networks("10.0.0.0/8"), denied=networks(["10.1.0.0/16"]))
    assert address_refusal("10.1.2.3", 80, policy) == DENIED
    assert address_refusal("10.2.2.3", 80, policy) is None


def test_settings_parse():
    assert networks(" 127.0.0.0/8, ::1/128 ,") == (
        ipaddress.ip_network("127.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
    )
    with pytest.raises(ValueError, match="not a network"):
        networks("localhost")
    assert endpoints("[::1]:6443") == {(ipaddress.ip_address("::1"), 6443)}
