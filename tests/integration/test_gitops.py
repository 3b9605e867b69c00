"""GitOps behaviour on the real control plane (fixture `cluster`):
- every rendered overlay passes a server-side dry-run apply (and the pods it would run pass PodSecurity);
- applying the same CR YAML twice is a no-op (resourceVersion unchanged), server-side and client-side;
- after the real operator, running with the operator ServiceAccount's own token (so the ClusterRole is
  what is tested), has reconciled a TaskApp and an RLJob, `kubectl diff` of the git YAML shows nothing,
  and everything the operator added to them is documented in manifests/README.md."""

from __future__ import annotations

import base64
import copy
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from posttrain.localhost import free_port

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
OVERLAYS = ["overlays/dev", "overlays/prod", "overlays/namespaced"]
GIT_FOLDER = MANIFESTS / "argocd" / "example-jobs"
OPERATOR_SA = "system:serviceaccount:posttrain-system:posttrain-operator"


def kubeconfig_of(cluster) -> str:
    """The kubeconfig path, whatever shape the `cluster` fixture has."""
    for attr in ("kubeconfig", "kubeconfig_path", "config"):
        value = getattr(cluster, attr, None)
        if value is not None and Path(str(value)).is_file():
            return str(value)
    if isinstance(cluster, dict):
        return str(cluster["kubeconfig"])
    if isinstance(cluster, (tuple, list)):
        return str(cluster[0])
    return str(cluster)


def kubectl_bin() -> str:
    local = ROOT / "bin" / "kubectl"
    return str(local) if local.exists() else (shutil.which("kubectl") or "kubectl")


def kubectl(kcfg: str, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60):
    proc = subprocess.run(
        [kubectl_bin(), "--kubeconfig", kcfg, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert proc.returncode == 0, (
            f"kubectl {' '.join(args)}: rc={proc.returncode}\n{proc.stderr}{proc.stdout}"
        )
    return proc


def render(rel: str) -> list[dict]:
    # The repository's kubectl kustomize (the system one has it built in; bin/kubectl too).
    out = subprocess.run(
        [kubectl_bin(), "kustomize", str(MANIFESTS / rel)], capture_output=True, text=True, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def dump(docs: list[dict]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


def get(kcfg: str, kind: str, name: str, namespace: str | None = None) -> dict:
    args = ["get", kind, name, "-o", "yaml"] + (["-n", namespace] if namespace else [])
    return yaml.safe_load(kubectl(kcfg, *args).stdout)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


@pytest.fixture(scope="module")
def platform(cluster) -> str:
    """The cluster with the platform's Namespace, CRDs and trainer policy really applied: a dry-run cannot establish a CRD or
    create a namespace, so objects that need them are dry-run against the real ones."""
    kcfg = kubeconfig_of(cluster)
    # (and the trainer's admission policy, which the operator looks for at start)
    kinds = {"Namespace", "CustomResourceDefinition", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    prereqs = [d for d in render("overlays/dev") if d["kind"] in kinds]
    prereqs += [d for d in render("overlays/namespaced") if d["kind"] == "Namespace" and d not in prereqs]
    kubectl(kcfg, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=dump(prereqs))
    names = [f"crd/{d['metadata']['name']}" for d in prereqs if d["kind"] == "CustomResourceDefinition"]
    kubectl(kcfg, "wait", "--for=condition=Established", "--timeout=60s", *names)
    return kcfg


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_overlay_passes_server_side_dry_run(platform, overlay):
    docs = render(overlay)
    proc = kubectl(
        platform,
        "apply",
        "--server-side",
        "--force-conflicts",
        "--dry-run=server",
        "-f",
        "-",
        stdin=dump(docs),
    )
    applied = [line for line in proc.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(docs), proc.stdout
    # Namespace posttrain-system enforces the restricted Pod Security Standard: nothing may warn.
    assert "PodSecurity" not in proc.stderr, proc.stderr


def git_docs(namespace: str, taskapp_url: str | None = None) -> list[dict]:
    """The example git folder's CRs, moved into `namespace`; the TaskApp pointed at a running task app."""
    docs = []
    for path in sorted(GIT_FOLDER.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            doc["metadata"]["namespace"] = namespace
            if doc["kind"] == "TaskApp" and taskapp_url:
                doc["spec"] = {"url": taskapp_url, "apiKeySecretRef": doc["spec"]["apiKeySecretRef"]}
            docs.append(doc)
    kinds = [d["kind"] for d in docs]
    assert "TaskApp" in kinds and "RLJob" in kinds, kinds
    return docs


def resource_versions(kcfg: str, docs: list[dict]) -> dict[str, str]:
    out = {}
    for d in docs:
        obj = get(
            kcfg, d["kind"].lower() + "s.posttrain.dev", d["metadata"]["name"], d["metadata"]["namespace"]
        )
        out[f"{d['kind']}/{d['metadata']['name']}"] = obj["metadata"]["resourceVersion"]
    return out


def test_applying_the_same_yaml_twice_is_a_noop(platform, namespace):
    ns = namespace if isinstance(namespace, str) else getattr(namespace, "name", str(namespace))
    docs = git_docs(ns)
    text = dump(docs)
    # Server-side apply (Argo CD with ServerSideApply=true, `kubectl apply --server-side`).
    first = kubectl(platform, "apply", "--server-side", "-f", "-", stdin=text)
    before = resource_versions(platform, docs)
    second = kubectl(platform, "apply", "--server-side", "-f", "-", stdin=text)
    assert resource_versions(platform, docs) == before, (first.stdout, second.stdout)
    # Client-side apply (plain `kubectl apply`, Argo CD's default) on a copy of each object.
    csa = copy.deepcopy(docs)
    for d in csa:
        d["metadata"]["name"] += "-csa"
    text = dump(csa)
    kubectl(platform, "apply", "-f", "-", stdin=text)
    before = resource_versions(platform, csa)
    second = kubectl(platform, "apply", "-f", "-", stdin=text)
    assert all(line.endswith("unchanged") for line in second.stdout.splitlines()), second.stdout
    assert resource_versions(platform, csa) == before


def token_kubeconfig(kcfg: str, token: str, out: Path) -> str:
    """A kubeconfig for the same API server that authenticates with `token` only."""
    cfg = yaml.safe_load(Path(kcfg).read_text())
    ctx_name = cfg.get("current-context") or cfg["contexts"][0]["name"]
    ctx = next(c for c in cfg["contexts"] if c["name"] == ctx_name)["context"]
    cluster = copy.deepcopy(next(c for c in cfg["clusters"] if c["name"] == ctx["cluster"])["cluster"])
    ca = cluster.get("certificate-authority")
    if ca and not Path(ca).is_absolute():
        cluster["certificate-authority"] = str((Path(kcfg).parent / ca).resolve())
    new = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "posttrain-operator", "user": {"token": token}}],
        "contexts": [{"name": "op", "context": {"cluster": "c", "user": "posttrain-operator"}}],
        "current-context": "op",
    }
    out.write_text(yaml.safe_dump(new))
    return str(out)


def operator_credentials(kcfg: str, tmp_path: Path) -> tuple[str, bool]:
    """(kubeconfig for the operator, whether it is the posttrain-operator ServiceAccount's own token)."""
    rbac = [
        d
        for d in render("overlays/dev")
        if (d["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
            and d["metadata"]["name"] == "posttrain-operator")
        # its own namespace's Role (the Lease, the rollout tokens' key Secret) and, in default, the API server's
        # EndpointSlice
        or (d["kind"] in {"Role", "RoleBinding"}
            and d["metadata"]["name"] in {"posttrain-operator-self", "posttrain-operator-api-server"})
        # its Secret read, which it binds itself in each opted-in namespace (no binding is applied here)
        or (d["kind"] == "ClusterRole" and d["metadata"]["name"] == "posttrain-operator-secrets")
    ] + [d for d in render("overlays/dev") if d["kind"] == "ClusterKopfPeering"]
    kubectl(kcfg, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=dump(rbac))
    proc = kubectl(
        kcfg, "create", "token", "posttrain-operator", "-n", "posttrain-system", "--duration=1h", check=False
    )
    if proc.returncode != 0:  # no TokenRequest (no signing key): fall back to admin, say so
        print(f"no ServiceAccount token ({proc.stderr.strip()}): running the operator as admin")
        return kcfg, False
    return token_kubeconfig(kcfg, proc.stdout.strip(), tmp_path / "operator.kubeconfig"), True


def rbac_enforced(kcfg: str) -> bool:
    proc = kubectl(kcfg, "auth", "can-i", "delete", "nodes", f"--as={OPERATOR_SA}", check=False)
    return proc.stdout.strip() == "no"


class Operator:
    """`posttrain operator` as a subprocess with the args and env of the rendered Deployment (cluster-wide,
    kopf peering `posttrain`; the liveness endpoint moved to a free loopback port), logs to a file."""

    def __init__(self, kubeconfig: str, log: Path):
        dep = next(d for d in render("overlays/dev") if d["kind"] == "Deployment")
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        self.port = free_port()
        args = [a for a in c.get("args", []) if not a.startswith("--liveness")]
        args.append(f"--liveness=http://127.0.0.1:{self.port}/healthz")
        env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
        env["POSTTRAIN_TASK_APP_ALLOWED_NETWORKS"] = "127.0.0.0/8,::1/128"  # the test's task app runs on 127.0.0.1
        # what the pod reads from its ServiceAccount's namespace file: the Lease and token key live there
        env["POSTTRAIN_LEASE_NAMESPACE"] = env["POSTTRAIN_TOKEN_KEY_NAMESPACE"] = dep["metadata"]["namespace"]
        env["POSTTRAIN_METRICS_PORT"] = "0"  # the Deployment's 9090 is the pod's own; not served here
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "posttrain.cli", "operator", "--kubeconfig", kubeconfig, *args],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **env, "KUBECONFIG": kubeconfig, "PYTHONUNBUFFERED": "1"},
            cwd=ROOT,
            start_new_session=True,
        )

    def healthz(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as rsp:
                return rsp.status
        except OSError:
            return 0

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def documented_annotation(key: str, readme: str) -> bool:
    """Is `key` one of the README's annotation rows (`posttrain.dev/<handler-id>` matches any handler)."""
    if f"`{key}`" in readme:
        return True
    return key.startswith("posttrain.dev/") and "`posttrain.dev/<handler-id>`" in readme


def test_no_diff_after_the_operator_reconciled(platform, namespace, math_taskapp, tmp_path):
    ns = namespace if isinstance(namespace, str) else getattr(namespace, "name", str(namespace))
    kcfg = platform
    # A cluster admin opts the namespace in: the platform's policy posttrain-operator-reach refuses the
    # operator's account every write in a namespace without this label (test_operator_reach.py).
    kubectl(kcfg, "label", "namespace", ns, "posttrain.dev/tenant=enabled")
    op_kcfg, own_token = operator_credentials(kcfg, tmp_path)
    enforced = rbac_enforced(kcfg)
    print(f"operator token: {'ServiceAccount' if own_token else 'admin'}; RBAC enforced: {enforced}")

    # Two copies of the git folder: one applied server-side (Argo CD ServerSideApply=true), one client-side
    # (plain `kubectl apply`, Argo CD's default); each is later diffed the way it was applied.
    sets = {"server-side": git_docs(ns, taskapp_url=math_taskapp.url), "client-side": []}
    for d in copy.deepcopy(sets["server-side"]):
        d["metadata"]["name"] += "-csa"
        if d["kind"] == "RLJob":
            d["spec"]["taskApp"]["name"] += "-csa"
        sets["client-side"].append(d)
    docs = sets["server-side"] + sets["client-side"]
    secret_refs = {d["spec"]["apiKeySecretRef"]["name"] for d in docs if d["kind"] == "TaskApp"}
    key = base64.b64encode(math_taskapp.api_key.encode()).decode()
    secrets = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": ref, "namespace": ns, "labels": {"posttrain.dev/use": "task-app-key"}},
            "data": {"ENVIRONMENT_API_KEY": key},
        }
        for ref in sorted(secret_refs)
    ]
    kubectl(kcfg, "apply", "--server-side", "-f", "-", stdin=dump(secrets))
    files = {mode: tmp_path / f"git-{mode}.yaml" for mode in sets}
    for mode, path in files.items():
        path.write_text(dump(sets[mode]))

    operator = Operator(op_kcfg, tmp_path / "operator.log")
    t0 = time.monotonic()
    try:
        wait_for(lambda: operator.healthz() == 200 or operator.proc.poll() is not None, 60, "/healthz")
        assert operator.healthz() == 200, operator.logs()[-3000:]
        print(f"operator live (/healthz 200) after {time.monotonic() - t0:.1f}s")
        kubectl(kcfg, "apply", "--server-side", "-f", str(files["server-side"]))
        kubectl(kcfg, "apply", "-f", str(files["client-side"]))

        last_waiting: list = []

        def reconciled():
            assert operator.proc.poll() is None, "operator exited:\n" + operator.logs()[-3000:]
            objs, waiting = [], []
            for d in docs:
                obj = get(kcfg, d["kind"].lower() + "s.posttrain.dev", d["metadata"]["name"], ns)
                st = obj.get("status") or {}
                if d["kind"] == "TaskApp":
                    ok = st.get("verified") is True
                else:
                    ok = (
                        st.get("phase") not in (None, "", "Pending", "Verifying")
                        and st.get("observedGeneration") == obj["metadata"]["generation"]
                    )
                objs.append(obj)
                if not ok:
                    waiting.append((d["kind"], d["metadata"]["name"], st.get("phase"), st.get("message")))
            last_waiting[:] = waiting
            return objs if not waiting else None

        try:
            objs = wait_for(reconciled, 90, "the operator to verify the TaskApps and provision the RLJobs")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: still waiting on {last_waiting}") from None
        phases = {o["metadata"]["name"]: (o.get("status") or {}).get("phase") for o in objs}
        print(f"reconciled in {time.monotonic() - t0:.1f}s: {phases}")

        # The git YAML shows no difference, diffed the way it was applied.
        for mode, args in (("server-side", ["--server-side", "--force-conflicts"]), ("client-side", [])):
            proc = kubectl(kcfg, "diff", *args, "-f", str(files[mode]), check=False)
            assert proc.returncode == 0 and not proc.stdout.strip(), (mode, proc.stdout, proc.stderr)
            # And applying it again does not touch the objects.
            before = resource_versions(kcfg, sets[mode])
            extra = ["--server-side"] if mode == "server-side" else []
            again = kubectl(kcfg, "apply", *extra, "-f", str(files[mode]))
            after = resource_versions(kcfg, sets[mode])
            changed = {k for k in before if before[k] != after[k]}
            # A status write of the operator in between also moves resourceVersion: allow only those.
            for k in changed:
                kind, name = k.split("/")
                obj = yaml.safe_load(
                    kubectl(
                        kcfg,
                        "get",
                        kind.lower() + "s.posttrain.dev",
                        name,
                        "-n",
                        ns,
                        "-o",
                        "yaml",
                        "--show-managed-fields",
                    ).stdout
                )
                last = max(f.get("time", "") for f in obj["metadata"]["managedFields"])
                writers = {
                    f["manager"] for f in obj["metadata"]["managedFields"] if f.get("time", "") == last
                }
                assert not writers & {"kubectl", "kubectl-client-side-apply"}, (mode, k, again.stdout)

        # Every annotation and finalizer the operator added is documented; kopf's default prefix is gone.
        readme = (MANIFESTS / "README.md").read_text()
        in_git = {(d["kind"], d["metadata"]["name"]): d for d in docs}
        for obj in objs:
            src = in_git[(obj["kind"], obj["metadata"]["name"])]
            mine = set(src["metadata"].get("annotations") or {})
            added = set(obj["metadata"].get("annotations") or {}) - mine
            added.discard("kubectl.kubernetes.io/last-applied-configuration")
            finalizers = obj["metadata"].get("finalizers") or []
            print(
                obj["kind"],
                obj["metadata"]["name"],
                "added annotations:",
                sorted(added),
                "finalizers:",
                finalizers,
            )
            for a in added:
                assert not a.startswith("kopf.zalando.org"), a
                assert documented_annotation(a, readme), (
                    f"{obj['kind']}: annotation {a} not in manifests/README.md"
                )
            for f in finalizers:
                assert f"`{f}`" in readme, f"{obj['kind']}: finalizer {f} not in manifests/README.md"

        # Argo CD's view of the live objects (the Lua health checks over what the operator really wrote).
        lua51 = pytest.importorskip("lupa.lua51")
        for obj in objs:
            lua = lua51.LuaRuntime(unpack_returned_tuples=True, register_eval=False)
            lua.globals().obj = lua.table_from(obj, recursive=True)
            script = "TaskApp.lua" if obj["kind"] == "TaskApp" else "job.lua"
            hs = dict(lua.execute((MANIFESTS / "argocd" / "health" / script).read_text()))
            print(obj["kind"], obj["metadata"]["name"], "Argo CD health:", hs)
            want = "Healthy" if obj["kind"] == "TaskApp" else "Progressing"
            assert hs["status"] == want, (obj.get("status"), hs)

        # The trainer's identity the operator made: PATCH on job status for the namespace's one trainer
        # ServiceAccount, which the installed admission policy holds to the pod's own job
        # (tests/integration/test_trainer_identity.py shows the refusal with real pod-bound tokens).
        roles = yaml.safe_load(kubectl(kcfg, "get", "roles", "-n", ns, "-o", "yaml").stdout)["items"]
        trainer_rules = [
            rule
            for role in roles
            for rule in role.get("rules", [])
            if any(r.endswith("/status") for r in rule.get("resources", []))
        ]
        assert trainer_rules == [
            {
                "apiGroups": ["posttrain.dev"],
                "resources": ["rljobs/status", "sftjobs/status"],
                "verbs": ["patch"],
            }
        ], trainer_rules
        policy = yaml.safe_load(
            kubectl(kcfg, "get", "validatingadmissionpolicybinding", "posttrain-trainer-own-job", "-o", "yaml").stdout
        )
        assert policy["spec"]["validationActions"] == ["Deny"], policy
        for d in docs:
            if d["kind"] != "RLJob":
                continue
            jobs = yaml.safe_load(kubectl(kcfg, "get", "jobs", "-n", ns, "-o", "yaml").stdout)["items"]
            mine = [j for j in jobs if j["metadata"]["labels"].get("posttrain.dev/job") == d["metadata"]["name"]]
            assert [j["spec"]["template"]["spec"]["serviceAccountName"] for j in mine] == ["posttrain-trainer"]

        # The ClusterRole was enough: no request of the operator was forbidden.
        if own_token and enforced:
            # (a namespace another test is deleting refuses every write with 403 NamespaceTerminating to
            # a cluster-wide operator: that is not an RBAC denial)
            forbidden = [
                line
                for line in operator.logs().splitlines()
                if re.search(r"\b403\b|[Ff]orbidden", line) and "being terminated" not in line
            ]
            assert not forbidden, "\n".join(forbidden[:20])
    finally:
        # Delete while the operator runs, so that it removes its finalizer; then stop it.
        kubectl(
            kcfg,
            "delete",
            "-f",
            str(files["server-side"]),
            "-f",
            str(files["client-side"]),
            "--wait=true",
            "--timeout=60s",
            "--ignore-not-found",
            check=False,
        )
        operator.stop()
        print(operator.logs()[-4000:])
