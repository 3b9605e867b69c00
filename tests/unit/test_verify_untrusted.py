"""Task apps are untrusted: the operator's checks against misbehaving real HTTP servers on 127.0.0.1
(tests/fixtures/hostile_taskapp.py). Bounded reads, one overall deadline, no response text in what the
operator reports, one shared client, one check per (URL, Secret version)."""

from __future__ import annotations

import asyncio
import time

import pytest
from posttrain.controller.settings import OperatorSettings
from posttrain.controller.verify import (
    BAD_RESPONSE,
    MAX_RESPONSE_BYTES,
    UNAUTHORIZED,
    UNREACHABLE,
    VERIFIED,
    TaskAppProber,
    VerifyPolicy,
    contains_key,
    safe_text,
)
from posttrain.controller.verify_cache import CheckKey, TtlCache

KEY = "sk_env_secret_key_value_0042"


def check(url: str, key: str | None = KEY, deadline: float = 5.0):
    async def go():
        prober = TaskAppProber()
        try:
            return await prober.check(url, key, deadline=deadline)
        finally:
            await prober.close()

    return asyncio.run(go())


def test_a_huge_response_is_abandoned_after_one_mib(hostile_taskapp) -> None:
    attempt = check(hostile_taskapp.at("huge"))
    assert not attempt.ok and attempt.reason == BAD_RESPONSE and attempt.http_status == 200
    assert attempt.message == "GET /health -> HTTP 200, response larger than 1024 KiB"
    # the operator hung up: the server's writes stop at the cap plus what the loopback socket buffers hold
    time.sleep(0.5)
    sent = hostile_taskapp.sent["huge"]
    time.sleep(0.5)
    assert hostile_taskapp.sent["huge"] == sent and sent < 16 * MAX_RESPONSE_BYTES, sent


def test_a_trickling_task_app_is_cut_off_at_the_check_deadline(hostile_taskapp) -> None:
    started = time.monotonic()
    attempt = check(hostile_taskapp.at("trickle"), deadline=2.0)
    took = time.monotonic() - started
    assert not attempt.ok and attempt.reason == UNREACHABLE and attempt.retryable
    assert attempt.message == "GET /health did not finish within 2 s"
    assert 1.9 <= took < 4.0, took  # per-read timeouts alone would wait for ever: a byte comes every 0.5 s


def test_a_key_echoed_in_an_error_body_never_reaches_the_report(hostile_taskapp) -> None:
    attempt = check(hostile_taskapp.at("echo"))
    assert not attempt.ok and attempt.reason == UNAUTHORIZED and attempt.http_status == 400
    assert attempt.message == "GET /health -> HTTP 400 (the task app rejected the API key)"
    assert KEY not in repr(attempt) and KEY[:12] not in repr(attempt)


def test_task_info_text_that_carries_the_key_is_withheld() -> None:
    from posttrain.controller.verify import summarise_task_info

    info = summarise_task_info({"taskset": {"id": KEY, "name": f"math {KEY[3:20]}"}}, KEY)
    assert info == {"id": "(withheld)", "name": "(withheld)", "rubric": False}
    long = summarise_task_info({"taskset": {"id": "m" * 500, "name": "<script>x</script>\n\u202e"}}, KEY)
    assert long["id"] == "m" * 63 and long["name"] == "scriptx/script"
    assert contains_key("...x" + KEY[5:14] + "y", KEY) and not contains_key("math", KEY)
    assert safe_text("Arithmetic (2-digit)", KEY) == "Arithmetic (2-digit)"


def test_redirects_are_not_followed(hostile_taskapp) -> None:
    attempt = check(hostile_taskapp.at("redirect"))
    assert not attempt.ok and attempt.reason == BAD_RESPONSE and attempt.http_status == 302
    assert "169.254" not in attempt.message


def test_a_well_behaved_task_app_behind_a_long_url(hostile_taskapp) -> None:
    attempt = check(hostile_taskapp.at("ok", "p" * 1500))
    assert attempt.ok and attempt.reason == VERIFIED
    assert attempt.task_info == {"id": "math", "name": "Arithmetic", "rubric": True}


def test_one_check_per_url_and_secret_version_shared_by_concurrent_askers(hostile_taskapp) -> None:
    async def go():
        prober = TaskAppProber()
        cache: TtlCache = TtlCache()
        url = hostile_taskapp.at("ok")

        async def ask(version: str):
            key = CheckKey(url, ("ns", "s", "k"), version, 5.0)
            return await cache.get(key, 60.0, lambda: prober.check(url, KEY, deadline=5.0))

        first = await asyncio.gather(*(ask("1") for _ in range(50)))
        again = await ask("1")
        rotated = await ask("2")  # a new Secret resourceVersion is a new check
        await prober.close()
        return first, again, rotated, prober.checks, cache.computed

    first, again, rotated, checks, computed = asyncio.run(go())
    assert all(a.ok for a in first) and again.ok and rotated.ok
    assert checks == computed == 2
    assert hostile_taskapp.requests["ok"] == 4  # /health + /task_info, twice


def test_cached_results_expire_and_failures_expire_sooner() -> None:
    clock = [0.0]
    calls = []

    async def go():
        cache: TtlCache = TtlCache(clock=lambda: clock[0])
        key = CheckKey("http://x", None, None, 1.0)

        async def compute():
            calls.append(clock[0])
            return len(calls) % 2 == 0  # False (a failure), then True, ...

        ttl = lambda ok: 10.0 if ok else 1.0  # noqa: E731
        assert await cache.get(key, ttl, compute) is False
        clock[0] = 0.5
        assert await cache.get(key, ttl, compute) is False  # cached failure
        clock[0] = 1.5
        assert await cache.get(key, ttl, compute) is True  # failure expired after 1 s
        clock[0] = 9.0
        assert await cache.get(key, ttl, compute) is True  # success kept 10 s

    asyncio.run(go())
    assert calls == [0.0, 1.5]


def test_verification_knobs_are_bounded() -> None:
    from posttrain.api.resources import Verification
    from posttrain.controller.objects import parse_task_app
    from posttrain.controller.spec_errors import SpecError

    knobs = {"timeoutSeconds": 10**6, "periodSeconds": 1, "requestTimeoutSeconds": 900}
    with pytest.raises(SpecError) as err:  # what the CRD refuses, the operator's models refuse too
        parse_task_app({"kind": "TaskApp", "metadata": {"name": "t"}, "spec": {"url": "http://t", "verification": knobs}})
    assert str(err.value).startswith("spec.verification.")
    unchecked = Verification.model_construct(timeout_seconds=10**6, period_seconds=1, request_timeout_seconds=900)
    policy = VerifyPolicy.from_settings(OperatorSettings(), unchecked)
    assert (policy.timeout_seconds, policy.period_seconds, policy.request_timeout) == (3600, 5, 60)
    assert VerifyPolicy.from_settings(OperatorSettings(verify_request_timeout=900)).request_timeout == 60
