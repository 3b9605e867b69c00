"""Task-app verification from the operator: GET /health and GET /task_info with the key from a Secret
(X-API-Key, X-API-Keys, Authorization: Bearer, as synth's clients send it), bounded retries with backoff.

One attempt -> Attempt (ok, or why not and whether it is worth retrying). A rejected key (HTTP 400/401/403)
is not retried: it will not fix itself. Everything else (unreachable, 5xx, a task app still starting, a
Secret not created yet) is retried with exponential backoff until `timeout_seconds` (default 300 s).

A task app is untrusted. One check (both GETs) runs under one overall deadline, responses are read as a
stream and abandoned past MAX_RESPONSE_BYTES (1 MiB; no decompression), redirects are not followed, and
what the operator reports (status, Events, logs) is the HTTP status and a fixed reason: never a response
body, never a header, never anything the task app chose. The only text taken from a response is the
task set's id and name (status.taskInfo), restricted to a small alphabet, cut to a few dozen characters
and withheld when it contains the key.

Where a check may go is posttrain.api.urls' rule: the URL is checked first (URLRefused), then every address
its host resolves to (AddressRefused: loopback, link-local, metadata, the API server, unless the
operator's settings allow them), and the request goes to the address that was checked (`pin`). The
trainer's init container runs this same prober (`posttrain verify-task-app --in-cluster`), with the
operator's settings from its environment (`policy_from_env`)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from posttrain.api.resources import Verification as VerificationSpec
from posttrain.api.urls import (
    AddressPolicy,
    UrlRefused,
    address_refusal,
    check_url,
    endpoints,
    join_url,
    networks,
)
from posttrain.controller.status import Verification
from posttrain.taskapp_client import auth_headers

if TYPE_CHECKING:  # the trainer image's init container imports this module without pydantic-settings
    from posttrain.controller.settings import OperatorSettings

UNREACHABLE = "Unreachable"
UNAUTHORIZED = "Unauthorized"
UNCONFIGURED = "Unconfigured"
HTTP_ERROR = "HTTPError"
BAD_RESPONSE = "BadResponse"
TIMED_OUT = "Timeout"
SECRET_MISSING = "SecretMissing"
TASKAPP_MISSING = "TaskAppNotFound"
INVALID_SPEC = "InvalidSpec"  # the API server refused what the TaskApp's spec rendered into
URL_REFUSED = "URLRefused"  # posttrain.api.urls refuses the URL
ADDRESS_REFUSED = "AddressRefused"  # the host resolves to an address the operator does not connect to
SECRET_NOT_LABELLED = "SecretNotLabelled"  # the key's Secret lacks posttrain.dev/use=task-app-key
VERIFIED = "Verified"
PERMANENT = {UNAUTHORIZED, INVALID_SPEC, URL_REFUSED, ADDRESS_REFUSED}
MAX_RESPONSE_BYTES = 1 << 20
TASK_INFO_TEXT_MAX = 63
WHY = {
    UNAUTHORIZED: "the task app rejected the API key",
    UNCONFIGURED: "the task app has no ENVIRONMENT_API_KEY configured",
}
# The CRD's bounds of spec.verification (posttrain.api.resources.Verification); a request timeout from the
# operator's own settings is held to them too, so that no setting can make a check unbounded.
TIMEOUT_RANGE = (1.0, 3600.0)
PERIOD_RANGE = (5.0, 86400.0)
REQUEST_TIMEOUT_RANGE = (1.0, 60.0)


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


@dataclass(frozen=True)
class VerifyPolicy:
    timeout_seconds: float = 300.0
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    request_timeout: float = 10.0  # the deadline of one whole check
    period_seconds: float = 60.0

    @staticmethod
    def from_settings(settings: OperatorSettings, verification: VerificationSpec | None = None) -> VerifyPolicy:
        """Operator defaults, overridden by what a TaskApp's spec.verification sets (timeoutSeconds,
        periodSeconds, requestTimeoutSeconds), every value held to the CRD's bounds."""
        given = verification.model_dump(exclude_unset=True, by_alias=False) if verification is not None else {}

        def value(name: str, default: float, bounds: tuple[float, float]) -> float:
            return _clamp(float(given[name]), bounds) if given.get(name) else float(default)

        return VerifyPolicy(
            timeout_seconds=value("timeout_seconds", settings.verify_timeout_seconds, TIMEOUT_RANGE),
            backoff_initial=float(settings.verify_backoff_initial),
            backoff_max=float(settings.verify_backoff_max),
            request_timeout=_clamp(
                float(given.get("request_timeout_seconds") or settings.verify_request_timeout),
                REQUEST_TIMEOUT_RANGE,
            ),
            period_seconds=value("period_seconds", settings.reverify_period_seconds, PERIOD_RANGE),
        )

    def delays(self) -> Any:
        delay = self.backoff_initial
        while True:
            yield delay
            delay = min(self.backoff_max, delay * 2)


@dataclass(frozen=True)
class Attempt:
    ok: bool
    reason: str
    message: str
    http_status: int | None = None
    task_info: dict[str, Any] | None = None

    @property
    def retryable(self) -> bool:
        return not self.ok and self.reason not in PERMANENT


_SAFE_TEXT = re.compile(r"[^A-Za-z0-9 ._:/()+-]")


def safe_text(value: Any, api_key: str | None = None, limit: int = TASK_INFO_TEXT_MAX) -> str:
    """A task app's self-description cut down to what a status may show: a small alphabet, `limit`
    characters, and nothing at all when it contains the key (or a long piece of it)."""
    text = _SAFE_TEXT.sub("", str(value or ""))[:limit].strip()
    if api_key and contains_key(text, api_key):
        return "(withheld)"
    return text


def contains_key(text: str, api_key: str, piece: int = 8) -> bool:
    """Whether `text` holds the key or any `piece`-character run of it (echoed, truncated or split)."""
    if not api_key:
        return False
    if api_key in text:
        return True
    return any(api_key[i : i + piece] in text for i in range(max(1, len(api_key) - piece + 1)))


def summarise_task_info(body: Any, api_key: str | None = None) -> dict[str, Any]:
    """{id, name, rubric: present?} from /task_info's {"taskset": ...} (or a bare TaskInfo)."""
    info = body.get("taskset", body) if isinstance(body, dict) else {}
    info = info if isinstance(info, dict) else {}
    task = info.get("task") if isinstance(info.get("task"), dict) else info
    rubric = info.get("rubric") or info.get("rubrics")
    return {
        "id": safe_text(task.get("id") or info.get("id") or "", api_key),
        "name": safe_text(task.get("name") or info.get("name") or "", api_key),
        "rubric": bool(rubric),
    }


def _error_code(body: bytes) -> str | None:
    """synth's machine-readable error code ({"detail": {"error": {"code"}}} or {"error": {"code"}}), used
    only to tell the reasons apart; it is never shown."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    detail = data.get("detail") if isinstance(data, dict) else None
    for holder in (detail, data):
        if isinstance(holder, dict) and isinstance(holder.get("error"), dict):
            code = holder["error"].get("code")
            return code if isinstance(code, str) else None
    return None


class _TooLarge(Exception):
    pass


async def _read_capped(response: httpx.Response, limit: int) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > limit:
            raise _TooLarge
    return bytes(body)


async def _get(
    client: httpx.AsyncClient, base: str, path: str, headers: dict[str, str], max_bytes: int,
    extensions: dict[str, Any] | None = None,
) -> tuple[Attempt | None, Any]:
    try:
        request = client.build_request("GET", join_url(base, path), headers=headers, extensions=extensions)
        response = await client.send(request, stream=True)
        try:
            code = response.status_code
            try:
                body = await _read_capped(response, max_bytes)
            except _TooLarge:
                text = f"GET {path} -> HTTP {code}, response larger than {max_bytes // 1024} KiB"
                return Attempt(False, BAD_RESPONSE, text, http_status=code), None
        finally:
            await response.aclose()
    except httpx.TimeoutException as exc:
        return Attempt(False, UNREACHABLE, f"GET {path} timed out ({type(exc).__name__})"), None
    except httpx.HTTPError as exc:
        return Attempt(False, UNREACHABLE, f"GET {path} failed ({type(exc).__name__})"), None
    if code >= 400:
        err = _error_code(body)
        if err == "missing_environment_api_key" or (code == 503 and err is None and path == "/health"):
            reason = UNCONFIGURED
        elif err == "unauthorised" or code in (400, 401, 403):
            reason = UNAUTHORIZED
        else:
            reason = HTTP_ERROR
        why = f" ({WHY[reason]})" if reason in WHY else ""
        return Attempt(False, reason, f"GET {path} -> HTTP {code}{why}", http_status=code), None
    if 300 <= code < 400:
        text = f"GET {path} -> HTTP {code} (redirects are not followed)"
        return Attempt(False, BAD_RESPONSE, text, http_status=code), None
    try:
        return None, json.loads(body)
    except ValueError:
        return Attempt(False, BAD_RESPONSE, f"GET {path} -> HTTP {code}, not JSON", http_status=code), None


@dataclass(frozen=True)
class Pinned:
    """Where one check connects: the URL with the host replaced by an address that was checked, and the
    Host header and TLS server name of the original host (so that a second lookup cannot send the request
    elsewhere)."""

    base: str
    headers: dict[str, str]
    extensions: dict[str, Any]


async def pin(url: str, policy: AddressPolicy) -> Pinned | Attempt:
    """Resolve the URL's host and check every address it resolves to (posttrain.api.urls); the first one
    when all pass, an Attempt saying which rule refused otherwise."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return Attempt(False, UNREACHABLE, "the task app's host name does not resolve")
    addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        return Attempt(False, UNREACHABLE, "the task app's host name does not resolve")
    for address in addresses:
        why = address_refusal(address, port, policy)
        if why:
            text = f"the task app's host resolves to {why}: the operator does not connect there"
            return Attempt(False, ADDRESS_REFUSED, text)
    first = addresses[0]
    netloc = f"[{first}]:{port}" if first.version == 6 else f"{first}:{port}"
    base = urlunsplit((parts.scheme.lower(), netloc, parts.path, "", ""))
    extensions = {"sni_hostname": host} if parts.scheme.lower() == "https" else {}
    return Pinned(base, {"Host": parts.netloc}, extensions)


def address_policy(
    allowed: str | Iterable[str] = "", denied: str | Iterable[str] = "", api_server: str | Iterable[str] = ""
) -> AddressPolicy:
    return AddressPolicy(allowed=networks(allowed), denied=networks(denied), api_server=endpoints(api_server))


def policy_from_settings(settings: OperatorSettings) -> AddressPolicy:
    return address_policy(
        settings.task_app_allowed_networks, settings.task_app_denied_networks, settings.api_server_addresses
    )


def policy_from_env(environ: dict[str, str] | None = None) -> AddressPolicy:
    """The policy of the trainer's init container: the operator's settings as the operator rendered them
    into its environment (POSTTRAIN_TASK_APP_*_NETWORKS, POSTTRAIN_API_SERVER_ADDRESSES), and the API
    server the pod itself is told of (KUBERNETES_SERVICE_HOST/PORT)."""
    env = os.environ if environ is None else environ
    api = [a for a in env.get("POSTTRAIN_API_SERVER_ADDRESSES", "").split(",") if a.strip()]
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if host:
        try:
            ip = ipaddress.ip_address(host)
            api.append(f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}")
        except ValueError:
            pass  # a name: the operator's own addresses above cover it
    return address_policy(
        env.get("POSTTRAIN_TASK_APP_ALLOWED_NETWORKS", ""), env.get("POSTTRAIN_TASK_APP_DENIED_NETWORKS", ""), api
    )


async def api_server_addresses(host_url: str, environ: dict[str, str] | None = None) -> list[str]:
    """ip:port of the API server the operator talks to (its URL's host, resolved) and of the in-cluster
    Service (KUBERNETES_SERVICE_HOST/PORT): what a task app's URL may never point at."""
    env = os.environ if environ is None else environ
    parts = urlsplit(host_url)
    wanted = [(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))]
    if env.get("KUBERNETES_SERVICE_HOST"):
        wanted.append((env["KUBERNETES_SERVICE_HOST"], int(env.get("KUBERNETES_SERVICE_PORT") or 443)))
    out: list[str] = []
    for host, port in wanted:
        if not host:
            continue
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            continue
        for info in infos:
            ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            text = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
            if text not in out:
                out.append(text)
    return out


class TaskAppProber:
    """The operator's one HTTP client for task apps (connection pool shared by every check)."""

    def __init__(
        self,
        *,
        transport: Any = None,
        max_bytes: int = MAX_RESPONSE_BYTES,
        max_connections: int = 100,
        addresses: AddressPolicy | None = None,
    ):
        self.max_bytes = max_bytes
        # None: no address rule (a person's own `posttrain verify-task-app`); the operator and the trainer's
        # init container always pass one
        self.addresses = addresses
        self._transport = transport
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=20)
        self._client: httpx.AsyncClient | None = None
        self.checks = 0

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                transport=self._transport,
                limits=self._limits,
                follow_redirects=False,
                headers={"Accept-Encoding": "identity"},
                timeout=httpx.Timeout(60.0),  # the per-check deadline below is the real bound
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def check(self, url: str, api_key: str | None, *, deadline: float = 10.0) -> Attempt:
        """One verification attempt: /health (2xx, not healthy=false) then /task_info (2xx, parses), both
        within `deadline` seconds (the address lookup included)."""
        self.checks += 1
        try:
            url = check_url(url)
        except UrlRefused as err:
            return Attempt(False, URL_REFUSED, f"the task app's URL {err.reason}")
        headers = auth_headers(api_key)
        client = self.client()
        current = "/health"
        try:
            async with asyncio.timeout(deadline):
                extensions: dict[str, Any] = {}
                if self.addresses is not None:
                    pinned = await pin(url, self.addresses)
                    if isinstance(pinned, Attempt):
                        return pinned
                    url, headers, extensions = pinned.base, {**headers, **pinned.headers}, pinned.extensions
                failed, health = await _get(client, url, current, headers, self.max_bytes, extensions)
                if failed:
                    return failed
                if isinstance(health, dict) and health.get("healthy") is False:
                    return Attempt(False, BAD_RESPONSE, "GET /health -> healthy=false", http_status=200)
                current = "/task_info"
                failed, info = await _get(client, url, current, headers, self.max_bytes, extensions)
        except TimeoutError:
            return Attempt(False, UNREACHABLE, f"GET {current} did not finish within {deadline:g} s")
        if failed:
            return failed
        if not isinstance(info, dict):
            return Attempt(False, BAD_RESPONSE, "GET /task_info -> not a JSON object", http_status=200)
        summary = summarise_task_info(info, api_key)
        return Attempt(True, VERIFIED, "GET /health 200, GET /task_info 200", 200, summary)


async def check_once(
    url: str,
    api_key: str | None,
    *,
    request_timeout: float = 10.0,
    transport: Any = None,
    addresses: AddressPolicy | None = None,
) -> Attempt:
    """One attempt with a client of its own (the CLI and tests; the operator shares a TaskAppProber)."""
    prober = TaskAppProber(transport=transport, addresses=addresses)
    try:
        return await prober.check(url, api_key, deadline=request_timeout)
    finally:
        await prober.close()


def as_verification(attempt: Attempt, target: str, *, state: str, attempts: int) -> Verification:
    message = attempt.message
    if state == "failed" and attempts > 1:
        message = f"{message} (gave up after {attempts} attempts)"
    elif state == "pending" and attempts:
        message = f"{message} (attempt {attempts}, retrying)"
    return Verification(
        state=state,
        target=target,
        message=message,
        reason=attempt.reason,
        http_status=attempt.http_status,
        task_info=attempt.task_info,
        attempts=attempts,
    )


async def verify_with_retries(
    attempt: Callable[[], Awaitable[Attempt]],
    policy: VerifyPolicy,
    target: str,
    *,
    started: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    on_attempt: Callable[[Verification], Awaitable[None]] | None = None,
) -> Verification:
    """Attempt until ok, a permanent failure, or `policy.timeout_seconds` since `started` (bounded)."""
    started = clock() if started is None else started
    for count, delay in enumerate(policy.delays(), start=1):
        result = await attempt()
        if result.ok:
            return as_verification(result, target, state="ok", attempts=count)
        out_of_time = clock() - started + delay > policy.timeout_seconds
        if not result.retryable or out_of_time:
            return as_verification(result, target, state="failed", attempts=count)
        if on_attempt is not None:
            await on_attempt(as_verification(result, target, state="pending", attempts=count))
        await sleep(delay)
    raise AssertionError("policy.delays() is endless")
