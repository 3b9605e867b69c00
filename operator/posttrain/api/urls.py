"""Pure: the rules for a task app's URL and for the addresses the operator (and the trainer's init
container) may connect to. The one home of these rules: `posttrain convert` / `validate` (through the TOML
sections and the custom resources' models), the CRDs (URL_PATTERN as a CEL rule), the operator's prober and
the init container (posttrain.controller.verify) all call the functions here.

A URL: http or https, a host, an optional port and path; no user info (`user:pw@`), no query (`?`), no
fragment (`#`), nothing outside printable ASCII, no backslash. Routes are joined onto its path
(`join_url`), never pasted after the text.

An address (what the host resolves to, never the name): refused when it is a cloud metadata address, a
link-local one, loopback or "this host", not unicast, in a network the operator's settings deny, or the API
server's; `AddressPolicy.allowed` (the operator's settings) lets loopback, link-local, metadata or the API
server's address (on any port but the API server's own) through where a cluster needs it, e.g. tests that
run task apps on 127.0.0.1. See docs/secrets-and-urls.md."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = ("http", "https")
# The policy's inference URL carries `?cid=<id>` (the correlation id the rollout server captures under);
# synth's own task apps assert that it starts with "trace_" (synth-ai 0.2.19, examples/task_apps/crafter/
# task_app/synth_envs_hosted/utils.py, inference_url_to_trace_correlation_id), so every cid we make does.
CID_PREFIX = "trace_"
# How long our HTTP pools keep an idle connection: under the 5 s after which uvicorn (task apps) and vLLM's
# server (VLLM_HTTP_TIMEOUT_KEEP_ALIVE) close one; at httpx's default, also 5 s, a request sent just as the
# server closed its connection failed with ReadError (a weight sync 6 s after the last completion).
IDLE_CONNECTION_EXPIRY_S = 2.0
# The whole rule as one regular expression (RE2 and Python agree on it): the CRDs' CEL rule, and the last
# check of check_url. Path characters are RFC 3986's pchar and "/".
URL_PATTERN = (
    r"^[hH][tT][tT][pP][sS]?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?"
    r"(/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*)?$"
)
URL_MESSAGE = "must be an http(s) URL without user info, query or fragment, e.g. http://task-app:8000"
EXAMPLE_FIX = "write e.g. http://task-app:8000 (a key goes in a Secret, never in the URL)"


class UrlRefused(ValueError):
    """A URL the rules refuse; `reason` says what is wrong in a few words, `fix` what to do."""

    def __init__(self, reason: str, fix: str = EXAMPLE_FIX):
        super().__init__(f"{reason} -- fix: {fix}")
        self.reason = reason
        self.fix = fix


def check_url(value: object) -> str:
    """The URL (surrounding whitespace removed) when the rules accept it; UrlRefused otherwise. The reason
    never repeats the URL (it may carry a password)."""
    if not isinstance(value, str):
        raise UrlRefused("is not a string")
    text = value.strip()
    if not text:
        raise UrlRefused("is empty")
    if any(ord(c) <= 0x20 or ord(c) >= 0x7F or c == "\\" for c in text):
        raise UrlRefused("contains whitespace, a control or non-ASCII character, or a backslash",
                         "percent-encode the path; write the host in ASCII (punycode)")  # fmt: skip
    parts = urlsplit(text)
    if parts.scheme.lower() not in SCHEMES:
        raise UrlRefused("is not an http or https URL")
    if "@" in parts.netloc:
        raise UrlRefused("carries user info (user:password@host)",
                         "remove it: the task app's key goes in a Secret (apiKeySecretRef)")  # fmt: skip
    if "?" in text:
        raise UrlRefused("has a query (?...)", "remove it: a task app's URL is its base URL")
    if "#" in text:
        raise UrlRefused("has a fragment (#...)", "remove it: a task app's URL is its base URL")
    if not parts.hostname:
        raise UrlRefused("has no host")
    try:
        port = parts.port
    except ValueError:
        raise UrlRefused("has an invalid port") from None
    if port == 0:
        raise UrlRefused("has an invalid port")
    if not re.fullmatch(URL_PATTERN, text):
        raise UrlRefused("has characters a host or path may not have")
    return text


def join_url(base: str, route: str) -> str:
    """`route` (e.g. "/health") under the base URL's path: http://h/app + /health -> http://h/app/health."""
    parts = urlsplit(check_url(base))
    path = parts.path.rstrip("/") + "/" + route.lstrip("/")
    return urlunsplit((parts.scheme.lower(), parts.netloc, path, "", ""))


# ------------------------------------------------------------------------------------------ addresses

METADATA = "a cloud metadata address"
LINK_LOCAL = "a link-local address"
LOOPBACK = "a loopback address"
NOT_UNICAST = "not a unicast address"
DENIED = "in a network the operator's settings deny"
API_SERVER = "the Kubernetes API server's address"
# (networks, why), most specific first. Metadata services: AWS (169.254.169.254, fd00:ec2::254, ECS
# 169.254.170.2), GCP and Azure (169.254.169.254, Azure's wire server 168.63.129.16), Alibaba
# (100.100.100.200), Oracle (192.0.0.192).
REFUSED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("169.254.169.254/32", "169.254.170.2/32", "fd00:ec2::254/128", "100.100.100.200/32",
      "168.63.129.16/32", "192.0.0.192/32"), METADATA),  # fmt: skip
    (("169.254.0.0/16", "fe80::/10"), LINK_LOCAL),
    (("127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128"), LOOPBACK),
    (("224.0.0.0/4", "240.0.0.0/4", "ff00::/8"), NOT_UNICAST),
)
_REFUSED = tuple((tuple(ipaddress.ip_network(n) for n in nets), why) for nets, why in REFUSED)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def networks(text: str | Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDRs from a comma-separated setting (or a list); ValueError naming a bad one."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in (i.strip() for i in items):
        if item:
            try:
                out.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(f"{item!r} is not a network (CIDR, e.g. 127.0.0.0/8)") from None
    return tuple(out)


def endpoints(text: str | Iterable[str]) -> frozenset[tuple[IPAddress, int]]:
    """(address, port) pairs from "ip:port,[ipv6]:port" (the API server's addresses)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = set()
    for item in (i.strip() for i in items):
        if not item:
            continue
        host, _, port = item.rpartition(":")
        out.add((ipaddress.ip_address(host.strip("[]")), int(port)))
    return frozenset(out)


def format_endpoints(pairs: Iterable[tuple[IPAddress, int]]) -> str:
    return ",".join(f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}" for ip, port in sorted(
        pairs, key=lambda p: (p[0].version, int(p[0]), p[1])))  # fmt: skip


@dataclass(frozen=True)
class AddressPolicy:
    """Which addresses a task app may be at (the operator's settings; see the module's docstring)."""

    allowed: tuple[IPNetwork, ...] = ()
    denied: tuple[IPNetwork, ...] = ()
    api_server: frozenset[tuple[IPAddress, int]] = field(default_factory=frozenset)


def _forms(ip: IPAddress) -> list[IPAddress]:
    """The address and the IPv4 address an IPv6 one carries (mapped ::ffff:a.b.c.d, NAT64 64:ff9b::/96)."""
    forms: list[IPAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            forms.append(ip.ipv4_mapped)
        elif ip in _NAT64:
            forms.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return forms


def _within(ip: IPAddress, nets: Iterable[IPNetwork]) -> bool:
    return any(ip.version == net.version and ip in net for net in nets)


def address_refusal(address: str | IPAddress, port: int, policy: AddressPolicy) -> str | None:
    """Why a connection to (address, port) is refused, in fixed words; None when it is allowed."""
    forms = _forms(ipaddress.ip_address(address) if isinstance(address, str) else address)
    api_ips = {ip for ip, _ in policy.api_server}
    for ip in forms:
        if (ip, port) in policy.api_server:
            return API_SERVER  # never, whatever is allowed: the API server's own port
        if _within(ip, policy.denied):
            return DENIED
        allowed = _within(ip, policy.allowed)
        for nets, why in _REFUSED:
            if not allowed and _within(ip, nets):
                return why
        if ip in api_ips and not allowed:
            return API_SERVER
    return None
