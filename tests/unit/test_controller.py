"""Controller pieces without a cluster: verification against a real HTTP server on 127.0.0.1 (the synth
task-app contract), the retry bound, and the apply-only-what-is-missing rule (with a recording client)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fixtures.jobs import job_object, rl_spec
from posttrain.api.resources import Verification
from posttrain.controller import render
from posttrain.controller.apply import ensure_children, observe
from posttrain.controller.objects import parse_job
from posttrain.controller.reconcile_job import JobState, expected_of
from posttrain.controller.settings import OperatorSettings
from posttrain.controller.status import DeploymentObs, Observed, TrainerObs
from posttrain.controller.verify import (
    UNAUTHORIZED,
    UNREACHABLE,
    Attempt,
    VerifyPolicy,
    check_once,
    summarise_task_info,
    verify_with_retries,
)

KEY = "sk_env_unit_0001"


class TaskAppServer:
    """A minimal synth-contract task app: /health and /task_info, X-API-Key checked (400 unauthorised)."""

    def __init__(self, key: str = KEY):
        self.status_override: int | None = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                if server.status_override:
                    return self._send(server.status_override, {"detail": "down"})
                if self.headers.get("X-API-Key") != key:
                    err = {
                        "detail": {"error": {"code": "unauthorised", "message": "API key missing or invalid"}}
                    }
                    return self._send(400, err)
                if self.path == "/health":
                    return self._send(200, {"healthy": True, "auth": {"required": True}})
                if self.path == "/task_info":
                    return self._send(
                        200, {"taskset": {"id": "math", "name": "Arithmetic", "rubric": {"x": 1}}}
                    )
                return self._send(404, {"detail": "not found"})

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def task_app() -> Iterator[TaskAppServer]:
    server = TaskAppServer()
    yield server
    server.close()


def test_check_once_ok(task_app: TaskAppServer) -> None:
    attempt = asyncio.run(check_once(task_app.url, KEY))
    assert attempt.ok and attempt.http_status == 200
    assert attempt.task_info == {"id": "math", "name": "Arithmetic", "rubric": True}


def test_check_once_wrong_key_is_permanent(task_app: TaskAppServer) -> None:
    attempt = asyncio.run(check_once(task_app.url, "wrong"))
    assert not attempt.ok and attempt.reason == UNAUTHORIZED and attempt.http_status == 400
    assert "HTTP 400" in attempt.message and "wrong" not in attempt.message
    assert not attempt.retryable


def test_check_once_5xx_is_retryable(task_app: TaskAppServer) -> None:
    task_app.status_override = 502
    attempt = asyncio.run(check_once(task_app.url, KEY))
    assert not attempt.ok and attempt.http_status == 502 and attempt.retryable


def test_check_once_unreachable() -> None:
    attempt = asyncio.run(check_once("http://127.0.0.1:9", KEY, request_timeout=2))
    assert attempt.reason == UNREACHABLE and attempt.retryable


def test_retries_are_bounded_with_backoff() -> None:
    clock = [0.0]
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds

    async def attempt() -> Attempt:
        return Attempt(False, UNREACHABLE, "connection refused")

    policy = VerifyPolicy(timeout_seconds=20, backoff_initial=1, backoff_max=8)
    result = asyncio.run(
        verify_with_retries(attempt, policy, "task app x", clock=lambda: clock[0], sleep=sleep)
    )
    assert result.state == "failed" and "gave up after" in result.message
    assert sleeps == [1, 2, 4, 8]  # next would pass the 20 s bound
    assert clock[0] <= 20


def test_retry_then_success() -> None:
    answers = [Attempt(False, UNREACHABLE, "refused"), Attempt(True, "Verified", "ok", 200, {"id": "m"})]

    async def attempt() -> Attempt:
        return answers.pop(0)

    async def sleep(_: float) -> None:
        return None

    result = asyncio.run(verify_with_retries(attempt, VerifyPolicy(), "t", sleep=sleep))
    assert result.state == "ok" and result.attempts == 2


def test_policy_from_taskapp_spec() -> None:
    spec = Verification.model_validate({"timeoutSeconds": 30, "periodSeconds": 5, "requestTimeoutSeconds": 2})
    policy = VerifyPolicy.from_settings(OperatorSettings(), spec)
    assert (policy.timeout_seconds, policy.period_seconds, policy.request_timeout) == (30, 5, 2)
    assert VerifyPolicy.from_settings(OperatorSettings()).timeout_seconds == 300
    # what a TaskApp leaves unset is the operator's, not the model's default
    fast = OperatorSettings(verify_timeout_seconds=6)
    assert VerifyPolicy.from_settings(fast, Verification(period_seconds=7)).timeout_seconds == 6


def test_summarise_task_info_shapes() -> None:
    assert summarise_task_info({"taskset": {"task": {"id": "a", "name": "A"}, "rubric": {}}}) == {
        "id": "a",
        "name": "A",
        "rubric": False,
    }
    assert summarise_task_info({"id": "b", "rubrics": {"outcome": {}}})["rubric"] is True


class RecordingKube:
    """Records the children made (created, or applied over one the job owns); `existing` holds objects
    already there by name, with their owners' uids."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, str]] = []
        self.existing: dict[str, list[str]] = {}

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applied.append((obj["kind"], obj["metadata"]["name"]))
        return obj

    async def create(self, obj: dict[str, Any]) -> bool:
        if obj["metadata"]["name"] in self.existing:
            return False
        self.applied.append((obj["kind"], obj["metadata"]["name"]))
        return True

    async def owners(self, path: str) -> list[str] | None:
        return self.existing.get(path.rsplit("/", 1)[-1])


class FakeRuntime:
    def __init__(self) -> None:
        self.kube = RecordingKube()
        self.token_key = b"k" * 32
        self.settings = OperatorSettings()


def _rendered() -> render.Rendered:
    job = parse_job(job_object("RLJob", rl_spec(model={"base": "m"})))
    # (the per-job trainer identity: the mode whose children a deleted one must be made again of)
    settings = OperatorSettings(trainer_identity="job")
    return render.render_rljob(job, settings, render.TaskAppTarget("http://t", "s"))


def test_ensure_children_applies_only_missing_or_drifted() -> None:
    rendered = _rendered()
    rt = FakeRuntime()
    state = JobState()
    n = asyncio.run(ensure_children(rt, rendered.children, Observed(), state.applied))  # type: ignore[arg-type]
    assert n == len(rendered.children)
    # Same pass again before the watch caught up: nothing re-applied.
    assert asyncio.run(ensure_children(rt, rendered.children, Observed(), state.applied)) == 0  # type: ignore[arg-type]
    # A restarted operator (empty state) that sees every child: nothing applied, no duplicates.
    full = Observed(
        deployments={"j-rollout": DeploymentObs("j-rollout", "rollout", 1, 1)},
        trainer=TrainerObs(name="j-trainer", active=1),
        others={"Service/j-rollout", "Service/j-trainer", "PodDisruptionBudget/j-rollout",
                "PodDisruptionBudget/j-trainer"}
        | {f"{kind}/j-trainer" for kind in render.IDENTITY_KINDS},
    )
    rt2 = FakeRuntime()
    assert asyncio.run(ensure_children(rt2, rendered.children, full, {})) == 0  # type: ignore[arg-type]
    # Drift (replicas changed behind our back) -> re-applied.
    drift = Observed(
        deployments={"j-rollout": DeploymentObs("j-rollout", "rollout", 3, 3)},
        trainer=full.trainer,
        others=full.others,
    )
    assert asyncio.run(ensure_children(rt2, rendered.children, drift, {})) == 1  # type: ignore[arg-type]
    assert rt2.kube.applied == [("Deployment", "j-rollout")]
    # Someone deleted the trainer's Role and the rollout Service: both are made again.
    repaired = Observed(
        deployments=full.deployments,
        trainer=full.trainer,
        others=full.others - {"Role/j-trainer", "Service/j-rollout"},
    )
    rt3 = FakeRuntime()
    assert asyncio.run(ensure_children(rt3, rendered.children, repaired, {})) == 2  # type: ignore[arg-type]
    assert sorted(rt3.kube.applied) == [("Role", "j-trainer"), ("Service", "j-rollout")]


def test_expected_of_names_every_watched_child() -> None:
    exp = expected_of(_rendered())
    assert exp.trainer == "j-trainer" and exp.deployments == {"j-rollout": 1}
    assert set(exp.others) == {"Service/j-rollout"}  # one trainer pod: no Service; the Secret is POSTed


def test_namespace_terminating_is_told_apart_from_rbac_denials():
    from posttrain.controller.kube import KubeError
    from posttrain.controller.loop import namespace_terminating

    terminating = KubeError(
        403,
        'deployments.apps "x" is forbidden: unable to create new content in namespace t-1 because it is being '
        'terminated","reason":"Forbidden","details":{"causes":[{"reason":"NamespaceTerminating"}]}',
    )
    rbac = KubeError(
        403, 'deployments.apps is forbidden: User "system:serviceaccount:posttrain:op" cannot create'
    )
    assert namespace_terminating(terminating)
    assert not namespace_terminating(rbac)
    assert not namespace_terminating(KubeError(409, "because it is being terminated"))
    assert not namespace_terminating(ValueError("x"))


def test_observe_sees_the_supporting_children_so_they_are_not_applied_again() -> None:
    rendered = _rendered()
    key = ("ns", "rljob", "j")
    indexes = {
        "posttrain_deployments": {key: [DeploymentObs("j-rollout", "rollout", 1, 1)]},
        "posttrain_jobs": {key: [TrainerObs(name="j-trainer", active=1)]},
        "posttrain_services": {key: ["j-rollout", "j-trainer"]},
        "posttrain_pdbs": {key: ["j-rollout", "j-trainer"]},
        "posttrain_serviceaccounts": {key: ["ServiceAccount/j-trainer"]},
        "posttrain_roles": {key: ["Role/j-trainer"]},
        "posttrain_rolebindings": {key: ["RoleBinding/j-trainer"]},
    }
    observed = observe(key, indexes)
    rt = FakeRuntime()
    assert asyncio.run(ensure_children(rt, rendered.children, observed, {})) == 0  # type: ignore[arg-type]
    assert rt.kube.applied == []


def test_an_object_of_someone_elses_under_a_childs_name_is_never_adopted() -> None:
    from posttrain.controller.apply import NotOwned

    rendered = _rendered()
    uid = rendered.children[0]["metadata"]["ownerReferences"][0]["uid"]
    rt = FakeRuntime()
    rt.kube.existing = {"j-rollout": [uid]}  # the job's own (e.g. the watch lost it): applied again
    assert asyncio.run(ensure_children(rt, rendered.children, Observed(), {})) == len(rendered.children)  # type: ignore[arg-type]
    for owners in ([], ["someone-else"]):
        rt = FakeRuntime()
        rt.kube.existing = {"j-rollout": owners}
        with pytest.raises(NotOwned) as err:
            asyncio.run(ensure_children(rt, rendered.children, Observed(), {}))  # type: ignore[arg-type]
        assert "Deployment j-rollout exists and is not this job's" in err.value.message
        assert ("Deployment", "j-rollout") not in rt.kube.applied


def test_observe_sees_only_the_children_the_job_owns() -> None:
    key = ("ns", "rljob", "j")
    mine, other = DeploymentObs("j-rollout", "rollout", owner="uid-1"), DeploymentObs("j-ref", "reference", owner="uid-0")
    indexes = {"posttrain_deployments": {key: [mine, other]}, "posttrain_jobs": {key: [TrainerObs("j-trainer", owner="uid-0")]}}
    observed = observe(key, indexes, "uid-1")
    assert list(observed.deployments) == ["j-rollout"] and observed.trainer is None


def test_the_jobs_secret_is_posted_once_and_again_when_the_job_finds_it_gone() -> None:
    from posttrain.controller.reconcile_job import ensure_job_secret
    from posttrain.controller.status import PodObs

    class SecretKube:
        def __init__(self) -> None:
            self.calls: list[str] = []
            self.present = False

        async def create(self, obj: dict[str, Any]) -> bool:
            self.calls.append("POST")
            assert set(obj["data"]) == {"job.json", "config.toml", "token"}
            assert base64.b64decode(obj["data"]["config.toml"]) == b"[job]\n"  # read from the job, not memory
            created, self.present = not self.present, True
            return created

        async def owners(self, path: str) -> list[str] | None:
            return [uid]

        async def exists(self, path: str) -> bool:
            assert path == "/api/v1/namespaces/ns/secrets/j-config"
            self.calls.append("GET")
            return self.present

        async def get(self, path: str) -> dict[str, Any]:  # the job, for its originalToml (not kept in memory)
            assert path.endswith("/rljobs/j")
            return {"spec": {"originalToml": "[job]\n"}}

    rendered = _rendered()
    uid = rendered.secret["metadata"]["ownerReferences"][0]["uid"]
    job = parse_job(job_object("RLJob", rl_spec(model={"base": "m"})))
    rt = FakeRuntime()
    rt.kube = SecretKube()  # type: ignore[assignment]
    state = JobState()

    def ensure(stuck: bool, pods: list[PodObs] | None = None) -> list[str]:
        before = len(rt.kube.calls)  # type: ignore[attr-defined]
        observed = Observed(pods=pods or [])
        asyncio.run(ensure_job_secret(rt, job.owner, rendered, observed, state, stuck))  # type: ignore[arg-type]
        return rt.kube.calls[before:]  # type: ignore[attr-defined]

    assert ensure(stuck=False) == ["POST"]  # once per loop
    assert ensure(stuck=False) == []  # later passes within secret_check_seconds (20): nothing
    assert ensure(stuck=True) == []  # stuck: not within 5 s either
    state.secret_checked -= 6
    assert ensure(stuck=True) == ["GET"]  # stuck: is it still there? (by name)
    assert ensure(stuck=False) == []
    rt.kube.present = False  # type: ignore[attr-defined]  # someone deleted it
    state.secret_checked -= 21  # a running job looks every secret_check_seconds
    assert ensure(stuck=False) == ["GET", "POST"]
    assert ensure(stuck=False) == []
    # a pod that cannot start for want of a Secret: POSTed at once (a 409 when it is there)
    waiting = PodObs("j-rollout-x", "rollout", "Pending", "rollout: CreateContainerConfigError")
    assert ensure(stuck=False, pods=[waiting]) == ["POST"]


# ------------------------------------------------------------------------------------ tenants' fair shares
def test_a_namespace_that_floods_task_app_checks_waits_alone() -> None:
    from posttrain.controller.fairness import CheckSlots, NoSlot

    async def scenario() -> None:
        slots = CheckSlots(per_namespace=2, per_host=1)
        gate = asyncio.Event()

        async def hanging(url: str) -> None:
            async with slots.slot("hostile", url, wait=3600):
                await gate.wait()

        tasks = [asyncio.create_task(hanging(f"http://app-{i}:8000/")) for i in range(5)]
        for _ in range(5):
            await asyncio.sleep(0)
        assert slots.in_use("hostile") == 5  # 2 checks run, 3 wait for the namespace's slots
        async with slots.slot("victim", "http://app-0:8000", wait=0):  # another namespace: at once
            pass
        with pytest.raises(NoSlot, match="namespace hostile"):
            async with slots.slot("hostile", "http://elsewhere", wait=0):
                pass
        gate.set()
        await asyncio.gather(*tasks)
        assert slots.in_use("hostile") == 0 and not slots._slots  # nothing kept for idle namespaces
        held, release = asyncio.Event(), asyncio.Event()

        async def one_host() -> None:
            async with slots.slot("ns", "http://same:1/a", wait=3600):
                held.set()
                await release.wait()

        first = asyncio.create_task(one_host())
        await held.wait()
        with pytest.raises(NoSlot, match="host same:1"):  # per (namespace, host) too
            async with slots.slot("ns", "http://SAME:1/b", wait=0):
                pass
        release.set()
        await first

    asyncio.run(scenario())


def test_the_rollout_token_is_derived_from_the_job_and_the_operators_key() -> None:
    from posttrain.controller.render.token import derived_token

    job = parse_job(job_object("RLJob", rl_spec(model={"base": "m"})))
    token = derived_token(b"k" * 32, job.owner)
    assert token == derived_token(b"k" * 32, job.owner) and len(token) == 43  # stable: a Secret made again
    other = type(job.owner)(**{**job.owner.__dict__, "uid": "another-uid"})
    assert derived_token(b"k" * 32, other) != token  # a job made again under the same name: another token
    assert derived_token(b"x" * 32, job.owner) != token  # only the operator's key makes it


def test_the_loops_keep_a_jobs_body_without_its_original_toml() -> None:
    from posttrain.controller.apply import without_original_toml

    body = {"metadata": {"name": "j"}, "spec": {"originalToml": "x" * 262144, "suspend": False}}
    kept = without_original_toml(body)
    assert kept["spec"] == {"suspend": False} and body["spec"]["originalToml"]  # the watch's body is not changed
    plain = {"metadata": {}, "spec": {"suspend": True}}
    assert without_original_toml(plain) is plain
