"""The operator against faults, on the real control plane (kube-apiserver with PodSecurity and
OwnerReferencesPermissionEnforcement admission, controller-manager, scheduler, kwok nodes), run as a real
`posttrain operator` subprocess; task apps are real HTTP servers on 127.0.0.1, some hostile on purpose
(tests/fixtures/hostile_taskapp.py). Each test asserts what a user wants to see: a truthful status that
names the problem, a job that survives what it should survive, and an operator that stays up."""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.operator_env import KEY, Env, operator_env, wait_for
from fixtures.operator_process import (
    api_client_of,
    complete_trainer,
    ensure_crds,
    kubeconfig_of,
    rljob_manifest,
)
from kubernetes import client
from kubernetes.client.rest import ApiException
from posttrain.api.resources import GROUP, VERSION
from posttrain.localhost import free_port
from posttrain_dev.devcluster import KWOK_EXIT_ANNOTATION, kubectl_path

pytestmark = [pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
rljob = rljob_manifest


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return {c["type"]: c for c in status.get("conditions") or []}.get(ctype) or {}


def event_messages(env: Env, name: str) -> list[str]:
    items = env.core.list_namespaced_event(env.ns, field_selector=f"involvedObject.name={name}").items
    return [f"{e.reason}: {e.message}" for e in items]


def trainer_pods(env: Env, job: str) -> list[Any]:
    return env.core.list_namespaced_pod(
        env.ns, label_selector=f"batch.kubernetes.io/job-name={job}-trainer"
    ).items


def running_trainer_pod(env: Env, job: str, not_uid: str | None = None) -> Any:
    pods = [
        p
        for p in trainer_pods(env, job)
        if p.status.phase == "Running" and not p.metadata.deletion_timestamp and p.metadata.uid != not_uid
    ]
    return pods[0] if pods else None


def end_trainer_pod(env: Env, job: str, code: int) -> str:
    """Make the running trainer pod exit with `code` (kwok's stage reads the annotation)."""
    pod = wait_for(lambda: running_trainer_pod(env, job), 30, f"{job} trainer pod Running")
    env.core.patch_namespaced_pod(
        pod.metadata.name, env.ns, {"metadata": {"annotations": {KWOK_EXIT_ANNOTATION: str(code)}}}
    )
    return pod.metadata.uid


def operator_rss_mib(env: Env) -> float:
    for line in Path(f"/proc/{env.operator.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# ------------------------------------------------------------------------------------ untrusted input
def test_a_long_task_app_url_gets_a_bounded_truthful_status(env: Env, hostile_taskapp: Any) -> None:
    env.secret("task-key", KEY)
    url = hostile_taskapp.at("ok", "p" * 1900)  # spec.taskApp.url allows 2048 characters
    env.create(
        "taskapps",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TaskApp",
            "metadata": {"name": "long"},
            "spec": {"url": url, "apiKeySecretRef": {"name": "task-key"}},
        },
    )
    status = wait_for(lambda: (s := env.status("taskapps", "long")).get("verified") and s, 30, "verified")
    assert status["url"] == url  # whole: jobs that name the TaskApp use it
    assert status["observedGeneration"] == 1 and status["reason"] == "Verified"
    env.create(
        "rljobs",
        {**rljob("by-long-name", url), "spec": {**rljob("x", url)["spec"], "taskApp": {"name": "long"}}},
    )
    nowhere = f"http://127.0.0.1:{free_port()}/" + "q" * 1900
    env.create("rljobs", rljob("long-nowhere", nowhere))
    running = env.wait_phase("rljobs", "by-long-name", "Running", timeout=60)
    assert len(running["message"]) <= 1024
    assert cond(running, "Ready")["status"] == "True" and cond(running, "Ready")["observedGeneration"] == 1
    failed = env.wait_phase("rljobs", "long-nowhere", "Failed", timeout=40)
    assert failed["reason"] == "TaskAppVerificationFailed"
    assert len(failed["message"]) <= 1024 and "gave up after" in failed["message"]  # the reason survives
    assert failed["message"].startswith("task app http://127.0.0.1:")


@pytest.fixture
def any_selector_env(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[Env]:
    """The operator allowing every nodeSelector (scheduling_policy.py), so the API server's own refusal shows."""
    with operator_env(cluster, namespace, tmp_path / "operator.log",
                      settings={"POSTTRAIN_ALLOWED_NODE_SELECTORS": "*"}) as handle:  # fmt: skip
        yield handle


def test_specs_that_cannot_be_acted_on_fail_naming_the_field(any_selector_env: Env, math_taskapp: Any) -> None:
    env = any_selector_env
    env.secret("task-key", math_taskapp.api_key)
    # Refused up front: a synth backend id names weights posttrain cannot reach.
    with pytest.raises(ApiException) as refused:
        env.create(
            "rljobs", rljob("synth-id", math_taskapp.url, model={"source": "ft:Qwen/Qwen3-4B:job_abc123"})
        )
    assert refused.value.status == 422 and "spec.model.source" in refused.value.body
    # Accepted by the CRD (a section's extras are free-form) but cannot be rendered.
    compute = {"gpuType": "H100", "gpuCount": 2, "extras": {"nodes": "two"},
               "topology": {"gpusForVllm": 1, "gpusForTraining": 1, "tensorParallel": 1}}  # fmt: skip
    env.create("rljobs", rljob("bad-nodes", math_taskapp.url, compute=compute))
    # Refused up front too: a resource quantity that is not one.
    with pytest.raises(ApiException) as refused:
        env.create(
            "rljobs", rljob("lots", math_taskapp.url, scheduling={"resources": {"requests": {"cpu": "lots"}}})
        )
    assert refused.value.status == 422 and "spec.scheduling.resources.requests.cpu" in refused.value.body
    # Rendered, but a child carries a value the API server refuses (422 on the Deployment).
    env.create("rljobs", rljob("bad-label", math_taskapp.url, scheduling={"nodeSelector": {"bad key!": "x"}}))
    status = env.wait_phase("rljobs", "bad-nodes", "Failed", timeout=40)
    assert status["reason"] == "InvalidSpec"
    assert status["message"].startswith('spec.compute.nodes: "two" is a string, not an integer'), status["message"]
    assert "Value error" not in status["message"] and "(fix: write an integer" in status["message"]
    assert cond(status, "Failed")["reason"] == "InvalidSpec" and status["observedGeneration"] == 1
    kids = env.children("bad-nodes")
    assert not kids["Deployment"] and not kids["Job"] and not kids["Pod"]
    status = env.wait_phase("rljobs", "bad-label", "Failed", timeout=40)
    assert status["reason"] == "InvalidSpec"
    assert "the API server refused Deployment bad-label-rollout" in status["message"]
    assert "spec.template.spec.nodeSelector" in status["message"], status["message"]
    assert not env.children("bad-label")["Job"]  # nothing after the refused child is made
    assert "Failed" in env.events("bad-label")


def test_hostile_task_apps_fail_their_own_jobs_and_nothing_else(
    env: Env, hostile_taskapp: Any, math_taskapp: Any
) -> None:
    env.secret("task-key", KEY)
    env.secret("math-key", math_taskapp.api_key)
    for mode in ("huge", "trickle", "echo"):
        env.create("rljobs", rljob(mode, hostile_taskapp.at(mode)))
    env.create("rljobs", rljob("fine", math_taskapp.url, "math-key"))
    env.wait_phase("rljobs", "fine", "Running", timeout=60)  # a good job is not held up by bad ones
    outcomes = {
        "huge": ("BadResponse", "GET /health -> HTTP 200, response larger than 1024 KiB"),
        "trickle": ("Unreachable", "GET /health did not finish within 2 s"),
        "echo": ("Unauthorized", "GET /health -> HTTP 400 (the task app rejected the API key)"),
    }
    for mode, (reason, text) in outcomes.items():
        status = env.wait_phase("rljobs", mode, "Failed", timeout=40)
        verified = cond(status, "TaskAppVerified")
        assert status["reason"] == "TaskAppVerificationFailed" and verified["reason"] == reason, status
        assert text in status["message"], status["message"]
        for where in (json.dumps(status), *event_messages(env, mode)):
            assert KEY not in where and KEY[4:16] not in where, where
        assert not env.children(mode)["Pod"]
    assert env.operator.proc.poll() is None
    rss = operator_rss_mib(env)
    print(
        f"operator RSS after the hostile task apps: {rss:.0f} MiB; huge sent {hostile_taskapp.sent['huge']} B"
    )
    assert rss < 400, rss  # the endless body was never buffered


# ------------------------------------------------------------------------------------ lost pods
@pytest.fixture
def no_budgets_env(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[Env]:
    """The operator without PodDisruptionBudgets: the API's eviction is what a kubelet's node-pressure eviction
    does to the pod (a DisruptionTarget), and the budgets (render/disruption.py) refuse the API's eviction of a
    running trainer, which a kubelet's eviction does not ask."""
    with operator_env(cluster, namespace, tmp_path / "operator.log",
                      settings={"POSTTRAIN_DISRUPTION_BUDGETS": "false"}) as handle:  # fmt: skip
        yield handle


def test_an_evicted_trainer_pod_is_replaced_and_the_job_keeps_running(no_budgets_env: Env, math_taskapp: Any) -> None:
    env = no_budgets_env
    env.secret("task-key", math_taskapp.api_key)
    env.create("rljobs", rljob("evicted", math_taskapp.url))
    env.create("rljobs", rljob("misconfigured", math_taskapp.url))
    env.create("rljobs", rljob("crashed", math_taskapp.url))
    for name in ("evicted", "misconfigured", "crashed"):
        env.wait_phase("rljobs", name, "Running", timeout=60)
    old = running_trainer_pod(env, "evicted")
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=old.metadata.name, namespace=env.ns))
    env.core.create_namespaced_pod_eviction(old.metadata.name, env.ns, eviction)
    end_trainer_pod(env, "misconfigured", 78)  # EX_CONFIG: the job file is wrong, retrying cannot help
    crashed_uid = end_trainer_pod(env, "crashed", 1)  # worth retrying

    phases: list[str] = []

    def replaced() -> Any:
        phases.append(env.phase("rljobs", "evicted") or "")
        return running_trainer_pod(env, "evicted", not_uid=old.metadata.uid)

    new = wait_for(replaced, 60, "a replacement trainer pod")
    assert "Failed" not in phases
    job = env.batch.read_namespaced_job("evicted-trainer", env.ns)
    assert not job.status.failed, job.status  # the disruption did not count against the backoff limit
    assert not [c for c in job.status.conditions or [] if c.type in ("Failed", "FailureTarget")]
    assert new.metadata.uid != old.metadata.uid
    env.wait_phase("rljobs", "evicted", "Running", timeout=30)

    status = env.wait_phase("rljobs", "misconfigured", "Failed", timeout=40)
    assert status["reason"] == "TrainerFailed" and "PodFailurePolicy" in status["message"], status["message"]

    wait_for(lambda: running_trainer_pod(env, "crashed", not_uid=crashed_uid), 60, "a retried trainer pod")
    assert env.batch.read_namespaced_job("crashed-trainer", env.ns).status.failed == 1
    assert env.phase("rljobs", "crashed") != "Failed"


# ------------------------------------------------------------------------------------ locked down
def test_a_restricted_namespace_runs_a_job(env: Env, math_taskapp: Any) -> None:
    env.core.patch_namespace(
        env.ns,
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted",
                                 "pod-security.kubernetes.io/enforce-version": "latest"}}},
    )  # fmt: skip
    env.secret("task-key", math_taskapp.api_key)
    env.create(
        "taskapps",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TaskApp",
            "metadata": {"name": "deployed"},
            "spec": {"image": "posttrain/taskapp-math:dev", "apiKeySecretRef": {"name": "task-key"}},
        },
    )
    env.create("rljobs", rljob("locked", math_taskapp.url))
    env.wait_phase("rljobs", "locked", "Running", timeout=60)
    pods = wait_for(
        lambda: [p for p in env.children("deployed")["Pod"] if p.status.phase == "Running"],
        30,
        "task-app pod",
    )
    pods += [p for p in env.children("locked")["Pod"] if p.status.phase == "Running"]
    assert {p.metadata.labels["posttrain.dev/role"] for p in pods} == {"task-app", "rollout", "trainer"}
    for pod in pods:  # admitted by PodSecurity (restricted), and locked down as rendered
        assert pod.spec.security_context.run_as_non_root is True
        tokens = pod.spec.automount_service_account_token
        assert tokens is (pod.metadata.labels["posttrain.dev/role"] == "trainer")
    # The namespace's NetworkPolicies (jobs' ingress, the egress fence, the TaskApps' ingress), owned by none
    policies = sorted(
        client.NetworkingV1Api(env.api)
        .list_namespaced_network_policy(env.ns, label_selector="app.kubernetes.io/managed-by=posttrain-operator")
        .items, key=lambda p: p.metadata.name != "posttrain-jobs",
    )  # fmt: skip
    assert sorted(p.metadata.name for p in policies) == ["posttrain-egress", "posttrain-jobs", "posttrain-task-apps"]
    assert not any(p.metadata.owner_references for p in policies)
    token = env.core.read_namespaced_secret("locked-config", env.ns)
    assert token.metadata.owner_references[0].name == "locked" and token.data["token"]
    # Someone deletes the trainer's Role and the NetworkPolicy (both the namespace's): the operator makes
    # them again.
    rbac = client.RbacAuthorizationV1Api(env.api)
    networking = client.NetworkingV1Api(env.api)
    role = "posttrain-trainer-status"
    old = (rbac.read_namespaced_role(role, env.ns).metadata.uid, policies[0].metadata.uid)
    rbac.delete_namespaced_role(role, env.ns)
    networking.delete_namespaced_network_policy("posttrain-jobs", env.ns)

    def remade() -> bool:
        try:
            new = (
                rbac.read_namespaced_role(role, env.ns).metadata.uid,
                networking.read_namespaced_network_policy("posttrain-jobs", env.ns).metadata.uid,
            )
        except ApiException:
            return False
        return new[0] != old[0] and new[1] != old[1]

    wait_for(remade, 30, "the Role and the NetworkPolicy made again")


def test_pods_that_cannot_be_created_show_in_the_status(env: Env, math_taskapp: Any) -> None:
    env.core.create_namespaced_resource_quota(
        env.ns,
        client.V1ResourceQuota(
            metadata=client.V1ObjectMeta(name="no-gpus"),
            spec=client.V1ResourceQuotaSpec(hard={"requests.nvidia.com/gpu": "0"}),
        ),
    )
    env.secret("task-key", math_taskapp.api_key)
    env.create("rljobs", rljob("no-room", math_taskapp.url))

    def told() -> dict[str, Any] | None:
        status = env.status("rljobs", "no-room")
        return status if "rollout FailedCreate" in (status.get("message") or "") else None

    status = wait_for(told, 60, "ReplicaFailure in status.message")
    assert status["phase"] == "Provisioning" and status["reason"] == "PodsNotReady"
    assert "forbidden" in status["message"] and "no-gpus" in status["message"], status["message"]


# ------------------------------------------------------------------------------------ restarts
def test_the_operator_killed_in_every_phase_picks_every_job_up(
    cluster: Any, namespace: str, tmp_path: Path, math_taskapp: Any, hostile_taskapp: Any
) -> None:
    settings = {"POSTTRAIN_VERIFY_TIMEOUT_SECONDS": "120"}  # the gated job must outlive the restart
    with operator_env(cluster, namespace, tmp_path / "operator.log", settings=settings) as env:
        env.secret("task-key", math_taskapp.api_key)
        compute_too_big = {"gpuType": "H100", "gpuCount": 17, "nodes": 1,
                           "topology": {"gpusForVllm": 1, "gpusForTraining": 16}}  # fmt: skip
        bad = {"gpuType": "H100", "gpuCount": 2, "extras": {"nodes": "two"},
               "topology": {"gpusForVllm": 1, "gpusForTraining": 1}}  # fmt: skip
        env.create("rljobs", rljob("verifying", hostile_taskapp.at("gate")))
        env.create("rljobs", rljob("provisioning", math_taskapp.url, compute=compute_too_big))
        for name in ("running", "succeeding", "failing"):
            env.create("rljobs", rljob(name, math_taskapp.url))
        env.create("rljobs", rljob("invalid", math_taskapp.url, compute=bad))
        env.wait_phase("rljobs", "verifying", "Verifying", timeout=30)
        wait_for(
            lambda: "Unschedulable" in (env.status("rljobs", "provisioning").get("message") or ""),
            60,
            "provisioning job says why",
        )
        for name in ("running", "succeeding", "failing"):
            env.wait_phase("rljobs", name, "Running", timeout=60)
        env.wait_phase("rljobs", "invalid", "Failed", timeout=30)

        def uids(job: str) -> set[tuple[str, str, str]]:
            return {
                (k, o.metadata.name, o.metadata.uid)
                for k, v in env.children(job).items()
                if k != "Pod"
                for o in v
            }

        before = {name: uids(name) for name in ("provisioning", "running")}
        env.operator.kill()
        # While it is down: one trainer finishes (with its result), one exits with a config error, and the
        # gated task app comes up.
        uid = env.get("rljobs", "succeeding")["metadata"]["uid"]
        result = {
            "fineTunedModel": f"rl:posttrain/tiny-random-qwen2:{env.ns}.succeeding.{uid.replace('-', '')[:8]}"
        }
        env.co.patch_namespaced_custom_object_status(
            GROUP, VERSION, env.ns, "rljobs", "succeeding", {"status": {"result": result}}
        )
        complete_trainer(env.api, env.ns, "succeeding-trainer", succeed=True)
        end_trainer_pod(env, "failing", 78)
        hostile_taskapp.open_gate()
        env.operator.start()

        env.wait_phase("rljobs", "verifying", "Running", timeout=60)
        status = env.wait_phase("rljobs", "succeeding", "Succeeded", timeout=60)
        assert status["fineTunedModel"] == result["fineTunedModel"]
        status = env.wait_phase("rljobs", "failing", "Failed", timeout=60)
        assert status["reason"] == "TrainerFailed"
        for name in ("succeeding", "failing"):  # their GPUs are freed
            wait_for(lambda n=name: not env.children(n)["Deployment"], 30, f"{name} servers removed")
        assert env.phase("rljobs", "running") == "Running"
        assert (
            env.phase("rljobs", "invalid") == "Failed"
            and env.status("rljobs", "invalid")["reason"] == "InvalidSpec"
        )
        status = env.status("rljobs", "provisioning")
        assert status["phase"] == "Provisioning" and "Unschedulable" in status["message"]
        for name, children in before.items():
            assert children <= uids(name), name  # nothing made twice


# ------------------------------------------------------------------------------------ RBAC
def token_kubeconfig(kubeconfig: str, token: str, out: Path) -> str:
    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    cluster = copy.deepcopy(cfg["clusters"][0]["cluster"])
    out.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "op", "user": {"token": token}}],
                "contexts": [{"name": "op", "context": {"cluster": "c", "user": "op"}}],
                "current-context": "op",
            }
        )
    )
    return str(out)


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [kubectl_path(), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_namespaced_install_runs_a_job_with_a_role_only(
    cluster: Any, namespace: str, tmp_path: Path, math_taskapp: Any
) -> None:
    """The overlay's Role (moved to this test's namespace, bound to a ServiceAccount of its own) and its
    read-only ClusterRole are all the operator holds; the API server enforces ownerReference permissions.
    A job reaches Running and no request is refused."""
    kcfg = kubeconfig_of(cluster)
    docs = [
        d
        for d in yaml.safe_load_all(kubectl(kcfg, "kustomize", str(ROOT / "manifests/overlays/namespaced")))
        if d
    ]
    sa = f"op-{namespace}"
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "posttrain-operator")
    binding = next(
        d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "posttrain-operator"
    )
    cluster_role = next(
        d
        for d in docs
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "posttrain-operator-cluster"
    )
    role["metadata"]["namespace"] = binding["metadata"]["namespace"] = namespace
    binding["subjects"] = subject
    cluster_role["metadata"]["name"] = f"{sa}-cluster"
    cluster_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{sa}-cluster"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{sa}-cluster"},
        "subjects": subject,
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": namespace}}
    objects = [account, role, binding, cluster_role, cluster_binding]
    kubectl(kcfg, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(objects))
    try:
        who = f"--as=system:serviceaccount:{namespace}:{sa}"
        can = subprocess.run([kubectl_path(), f"--kubeconfig={kcfg}", "auth", "can-i", "get", "secrets",
                              "-n", "default", who], capture_output=True, text=True).stdout.strip()  # fmt: skip
        assert can == "no"
        token = kubectl(kcfg, "create", "token", sa, "-n", namespace, "--duration=1h").strip()
        op_kcfg = token_kubeconfig(kcfg, token, tmp_path / "operator.kubeconfig")
        # the overlay's own settings: its Role grants the Secret read, the operator binds none
        deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "posttrain-operator")
        (c,) = deployment["spec"]["template"]["spec"]["containers"]
        overlay = {e["name"]: e["value"] for e in c["env"] if e["name"] == "POSTTRAIN_SECRETS_BINDING"}
        assert overlay == {"POSTTRAIN_SECRETS_BINDING": "false"}
        with operator_env(cluster, namespace, tmp_path / "operator.log", kubeconfig=op_kcfg,
                          settings=overlay) as env:  # fmt: skip
            env.secret("task-key", math_taskapp.api_key)
            env.create("rljobs", rljob("tenant", math_taskapp.url))
            env.wait_phase("rljobs", "tenant", "Running", timeout=60)
            kinds = {k for k, v in env.children("tenant").items() if v}
            assert kinds == {"Deployment", "Job", "Service", "Secret", "Pod"}
            log = env.operator.log_tail(200_000)
            assert " 403" not in log and "Forbidden" not in log, log[-3000:]
    finally:
        kubectl(kcfg, "delete", "clusterrolebinding,clusterrole", f"{sa}-cluster", "--ignore-not-found")


# ------------------------------------------------------------------------------------ status 422
def test_a_status_the_api_server_refuses_ends_the_job_invalid(cluster: Any, namespace: str) -> None:
    """The last line of defence: if a derived status is still refused with 422, the job says so (Failed,
    InvalidSpec, the refused field) instead of retrying for ever with no phase."""
    import kopf
    import kopf._core.engines.posting as posting
    from posttrain.controller.kube import Kube
    from posttrain.controller.objects import owner_of
    from posttrain.controller.reconcile_job import JobState, patch_status
    from posttrain.controller.runtime import Runtime
    from posttrain.controller.settings import OperatorSettings

    api = api_client_of(cluster)
    ensure_crds(api)
    co = client.CustomObjectsApi(api)
    body = rljob("refused", "http://127.0.0.1:9")
    body["metadata"]["namespace"] = namespace
    job = co.create_namespaced_custom_object(GROUP, VERSION, namespace, "rljobs", body)

    async def run() -> list[Any]:
        posting.settings_var.set(kopf.OperatorSettings())  # what a running operator has in context
        posting.event_queue_loop_var.set(asyncio.get_running_loop())
        queue: asyncio.Queue = asyncio.Queue()
        posting.event_queue_var.set(queue)
        kube = Kube.from_env(kubeconfig_of(cluster))
        try:
            rt = Runtime(settings=OperatorSettings(), kube=kube)
            desired = {
                "phase": "Running",
                "reason": "Running",
                "message": "fine",
                "conditions": [{"type": "Running", "status": "Maybe", "reason": "x", "message": "y"}],
            }
            await patch_status(rt, owner_of(job), {}, desired, JobState())
        finally:
            await kube.close()
        return [queue.get_nowait() for _ in range(queue.qsize())]

    events = asyncio.run(run())
    status = co.get_namespaced_custom_object(GROUP, VERSION, namespace, "rljobs", "refused")["status"]
    assert status["phase"] == "Failed" and status["reason"] == "InvalidSpec"
    assert "status.conditions[0].status" in status["message"], status["message"]
    assert [e.reason for e in events] == ["Failed"]
