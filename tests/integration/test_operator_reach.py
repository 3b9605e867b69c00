"""The operator's own reach, on the real API server (manifests/base/operator-policy.yaml, docs/security.md):
the prod overlay's RBAC and the ValidatingAdmissionPolicy posttrain-operator-reach are applied as rendered,
then requests are made as the operator's ServiceAccount (`kubectl --as`, `--dry-run=server` where a real
object would start pods).

- it may not create a Deployment in kube-system, nor in a namespace that has not opted in;
- in an opted-in namespace (label posttrain.dev/tenant=enabled) every child the operator renders for a
  real RLJob, SFTJob and TaskApp is admitted, in both trainer-identity modes;
- and nothing beyond them: unowned objects, a foreign object taken over, a Job that runs another account, a
  Role that grants more than the trainer's patch, a binding to cluster-admin, a token Secret, a ConfigMap,
  a pod, a job's spec;
- it reads Secrets only where it bound its read (RoleBinding posttrain-operator-secrets, in an opted-in
  namespace, of exactly that ClusterRole to exactly its own account) and, in posttrain-system, only
  posttrain-token-key;
- the real operator, running under that account, says why a job in a namespace that has not opted in
  waits (status reason NamespaceNotEnabled, naming the label), and goes on once the namespace opts in."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.operator_process import (
    OperatorProcess,
    api_client_of,
    ensure_crds,
    kubeconfig_of,
    rljob_manifest,
)
from kubernetes import client, config
from posttrain.api.resources import GROUP, VERSION
from posttrain.controller import render
from posttrain.controller.namespace_objects import render_namespace_objects
from posttrain.controller.objects import parse_job, parse_task_app
from posttrain.controller.render.identity import render_trainer_identity
from posttrain.controller.render.secret_access import SECRETS_ROLE, render_secret_access
from posttrain.controller.render.taskapp import TaskAppTarget, render_task_app
from posttrain.controller.render.token import with_token
from posttrain.controller.settings import OperatorSettings
from posttrain_dev.devcluster import kubectl_path

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = "system:serviceaccount:posttrain-system:posttrain-operator"
POLICY = "posttrain-operator-reach"
TENANT_LABEL = "posttrain.dev/tenant=enabled"
SETTINGS = OperatorSettings(trainer_image="reg/trainer:1", rollout_image="reg/rollout:1")


def kubectl(kcfg: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([kubectl_path(), f"--kubeconfig={kcfg}", *args], input=stdin, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout


def as_operator(kcfg: str, *args: str, stdin: str | None = None, masters: bool = False) -> subprocess.CompletedProcess:
    """A request as the operator's account; `masters`: in group system:masters too, i.e. with every right
    RBAC can give, so that the policy alone is what refuses."""
    groups = ["--as-group=system:masters", "--as-group=system:authenticated"] if masters else []
    return kubectl(kcfg, f"--as={OPERATOR}", *groups, *args, stdin=stdin)


def refused(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The request was refused by the operator's policy, with a message holding `words`."""
    assert proc.returncode != 0, f"admitted: {proc.stdout}"
    assert POLICY in proc.stderr, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr
    return proc.stderr


def apply_as_operator(kcfg: str, obj: dict[str, Any], dry_run: bool = True) -> subprocess.CompletedProcess:
    """Write `obj` as the operator does: server-side apply, but POST for a Secret (it may not patch one)."""
    args = ["apply", "--server-side", "--field-manager=posttrain-operator", "-f", "-"]
    if obj["kind"] == "Secret":
        args = ["create", "-f", "-"]
    return as_operator(kcfg, *args, *(["--dry-run=server"] if dry_run else []), stdin=json.dumps(obj))


def impersonating(kcfg: str) -> client.ApiClient:
    api = config.new_client_from_config(config_file=kcfg)
    api.set_default_header("Impersonate-User", OPERATOR)
    return api


def rendered_prod() -> list[dict[str, Any]]:
    out = ok(subprocess.run([kubectl_path(), "kustomize", str(ROOT / "manifests/overlays/prod")],
                            capture_output=True, text=True))  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def reach(cluster: Any) -> str:
    """The prod overlay's operator account, its ClusterRoles (posttrain-operator, posttrain-operator-secrets)
    and binding, its own namespace's Role and the reach policy, applied as rendered; returns the admin
    kubeconfig once the policy is in force."""
    kcfg = kubeconfig_of(cluster)
    api = api_client_of(cluster)
    ensure_crds(api)
    api.close()
    names = {"posttrain-operator", "posttrain-system", POLICY, SECRETS_ROLE, "posttrain-operator-self"}
    kinds = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
             "ValidatingAdmissionPolicyBinding", "Role", "RoleBinding"}  # fmt: skip
    docs = [d for d in rendered_prod() if d["kind"] in kinds and d["metadata"]["name"] in names]
    assert {d["kind"] for d in docs} == kinds
    # (a field manager of its own: the dev overlay's labels on posttrain-system, applied by other tests of
    # this session, stay)
    ok(kubectl(kcfg, "apply", "--server-side", "--force-conflicts", "--field-manager=test-operator-reach",
               "-f", "-", stdin=yaml.safe_dump_all(docs)))  # fmt: skip
    assert ok(kubectl(kcfg, "auth", "can-i", "create", "deployments", "-n", "kube-system",
                      f"--as={OPERATOR}")).strip() == "yes"  # fmt: skip  (RBAC alone would let it)
    deadline = time.monotonic() + 60
    while True:  # the API server loads a new policy within a few seconds
        proc = as_operator(kcfg, "create", "deployment", "probe", "--image=x", "-n", "kube-system",
                           "--dry-run=server")  # fmt: skip
        if proc.returncode != 0 and POLICY in proc.stderr:
            return kcfg
        assert time.monotonic() < deadline, f"the policy is not in force: {proc.stdout}{proc.stderr}"
        time.sleep(0.5)


@pytest.fixture
def tenant(reach: str, namespace: str) -> str:
    ok(kubectl(reach, "label", "namespace", namespace, TENANT_LABEL))
    return namespace


def make(kcfg: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Create `obj` as the admin (a tenant would) and return it as stored (with its uid)."""
    return json.loads(ok(kubectl(kcfg, "create", "-o", "json", "-f", "-", stdin=json.dumps(obj))))


def test_the_operator_may_not_create_in_kube_system_nor_in_a_namespace_that_did_not_opt_in(
    reach: str, namespace: str
) -> None:
    for ns in ("kube-system", "default", namespace):
        proc = as_operator(reach, "create", "deployment", "x", "--image=busybox", "-n", ns, "--dry-run=server")
        refused(proc, f"namespace {ns} has not opted in", "posttrain.dev/tenant=enabled")
        svc = as_operator(reach, "create", "service", "clusterip", "x", "--tcp=80:80", "-n", ns, "--dry-run=server")
        refused(svc, "has not opted in")
    # Secrets too (its RBAC may create them in every namespace), even ones a job would own.
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x-config", "namespace": namespace,
              "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "RLJob", "name": "x",
                                   "uid": "00000000-0000-0000-0000-000000000001", "controller": True}]}}  # fmt: skip
    refused(apply_as_operator(reach, secret), "has not opted in")
    # In its own namespace: the Secret of its rollout-token key (made once), nothing else of its own.
    key = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "posttrain-token-key", "namespace": "posttrain-system"}}
    made = as_operator(reach, "create", "-f", "-", "--dry-run=server", stdin=json.dumps(key))
    # admitted: created, or found existing by the store after admission (an operator of another test made it)
    assert made.returncode == 0 or "AlreadyExists" in made.stderr, made.stderr
    other = {**key, "metadata": {**key["metadata"], "name": "posttrain-other"}}
    assert as_operator(reach, "create", "-f", "-", "--dry-run=server", stdin=json.dumps(other)).returncode != 0
    assert as_operator(reach, "create", "deployment", "x", "--image=busybox", "-n", "posttrain-system",
                       "--dry-run=server").returncode != 0  # fmt: skip


def test_every_child_the_operator_renders_is_admitted_in_an_opted_in_namespace(reach: str, tenant: str) -> None:
    ns = tenant
    rl = make(reach, {**rljob_manifest("rl", "http://math.tasks.svc:8000"), "metadata": {"name": "rl", "namespace": ns}})
    sft = make(reach, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SFTJob", "metadata": {"name": "sft", "namespace": ns},
                       "spec": {"model": {"base": "x"}, "algorithm": {"type": "offline", "method": "sft", "variety": "fft"},
                                "compute": {"gpuType": "H100", "gpuCount": 1}}})  # fmt: skip
    app = make(reach, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TaskApp", "metadata": {"name": "math", "namespace": ns},
                       "spec": {"image": "math:1", "port": 8000, "apiKeySecretRef": {"name": "k"}}})  # fmt: skip
    target = TaskAppTarget(url="http://math.tasks.svc:8000", secret_name="task-key")
    objects: list[dict[str, Any]] = []
    # The once-per-namespace objects first (the RoleBinding's escalation check needs its Role to exist).
    for mode in ("namespace", "job"):
        settings = SETTINGS.model_copy(update={"trainer_identity": mode})
        objects += render_namespace_objects(ns, settings)
        for obj in (rl, sft):
            job = parse_job(obj)
            rendered = render.render_job(job, settings, target if job.is_rl else None)
            objects += render_trainer_identity(job.owner, settings)
            secret = with_token(rendered.secret, "t" * 43) if rendered.rollout_token else rendered.secret
            objects += [secret, *rendered.children]
    objects += render_task_app(parse_task_app(app), SETTINGS)
    kinds, made = set(), set()
    for obj in objects:
        # Deployments and Jobs only dry-run (no pods); the rest for real, as the operator makes them (once:
        # both identity modes render the same Secret).
        dry = obj["kind"] in ("Deployment", "Job")
        if not dry and (ident := (obj["kind"], obj["metadata"]["name"])) in made:
            continue
        if not dry:
            made.add(ident)
        proc = apply_as_operator(reach, obj, dry_run=dry)
        assert proc.returncode == 0, f"{obj['kind']} {obj['metadata']['name']}: {proc.stderr}"
        kinds.add(obj["kind"])
    assert kinds >= {"Secret", "Service", "Deployment", "Job", "NetworkPolicy", "ServiceAccount", "Role",
                     "RoleBinding"}  # fmt: skip
    # Status, kopf's metadata patch and Events about its own objects; a server of a finished job deleted.
    status = {"status": {"phase": "Pending", "message": "waiting"}}
    custom = client.CustomObjectsApi(impersonating(reach))  # a merge patch of status, no GET first
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "rljobs", "rl", status, dry_run="All")
    ok(as_operator(reach, "patch", "rljob", "rl", "-n", ns, "--type=merge",
                   "-p", '{"metadata":{"annotations":{"posttrain.dev/x":"1"}}}', "--dry-run=server"))  # fmt: skip
    ok(as_operator(reach, "delete", "service", "rl-trainer", "-n", ns, "--dry-run=server", "--ignore-not-found"))
    ok(as_operator(reach, "create", "-f", "-", "--dry-run=server", stdin=json.dumps(event(ns, rl))))


def event(ns: str, about: dict[str, Any]) -> dict[str, Any]:
    meta = about["metadata"]
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{meta['name']}.1", "namespace": ns},
            "involvedObject": {"apiVersion": about["apiVersion"], "kind": about["kind"], "name": meta["name"],
                               "namespace": ns, "uid": meta["uid"]},
            "reason": "Test", "message": "m", "type": "Normal"}  # fmt: skip


def test_in_an_opted_in_namespace_the_operator_makes_nothing_but_its_own_children(reach: str, tenant: str) -> None:
    ns = tenant
    rl = make(reach, {**rljob_manifest("rl", "http://math.tasks.svc:8000"), "metadata": {"name": "rl", "namespace": ns}})
    job = parse_job(rl)
    rendered = render.render_job(job, SETTINGS, TaskAppTarget(url="http://math.tasks.svc:8000", secret_name="k"))
    trainer = next(c for c in rendered.children if c["kind"] == "Job")
    server = next(c for c in rendered.children if c["kind"] == "Deployment")

    # Nothing unowned: `kubectl create deployment` carries no ownerReference.
    refused(as_operator(reach, "create", "deployment", "x", "--image=busybox", "-n", ns, "--dry-run=server"),
            "only objects a posttrain job owns")  # fmt: skip
    # No take-over of an object someone else made under a child's name.
    service = next(c for c in rendered.children if c["kind"] == "Service" and c["metadata"]["name"] == "rl-rollout")
    foreign = json.loads(json.dumps(service))
    del foreign["metadata"]["ownerReferences"]
    ok(kubectl(reach, "create", "-f", "-", stdin=json.dumps(foreign)))
    refused(apply_as_operator(reach, service), "only objects a posttrain job owns")
    # Trainer pods run the trainer identity, servers mount no token, no pod is privileged or on the host.
    other = json.loads(json.dumps(trainer))
    other["spec"]["template"]["spec"]["serviceAccountName"] = "default"
    refused(apply_as_operator(reach, other), "runs the trainer identity")
    tokened = json.loads(json.dumps(server))
    tokened["spec"]["template"]["spec"]["automountServiceAccountToken"] = True
    refused(apply_as_operator(reach, tokened), "mounts no token")
    account = json.loads(json.dumps(server))
    account["spec"]["template"]["spec"]["serviceAccountName"] = "ci-deployer"
    refused(apply_as_operator(reach, account), "runs the default ServiceAccount")
    projected = json.loads(json.dumps(trainer))
    projected["spec"]["template"]["spec"]["volumes"].append(
        {"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}})
    refused(apply_as_operator(reach, projected), "no projected serviceAccountToken")
    host = json.loads(json.dumps(server))
    host["spec"]["template"]["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    refused(apply_as_operator(reach, host), "hostPath")
    # RBAC it may write: only the trainer's patch, only to the trainer's account.
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "posttrain-trainer-status", "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}  # fmt: skip
    # (RBAC's escalation check refuses it first: the operator holds no Secret read here; as system:masters
    # the policy alone refuses it)
    assert apply_as_operator(reach, role).returncode != 0
    refused(as_operator(reach, "apply", "--server-side", "--field-manager=posttrain-operator", "-f", "-",
                        "--dry-run=server", stdin=json.dumps(role), masters=True), "grants only patch")  # fmt: skip
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "posttrain-trainer-status", "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
               "subjects": [{"kind": "ServiceAccount", "name": "posttrain-trainer", "namespace": ns}]}  # fmt: skip
    assert as_operator(reach, "apply", "--server-side", "-f", "-", "--dry-run=server",
                       stdin=json.dumps(binding)).returncode != 0  # fmt: skip  (RBAC's escalation check too)
    # No token Secret of another account, even one a job owns.
    token = json.loads(json.dumps(rendered.secret))
    token["type"] = "kubernetes.io/service-account-token"
    token["metadata"]["annotations"] = {"kubernetes.io/service-account.name": "default"}
    refused(apply_as_operator(reach, token), "no ServiceAccount token Secret")
    # Kinds it never makes, even owned and even were its account cluster-admin; a job's spec.
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {**rendered.secret["metadata"], "name": "x"}}
    refused(as_operator(reach, "create", "-f", "-", "--dry-run=server", stdin=json.dumps(cm), masters=True),
            "does not write core/configmaps")  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**rendered.secret["metadata"], "name": "x"},
           "spec": {"containers": [{"name": "x", "image": "x"}]}}  # fmt: skip
    refused(as_operator(reach, "create", "-f", "-", "--dry-run=server", stdin=json.dumps(pod), masters=True),
            "does not write core/pods")  # fmt: skip
    crb = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": f"x-{ns}"},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
           "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}]}  # fmt: skip
    refused(as_operator(reach, "create", "-f", "-", "--dry-run=server", stdin=json.dumps(crb), masters=True),
            "writes no cluster-scoped clusterrolebindings")  # fmt: skip
    spec = {"spec": {"suspend": True}}
    refused(as_operator(reach, "patch", "rljob", "rl", "-n", ns, "--type=merge", "-p", json.dumps(spec),
                        "--dry-run=server"), "never writes a job's or TaskApp's spec")  # fmt: skip


def can_i(kcfg: str, verb: str, what: str, ns: str) -> bool:
    proc = kubectl(kcfg, "auth", "can-i", verb, what, "-n", ns, f"--as={OPERATOR}")
    assert proc.stdout.strip() in ("yes", "no"), proc.stderr
    return proc.stdout.strip() == "yes"


def test_the_operator_reads_secrets_only_where_it_bound_its_read(reach: str, tenant: str) -> None:
    ns = tenant
    # Its own namespace: posttrain-token-key alone (MinIO's root keys live there); no cluster-wide read.
    assert can_i(reach, "get", "secrets/posttrain-token-key", "posttrain-system")
    for other in ("secrets", "secrets/minio-credentials"):
        assert not can_i(reach, "get", other, "posttrain-system"), other
    for where in ("kube-system", "default", ns):  # (ns: opted in, but its binding is not made yet)
        assert not can_i(reach, "get", "secrets/task-key", where), where
    (binding,) = render_secret_access(ns, SETTINGS)

    def variant(**changes: Any) -> dict[str, Any]:
        other = json.loads(json.dumps(binding))
        for key, value in changes.items():
            if key == "namespace":
                other["metadata"]["namespace"] = value
            elif key == "name":
                other["metadata"]["name"] = value
            else:
                other[key] = value
        return other

    # Refused (each a create: no binding of that name exists yet): not in its own namespace (opted in or
    # not: the dev overlay labels it), nor where no one opted in.
    refused(apply_as_operator(reach, variant(namespace="posttrain-system")))
    refused(apply_as_operator(reach, variant(namespace="default")), "namespace default has not opted in")
    # Not to another subject, nor to one more; not under another name; not another role under its name
    # (with every right RBAC can give, so that the policy alone refuses).
    tenant_sa = {"kind": "ServiceAccount", "name": "default", "namespace": ns}
    refused(apply_as_operator(reach, variant(subjects=[tenant_sa])), "own ServiceAccount")
    refused(apply_as_operator(reach, variant(subjects=[*binding["subjects"], tenant_sa])), "own ServiceAccount")
    group = [{"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"}]
    refused(apply_as_operator(reach, variant(subjects=group)), "own ServiceAccount")
    refused(apply_as_operator(reach, variant(name="tenant-reads-secrets")), "only objects a posttrain job owns")
    admin = variant(roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"})
    refused(as_operator(reach, "apply", "--server-side", "--field-manager=posttrain-operator", "-f", "-",
                        "--dry-run=server", stdin=json.dumps(admin), masters=True), "own ServiceAccount")  # fmt: skip
    # Never cluster-wide: RBAC gives it no ClusterRoleBinding, and the policy none even as system:masters.
    crb = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
           "metadata": {"name": SECRETS_ROLE}, "roleRef": binding["roleRef"], "subjects": binding["subjects"]}  # fmt: skip
    assert as_operator(reach, "create", "-f", "-", "--dry-run=server", stdin=json.dumps(crb)).returncode != 0
    refused(as_operator(reach, "create", "-f", "-", "--dry-run=server", stdin=json.dumps(crb), masters=True),
            "writes no cluster-scoped clusterrolebindings")  # fmt: skip

    # The binding the operator renders is admitted in an opted-in namespace; then, and only there, it reads
    # a Secret by name (never lists one).
    ok(apply_as_operator(reach, binding, dry_run=False))
    deadline = time.monotonic() + 30
    while not can_i(reach, "get", "secrets/task-key", ns):  # the API server's RBAC cache
        assert time.monotonic() < deadline, "the binding did not give the read"
        time.sleep(0.5)
    assert not can_i(reach, "list", "secrets", ns) and not can_i(reach, "watch", "secrets", ns)
    assert not can_i(reach, "get", "secrets/task-key", "default")
    assert not can_i(reach, "get", "secrets/minio-credentials", "posttrain-system")


def operator_kubeconfig(kcfg: str, out: Path) -> str:
    token = ok(kubectl(kcfg, "create", "token", "posttrain-operator", "-n", "posttrain-system", "--duration=1h"))
    cfg = yaml.safe_load(Path(kcfg).read_text())
    out.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "op",
        "clusters": [{"name": "c", "cluster": cfg["clusters"][0]["cluster"]}],
        "users": [{"name": "op", "user": {"token": token.strip()}}],
        "contexts": [{"name": "op", "context": {"cluster": "c", "user": "op"}}],
    }))  # fmt: skip
    return str(out)


SFT = {"model": {"base": "x"}, "algorithm": {"type": "offline", "method": "sft", "variety": "fft"},
       "compute": {"gpuType": "H100", "gpuCount": 1}}  # fmt: skip


@contextlib.contextmanager
def operator_as_its_account(kcfg: str, ns: str, tmp_path: Path, **env: str) -> Iterator[OperatorProcess]:
    """The real operator under its own account, limited to `ns` (kopf then lists and watches namespaces:
    a read-only ClusterRole like the namespaced overlay's, bound for the test)."""
    extra = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": f"reach-{ns}"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"reach-{ns}"},
             "subjects": [{"kind": "ServiceAccount", "name": "posttrain-operator", "namespace": "posttrain-system"}]}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": f"reach-{ns}"},
            "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}]}  # fmt: skip
    ok(kubectl(kcfg, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all([role, extra])))
    try:
        op_kcfg = operator_kubeconfig(kcfg, tmp_path / "operator.kubeconfig")
        env = {"POSTTRAIN_RESYNC_SECONDS": "2", "POSTTRAIN_S3_ENDPOINT": "http://127.0.0.1:9", **env}
        with OperatorProcess(op_kcfg, tmp_path / "operator.log", namespace=ns, env=env) as op:
            yield op
            log = op.log_tail(200_000)
            assert "Traceback" not in log, log[-3000:]
    finally:
        kubectl(kcfg, "delete", "clusterrolebinding,clusterrole", f"reach-{ns}", "--ignore-not-found")


def status_of(kcfg: str, ns: str, kind: str, name: str) -> dict[str, Any]:
    return json.loads(ok(kubectl(kcfg, "get", kind, name, "-n", ns, "-o", "json"))).get("status") or {}


def wait_reason(kcfg: str, ns: str, kind: str, name: str, reason: str, op: OperatorProcess) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while (got := status_of(kcfg, ns, kind, name)).get("reason") != reason:
        assert time.monotonic() < deadline, f"{got}\n{op.log_tail()}"
        time.sleep(0.5)
    return got


def test_the_operator_says_why_a_job_waits_in_a_namespace_that_has_not_opted_in(
    reach: str, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    sft = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SFTJob", "metadata": {"name": "sft", "namespace": ns}, "spec": SFT}
    with operator_as_its_account(reach, ns, tmp_path) as op:
        make(reach, sft)
        got = wait_reason(reach, ns, "sftjob", "sft", "NamespaceNotEnabled", op)
        assert got["phase"] == "Pending"
        assert f"namespace {ns} has not opted in" in got["message"]
        assert "posttrain.dev/tenant=enabled" in got["message"]
        assert not json.loads(ok(kubectl(reach, "get", "jobs,deployments,services,secrets", "-n", ns, "-o", "json")))["items"]
        # A TaskApp deployed from an image says the same in its Verified condition.
        make(reach, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TaskApp", "metadata": {"name": "app", "namespace": ns},
                     "spec": {"image": "math:1", "port": 8000}})  # fmt: skip
        app = wait_reason(reach, ns, "taskapp", "app", "NamespaceNotEnabled", op)
        verified = next(c for c in app["conditions"] if c["type"] == "Verified")
        assert verified["reason"] == "NamespaceNotEnabled" and "posttrain.dev/tenant=enabled" in verified["message"]
        # A cluster admin opts the namespace in: the job goes on (its trainer Job is made).
        ok(kubectl(reach, "label", "namespace", ns, TENANT_LABEL))
        deadline = time.monotonic() + 60
        while status_of(reach, ns, "sftjob", "sft").get("phase") in (None, "Pending"):
            assert time.monotonic() < deadline, f"{status_of(reach, ns, 'sftjob', 'sft')}\n{op.log_tail()}"
            time.sleep(0.5)
        assert status_of(reach, ns, "sftjob", "sft")["phase"] in ("Provisioning", "Running")
        assert ok(kubectl(reach, "get", "job", "sft-trainer", "-n", ns, "-o", "name")).strip()


def test_an_install_whose_settings_the_policy_refuses_says_so_instead_of_retrying_silently(
    reach: str, tenant: str, tmp_path: Path
) -> None:
    """A trainer ServiceAccount the policy does not name (static identity under another name): the job waits
    with reason OperatorReachRefused and the policy's own words."""
    ns = tenant
    sft = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SFTJob", "metadata": {"name": "sft", "namespace": ns}, "spec": SFT}
    env = {"POSTTRAIN_TRAINER_IDENTITY": "static", "POSTTRAIN_TRAINER_SERVICE_ACCOUNT": "ml-runner"}
    with operator_as_its_account(reach, ns, tmp_path, **env) as op:
        make(reach, sft)
        got = wait_reason(reach, ns, "sftjob", "sft", "OperatorReachRefused", op)
        assert got["phase"] == "Pending"
        assert "posttrain-operator-reach" in got["message"] and "runs the trainer identity" in got["message"]
        assert not json.loads(ok(kubectl(reach, "get", "jobs", "-n", ns, "-o", "json")))["items"]
