"""A policy endpoint's replicas: one URL per address its host name resolves to.

In a cluster the job file's endpoints.policy holds one URL per rollout Deployment: its headless Service's
name, which DNS resolves to every ready replica (pod) of the Deployment. A request to the name reaches one
of them, so the trainer addresses each replica by its IP instead: a weight sync POSTs to every replica, a
rollout's policy calls and its capture GET name the same replica, and every replica's busy seconds count.
The trainer resolves again at each weight sync and at each iteration's planning (pods are replaced).

A name that resolves to one address, an IP literal, `localhost` (a local run: 127.0.0.1 and ::1 are one
machine, whose server listens on one of them), an https URL (its certificate names the host, not the IP)
or a name that does not resolve stays the one URL it is (a failed resolution is logged once per URL).

A replica that replaces a pod (or a restarted server) starts from the base weights (weight version 0):
before each round of rollouts the trainer gives every replica that serves an older version than the last
sync those weights (weightsync.WeightSyncer.bring_up_to_date)."""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger("posttrain_trainer")

Resolver = Callable[..., Any]  # socket.getaddrinfo's signature

_warned: set[str] = set()


def _addresses(host: str, port: int, resolve: Resolver) -> list[Any]:
    """The IPv4 and IPv6 addresses `host` resolves to, each once, sorted (IPv4 first)."""
    found = set()
    for family, _type, _proto, _canon, sockaddr in resolve(host, port, type=socket.SOCK_STREAM):
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        text = str(sockaddr[0]).split("%", 1)[0]  # an IPv6 scope id names a link: no URL carries it
        try:
            found.add(ipaddress.ip_address(text))
        except ValueError:
            continue
    return sorted(found, key=lambda a: (a.version, int(a)))


def replica_urls(url: str, resolve: Resolver | None = socket.getaddrinfo) -> list[str]:
    """One URL per address `url`'s host resolves to (same scheme, port and path, the IP as host), sorted;
    [url] where there is nothing to expand (see the module's docstring). `resolve`: socket.getaddrinfo's
    signature (None: socket.getaddrinfo)."""
    parts = urlsplit(url)
    host = parts.hostname
    if parts.scheme.lower() != "http" or not host or host == "localhost" or host.endswith(".localhost"):
        return [url]
    try:
        ipaddress.ip_address(host)
        return [url]  # already one address
    except ValueError:
        pass
    try:
        port = parts.port or 80
        addresses = _addresses(host, port, resolve or socket.getaddrinfo)
    except (OSError, ValueError, UnicodeError) as err:
        if url not in _warned:
            _warned.add(url)
            log.warning("policy endpoint %s does not resolve (%s); using the name as it is", url, err)
        return [url]
    if len(addresses) <= 1:
        return [url]
    port_text = f":{parts.port}" if parts.port is not None else ""
    out = []
    for address in addresses:
        shown = f"[{address}]" if address.version == 6 else str(address)
        out.append(urlunsplit((parts.scheme, f"{shown}{port_text}", parts.path, parts.query, parts.fragment)))
    return out


def expand(urls: Sequence[str], resolve: Resolver | None = socket.getaddrinfo) -> list[str]:
    """Every endpoint's replica URLs, in order, each once."""
    out: list[str] = []
    for url in urls:
        for replica in replica_urls(url, resolve):
            if replica not in out:
                out.append(replica)
    return out
