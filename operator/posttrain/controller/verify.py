"""Task-app verification from the operator: GET /health and GET /task_info with the key from a Secret
(X-API-Key, X-API-Keys, Authorization: Bearer, as synth's clients send it), bounded retries with backoff.

One attempt -> Attempt (ok, or why not and whether it is worth retrying). A rejected key (HTTP 400/401/403)
is not retried: it will not fix itself. Everything else (unreachable, 5xx, a task app still starting, a
Secret not created yet) is retried with exponential backoff until `timeout_seconds` (default 300 s)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from posttrain.controller.settings import OperatorSettings
from posttrain.controller.status import Verification
from posttrain.taskapp_client import _error_code, _error_message, auth_headers

UNREACHABLE = "Unreachable"
UNAUTHORIZED = "Unauthorized"
UNCONFIGURED = "Unconfigured"
HTTP_ERROR = "HTTPError"
BAD_RESPONSE = "BadResponse"
SECRET_MISSING = "SecretMissing"
TASKAPP_MISSING = "TaskAppNotFound"
VERIFIED = "Verified"
PERMANENT = {UNAUTHORIZED}


@dataclass(frozen=True)
class VerifyPolicy:
    timeout_seconds: float = 300.0
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    request_timeout: float = 10.0
    period_seconds: float = 60.0

    @staticmethod
    def from_settings(settings: OperatorSettings, verification: dict[str, Any] | None = None) -> VerifyPolicy:
        """Operator defaults, overridden by a TaskApp's spec.verification {timeoutSeconds, periodSeconds,
        requestTimeoutSeconds, backoffSeconds}."""
        v = verification or {}
        return VerifyPolicy(
            timeout_seconds=float(v.get("timeoutSeconds") or settings.verify_timeout_seconds),
            backoff_initial=float(v.get("backoffSeconds") or settings.verify_backoff_initial),
            backoff_max=float(v.get("maxBackoffSeconds") or settings.verify_backoff_max),
            request_timeout=float(v.get("requestTimeoutSeconds") or settings.verify_request_timeout),
            period_seconds=float(v.get("periodSeconds") or settings.reverify_period_seconds),
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


def summarise_task_info(body: Any) -> dict[str, Any]:
    """{id, name, rubric: present?} from /task_info's {"taskset": ...} (or a bare TaskInfo)."""
    info = body.get("taskset", body) if isinstance(body, dict) else {}
    info = info if isinstance(info, dict) else {}
    task = info.get("task") if isinstance(info.get("task"), dict) else info
    rubric = info.get("rubric") or info.get("rubrics")
    return {
        "id": str(task.get("id") or info.get("id") or ""),
        "name": str(task.get("name") or info.get("name") or ""),
        "rubric": bool(rubric),
    }


async def _get(client: httpx.AsyncClient, url: str, path: str) -> tuple[Attempt | None, Any]:
    try:
        response = await client.get(url + path)
    except httpx.TimeoutException as exc:
        return Attempt(False, UNREACHABLE, f"GET {path} timed out ({type(exc).__name__})"), None
    except httpx.HTTPError as exc:
        return Attempt(False, UNREACHABLE, f"GET {path} failed: {type(exc).__name__}: {exc}"), None
    code = response.status_code
    if code >= 400:
        err = _error_code(response)
        detail = _error_message(response)[:200]
        if err == "missing_environment_api_key" or (code == 503 and err is None and path == "/health"):
            reason = UNCONFIGURED
        elif err == "unauthorised" or code in (400, 401, 403):
            reason = UNAUTHORIZED
        else:
            reason = HTTP_ERROR
        text = f"GET {path} -> HTTP {code}{f' {err}' if err else ''}" + (f": {detail}" if detail else "")
        return Attempt(False, reason, text, http_status=code), None
    try:
        return None, response.json()
    except ValueError:
        return Attempt(False, BAD_RESPONSE, f"GET {path} -> HTTP {code}, not JSON", http_status=code), None


async def check_once(
    url: str, api_key: str | None, *, request_timeout: float = 10.0, transport: Any = None
) -> Attempt:
    """One verification attempt: /health (2xx, not healthy=false) then /task_info (2xx, parses)."""
    url = url.rstrip("/")
    async with httpx.AsyncClient(
        timeout=request_timeout, headers=auth_headers(api_key), transport=transport
    ) as client:
        failed, health = await _get(client, url, "/health")
        if failed:
            return failed
        if isinstance(health, dict) and health.get("healthy") is False:
            return Attempt(False, BAD_RESPONSE, "GET /health -> healthy=false", http_status=200)
        failed, info = await _get(client, url, "/task_info")
        if failed:
            return failed
        if not isinstance(info, dict):
            return Attempt(False, BAD_RESPONSE, "GET /task_info -> not a JSON object", http_status=200)
        summary = summarise_task_info(info)
        what = summary["name"] or summary["id"] or "unnamed taskset"
        return Attempt(True, VERIFIED, f"GET /health 200, GET /task_info 200 ({what})", 200, summary)


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
