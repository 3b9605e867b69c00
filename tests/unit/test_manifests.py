"""The kustomize manifests render (kubectl's built-in kustomize), carry the generated CRDs, and grant exactly
the RBAC that manifests/README.md documents, no more."""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
OVERLAYS = ["overlays/dev", "overlays/prod", "overlays/dev-node", "overlays/monitoring"]
NAMESPACED = "overlays/namespaced"  # the multi-tenant install: a Role per served namespace
KUSTOMIZATIONS = [*OVERLAYS, NAMESPACED, "argocd"]
# Cluster-scoped rows of the operator's README table: a namespaced install has no cluster-wide grant of
# these but the read-only CRD list (kopf) and, for kopf's peering and the trainer policy's read, none at
# all (its operator runs the per-job trainer identity).
CLUSTER_SCOPED = {
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("kopf.dev", "clusterkopfpeerings"),
    ("admissionregistration.k8s.io", "validatingadmissionpolicies"),
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"),
    ("kueue.x-k8s.io", "workloadpriorityclasses"),
    ("scheduling.k8s.io", "priorityclasses"),
}

needs_kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (with kustomize) not installed"
)


@cache
def render(rel: str) -> tuple[dict, ...]:
    proc = subprocess.run(["kubectl", "kustomize", str(MANIFESTS / rel)], capture_output=True, text=True)
    assert proc.returncode == 0, f"kubectl kustomize manifests/{rel} failed:\n{proc.stderr}"
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def find(docs, kind: str, name: str) -> dict:
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} found"
    return hits[0]


def documented_rules(table: str) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs from the README table between <!-- rbac:NAME --> markers."""
    text = (MANIFESTS / "README.md").read_text()
    m = re.search(rf"<!-- rbac:{table} -->(.*?)<!-- /rbac:{table} -->", text, re.S)
    assert m, f"manifests/README.md has no <!-- rbac:{table} --> table"
    rules: dict[tuple[str, str], set[str]] = {}
    for line in m.group(1).splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or cells[0] in {"API group", ""} or set(cells[0]) <= {"-", ":"}:
            continue
        group = "" if cells[0] == "core" else cells[0]
        for resource in cells[1].replace("`", "").split(","):
            verbs = {v.strip() for v in cells[2].replace("`", "").split(",")}
            assert cells[3], f"{table}: no reason given for {resource}"
            rules.setdefault((group, resource.strip()), set()).update(verbs)
    return rules


# Rules narrowed to the objects they name (RBAC's resourceNames; the README's table lists their verbs).
NAMED = {
    ("admissionregistration.k8s.io", "validatingadmissionpolicies"): ["posttrain-trainer-own-job"],
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"): ["posttrain-trainer-own-job"],
    ("kopf.dev", "clusterkopfpeerings"): ["posttrain"],
    ("rbac.authorization.k8s.io", "clusterroles"): ["posttrain-operator-secrets"],
}
# The cluster-wide operator's `bind` of its per-namespace Secret read (ClusterRole posttrain-operator-secrets,
# bound by the operator itself in each opted-in namespace); the namespaced install's Role grants that read
# and no `bind`.
BINDS_ITS_SECRET_READ = ("rbac.authorization.k8s.io", "clusterroles")
SECRETS_ROLE = "posttrain-operator-secrets"


def granted_rules(role: dict) -> dict[tuple[str, str], set[str]]:
    rules: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        if "resourceNames" in rule:
            assert all(NAMED.get((g, r)) == rule["resourceNames"] for g in rule["apiGroups"] for r in rule["resources"]), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                rules.setdefault((group, resource), set()).update(rule["verbs"])
    return rules


@needs_kubectl
@pytest.mark.parametrize("rel", KUSTOMIZATIONS)
def test_every_kustomization_renders(rel):
    docs = render(rel)
    assert docs
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name"), doc


def test_base_crds_are_the_generated_crds():
    proc = subprocess.run(
        [sys.executable, str(MANIFESTS / "sync_crds.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


@needs_kubectl
@pytest.mark.parametrize("rel", [*OVERLAYS, NAMESPACED])
def test_overlays_carry_every_crd(rel):
    names = {d["metadata"]["name"] for d in render(rel) if d["kind"] == "CustomResourceDefinition"}
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= names
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd and crd.get("kind") == "CustomResourceDefinition":
                assert crd["metadata"]["name"] in names, f"{rel} lacks {crd['metadata']['name']}"


@needs_kubectl
@pytest.mark.parametrize("rel", OVERLAYS)
def test_operator_rbac_is_exactly_what_the_readme_documents(rel):
    docs = render(rel)
    operator = granted_rules(find(docs, "ClusterRole", "posttrain-operator"))
    assert operator == documented_rules("posttrain-operator")
    trainer = granted_rules(find(docs, "ClusterRole", "posttrain-trainer"))
    assert trainer == documented_rules("posttrain-trainer")
    assert granted_rules(find(docs, "ClusterRole", SECRETS_ROLE)) == documented_rules(SECRETS_ROLE)


@needs_kubectl
def test_rbac_is_least_privilege():
    docs = render("overlays/prod")
    operator = granted_rules(find(docs, "ClusterRole", "posttrain-operator"))
    for (group, resource), verbs in operator.items():
        assert "*" not in verbs and "*" not in resource and group != "*", (group, resource)
        assert not verbs & {"update", "deletecollection", "escalate", "impersonate"}, (resource, verbs)
        assert "bind" not in verbs or (group, resource) == BINDS_ITS_SECRET_READ, (resource, verbs)
    # No Secret read cluster-wide: create only (the job's <job>-config); `bind` only of its Secret read, by name.
    assert operator[("", "secrets")] == {"create"}
    assert operator[BINDS_ITS_SECRET_READ] == {"bind"}
    (bind,) = [r for r in find(docs, "ClusterRole", "posttrain-operator")["rules"] if "bind" in r["verbs"]]
    assert bind == {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                    "resourceNames": [SECRETS_ROLE], "verbs": ["bind"]}  # fmt: skip
    # That read is `get` on Secrets, nothing else (no list/watch: by name only), and the install binds it
    # nowhere: the operator does, per opted-in namespace (never cluster-wide, never in posttrain-system).
    assert granted_rules(find(docs, "ClusterRole", SECRETS_ROLE)) == {("", "secrets"): {"get"}}
    assert not [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
                and d["roleRef"]["name"] == SECRETS_ROLE]  # fmt: skip
    # In its own namespace it reads posttrain-token-key alone.
    self_rules = find(docs, "Role", "posttrain-operator-self")["rules"]
    reads = [r for r in self_rules if "secrets" in r["resources"] and set(r["verbs"]) & {"get", "list", "watch"}]
    assert reads == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["posttrain-token-key"],
                      "verbs": ["get"]}]  # fmt: skip
    assert operator.get(("", "pods"), set()) <= {"list", "watch"}  # read-only: Jobs/Deployments make pods
    trainer = granted_rules(find(docs, "ClusterRole", "posttrain-trainer"))
    assert trainer == {
        ("posttrain.dev", "rljobs/status"): {"patch"},
        ("posttrain.dev", "sftjobs/status"): {"patch"},
    }
    # The trainer's ClusterRole is bound namespace-wide only (RoleBinding), never cluster-wide.
    for doc in docs:
        if doc["kind"] == "ClusterRoleBinding":
            assert doc["roleRef"]["name"] != "posttrain-trainer"
    binding = find(docs, "ClusterRoleBinding", "posttrain-operator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "posttrain-operator", "namespace": "posttrain-system"}
    ]


@needs_kubectl
def test_namespaced_install_has_no_cluster_wide_secret_read():
    docs = render(NAMESPACED)
    assert not [
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] in ("posttrain-operator", SECRETS_ROLE)
    ]
    cluster = granted_rules(find(docs, "ClusterRole", "posttrain-operator-cluster"))
    assert cluster == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("", "namespaces"): {"list", "watch"},
        ("kueue.x-k8s.io", "workloadpriorityclasses"): {"get"},
        ("scheduling.k8s.io", "priorityclasses"): {"get"},
    }
    bound = {
        d["roleRef"]["name"]
        for d in docs
        if d["kind"] == "ClusterRoleBinding"
        and {"kind": "ServiceAccount", "name": "posttrain-operator", "namespace": "posttrain-system"}
        in d["subjects"]
    }
    assert bound == {"posttrain-operator-cluster"}
    # The Role of each served namespace is exactly the README table's namespaced rows, with the Secret read
    # the cluster-wide operator binds itself per namespace instead of its `bind`.
    role = find(docs, "Role", "posttrain-operator")
    namespaced = {
        k: v for k, v in documented_rules("posttrain-operator").items()
        if k not in CLUSTER_SCOPED and k != BINDS_ITS_SECRET_READ
    }  # fmt: skip
    for k, v in documented_rules(SECRETS_ROLE).items():
        namespaced[k] = namespaced.get(k, set()) | v
    assert granted_rules(role) == namespaced
    binding = find(docs, "RoleBinding", "posttrain-operator")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"] == "team-a"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "posttrain-operator", "namespace": "posttrain-system"}
    ]
    (c,) = find(docs, "Deployment", "posttrain-operator")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["POSTTRAIN_NAMESPACE"].split(",") == ["team-a"]
    assert env["POSTTRAIN_SECRETS_BINDING"] == "false"  # the Role grants the read: the operator binds none
    assert not [a for a in c["args"] if a.startswith("--peering")]
    ns = find(docs, "Namespace", "team-a")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@needs_kubectl
@pytest.mark.parametrize("rel", OVERLAYS)
def test_operator_deployment(rel):
    docs = render(rel)
    dep = find(docs, "Deployment", "posttrain-operator")
    spec = dep["spec"]
    # Exactly one replica acts: one replica, never two during a rollout, kopf peering on.
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "posttrain-operator"
    (c,) = pod["containers"]
    args = c.get("args", [])
    peering = [a.split("=", 1)[1] for a in args if a.startswith("--peering=")]
    assert peering, "the operator runs without kopf peering"
    find(docs, "ClusterKopfPeering", peering[0])
    liveness = [a.split("=", 1)[1] for a in args if a.startswith("--liveness=")]
    assert liveness, "the operator runs without kopf's liveness endpoint"
    m = re.fullmatch(r"http://0\.0\.0\.0:(\d+)(/\S*)", liveness[0])
    assert m
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["healthz"] == int(m.group(1)) and "metrics" in ports
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"] == {"path": m.group(2), "port": "healthz"}, probe
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert not any("KEY" in k and "SECRET_NAME" not in k for k in env), "a secret value in the operator env"
    svc = find(docs, "Service", "posttrain-operator-metrics")
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"


@needs_kubectl
def test_images_are_pinned_in_prod():
    for doc in render("overlays/prod"):
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            assert ":" in c["image"].rsplit("/", 1)[-1] and not c["image"].endswith((":latest", ":dev")), c[
                "image"
            ]
            for e in c.get("env", []):
                if e["name"].endswith("_IMAGE"):
                    assert not e["value"].endswith((":latest", ":dev")), e


@needs_kubectl
def test_no_secret_values_outside_the_dev_overlay():
    assert not [d for d in render("overlays/prod") if d["kind"] == "Secret"], "prod must not carry a Secret"
    dev_secrets = {d["metadata"]["name"] for d in render("overlays/dev") if d["kind"] == "Secret"}
    assert dev_secrets == {"minio-credentials", "posttrain-s3", "minio-tenant-keys"}
    base = yaml.safe_load_all((MANIFESTS / "base" / "minio-credentials.template.yaml").read_text())
    for doc in base:
        assert all(v.startswith("<") for v in doc["stringData"].values()), "the template holds a real value"
    text = (MANIFESTS / "base" / "kustomization.yaml").read_text()
    assert "minio-credentials.template.yaml" not in text


@needs_kubectl
def test_minio():
    docs = render("overlays/prod")
    sts = find(docs, "StatefulSet", "minio")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    assert c["envFrom"] == [{"secretRef": {"name": "minio-credentials"}}]
    assert not c["image"].endswith(":latest")
    svc = find(docs, "Service", "minio")
    dep = find(docs, "Deployment", "posttrain-operator")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    port = svc["spec"]["ports"][0]["port"]
    assert env["POSTTRAIN_S3_ENDPOINT"] == f"http://minio.posttrain-system.svc:{port}"


@needs_kubectl
def test_argocd_applications():
    docs = render("argocd")
    platform = find(docs, "Application", "posttrain-platform")
    assert (MANIFESTS.parent / platform["spec"]["source"]["path"]).is_dir()
    assert "ServerSideApply=true" in platform["spec"]["syncPolicy"]["syncOptions"]
    jobs = find(docs, "Application", "posttrain-jobs")
    folder = MANIFESTS.parent / jobs["spec"]["source"]["path"]
    waves = {}
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                annotations = doc["metadata"].get("annotations") or {}
                waves[doc["kind"]] = int(annotations.get("argocd.argoproj.io/sync-wave", 0))
    # TaskApps go first; converted jobs need no annotation (wave 0).
    assert waves["TaskApp"] < waves["RLJob"] == 0, waves
    assert jobs["spec"]["syncPolicy"]["automated"]["prune"] is True
    # Server-side diff would call a refused in-place edit Synced (stale diff cache): kept off.
    assert jobs["metadata"]["annotations"]["argocd.argoproj.io/compare-options"] == "ServerSideDiff=false"
    # Retries of a refused sync move on to the newest commit (the fix), instead of holding the Application.
    assert jobs["spec"]["syncPolicy"]["retry"]["refresh"] is True
    assert "RespectIgnoreDifferences=true" in jobs["spec"]["syncPolicy"]["syncOptions"]
    ignored = {(d["kind"], p) for d in jobs["spec"]["ignoreDifferences"] for p in d.get("jsonPointers", [])}
    assert ("RLJob", "/spec/suspend") in ignored
    # Its project admits the one repository and namespace, and posttrain kinds only.
    project = find(docs, "AppProject", jobs["spec"]["project"])
    assert project["spec"]["sourceRepos"] == [jobs["spec"]["source"]["repoURL"]]
    assert [d["namespace"] for d in project["spec"]["destinations"]] == [
        jobs["spec"]["destination"]["namespace"]
    ]
    kinds = {(r["group"], r["kind"]) for r in project["spec"]["namespaceResourceWhitelist"]}
    assert kinds == {("posttrain.dev", k) for k in ("TaskApp", "RLJob", "SFTJob")}


@needs_kubectl
@pytest.mark.parametrize("rel", OVERLAYS)
def test_operator_args_and_env_are_what_posttrain_operator_accepts(rel):
    cli = pytest.importorskip("posttrain.cli")
    if "operator" not in cli.SUBCOMMANDS:
        pytest.skip("`posttrain operator` has not landed")
    from posttrain.controller.settings import OperatorSettings

    (c,) = find(render(rel), "Deployment", "posttrain-operator")["spec"]["template"]["spec"]["containers"]
    args = cli.build_parser().parse_args(["operator", *c.get("args", [])])
    assert args.peering and args.liveness and not args.namespace
    fields = set(OperatorSettings.model_fields)
    for e in c["env"]:
        if e["name"].startswith("POSTTRAIN_"):
            assert e["name"].removeprefix("POSTTRAIN_").lower() in fields, f"{e['name']} is not a setting"
    env = {e["name"]: e.get("value") for e in c["env"]}
    OperatorSettings(
        **{k.removeprefix("POSTTRAIN_").lower(): v for k, v in env.items() if k.startswith("POSTTRAIN_")}
    )


def test_readme_documents_every_operator_annotation_and_finalizer():
    settings = ROOT / "operator" / "posttrain" / "controller" / "settings.py"
    if not settings.exists():
        pytest.skip("the controller has not landed")
    text = (MANIFESTS / "README.md").read_text()
    source = settings.read_text()
    finalizer = re.search(r'^FINALIZER\s*=\s*"([^"]+)"', source, re.M)
    if finalizer:
        assert f"`{finalizer.group(1)}`" in text
    prefix = re.search(r'^ANNOTATION_PREFIX\s*=\s*"([^"]+)"', source, re.M)
    if prefix:
        assert f"`{prefix.group(1)}/" in text


@needs_kubectl
def test_dev_node_overlay_runs_everything_from_local_images_on_a_cluster_without_storage():
    """The dev-node overlay (make e2e) on the real dev node: no registry (images built here, never pulled),
    no volume provisioner (MinIO on an emptyDir; a PVC would stay Pending), models from S3, and a jobs
    namespace with the Secrets its jobs reference."""
    docs = render("overlays/dev-node")
    sts = find(docs, "StatefulSet", "minio")
    assert "volumeClaimTemplates" not in sts["spec"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "localhost/posttrain/minio:dev"
    dep = find(docs, "Deployment", "posttrain-operator")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "posttrain/operator:dev" and c["imagePullPolicy"] == "IfNotPresent"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["POSTTRAIN_BASE_MODEL_URI"] == "s3://posttrain/models/{base}/"
    assert env["POSTTRAIN_IMAGE_PULL_POLICY"] == "IfNotPresent"
    task_app = find(docs, "TaskApp", "math")
    namespace = task_app["metadata"]["namespace"]
    secrets = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs if d["kind"] == "Secret"}
    assert (namespace, task_app["spec"]["apiKeySecretRef"]["name"]) in secrets
    assert (namespace, env["POSTTRAIN_S3_SECRET_NAME"]) in secrets
    find(docs, "Namespace", namespace)


# ------------------------------------------------------------------------------ the operator's reach
OPERATOR_ACCOUNT = "system:serviceaccount:posttrain-system:posttrain-operator"
TENANT_LABEL = ("posttrain.dev/tenant", "enabled")


@needs_kubectl
@pytest.mark.parametrize("rel", [*OVERLAYS, NAMESPACED])
def test_every_install_confines_the_operator_with_the_reach_policy(rel):
    """base/operator-policy.yaml is in every install, denies, fails closed, and matches exactly the account
    the operator's Deployment runs as (tests/integration/test_operator_reach.py proves what it refuses)."""
    docs = render(rel)
    policy = find(docs, "ValidatingAdmissionPolicy", "posttrain-operator-reach")
    binding = find(docs, "ValidatingAdmissionPolicyBinding", "posttrain-operator-reach")
    assert binding["spec"] == {"policyName": "posttrain-operator-reach", "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["*/*"] and rule["apiGroups"] == ["*"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE", "CONNECT"}
    (cond,) = spec["matchConditions"]
    deployment = find(docs, "Deployment", "posttrain-operator")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert cond["expression"].strip() == (
        f"request.userInfo.username == 'system:serviceaccount:{deployment['metadata']['namespace']}:{account}'"
    )
    assert f"'{OPERATOR_ACCOUNT}'" in cond["expression"]
    # The message tells a cluster admin what to set; the operator reads it (controller/tenancy.py).
    assert any("has not opted in to posttrain" in v.get("messageExpression", "") for v in spec["validations"])
    assert all(v.get("reason") == "Forbidden" for v in spec["validations"])


@needs_kubectl
def test_namespaces_that_run_jobs_opt_in_and_prod_keeps_the_operators_own_out():
    def labels(rel: str, name: str) -> dict:
        return find(render(rel), "Namespace", name)["metadata"].get("labels") or {}

    key, value = TENANT_LABEL
    assert labels("overlays/dev", "posttrain-system").get(key) == value  # dev jobs run there
    assert labels("overlays/dev-node", "posttrain-jobs").get(key) == value
    assert labels(NAMESPACED, "team-a").get(key) == value
    assert key not in labels("overlays/prod", "posttrain-system")
    assert key not in labels(NAMESPACED, "posttrain-system")
    # Dev jobs in posttrain-system need the operator's Secret read there: the dev overlay binds it (the
    # operator may not, base/operator-policy.yaml); no other install binds it in any namespace.
    dev = [d for d in render("overlays/dev") if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == SECRETS_ROLE]
    assert [(d["metadata"]["namespace"], d["roleRef"]["kind"]) for d in dev] == [("posttrain-system", "ClusterRole")]
    for rel in ("overlays/prod", NAMESPACED):
        assert not [d for d in render(rel) if d.get("roleRef", {}).get("name") == SECRETS_ROLE]


METADATA = [ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")]


def reaches(peer: dict, address) -> bool:
    block = peer.get("ipBlock")
    if block is None:
        return False  # a pod or namespace selector selects pods, never the metadata service
    net = ipaddress.ip_network(block["cidr"])
    if address.version != net.version or address not in net:
        return False
    return not any(address in ipaddress.ip_network(e) for e in block.get("except") or [])


@needs_kubectl
@pytest.mark.parametrize("rel", ["overlays/prod", NAMESPACED])
def test_prod_limits_the_operators_egress_and_never_to_the_metadata_address(rel):
    docs = render(rel)
    policy = find(docs, "NetworkPolicy", "posttrain-operator-egress")
    deployment = find(docs, "Deployment", "posttrain-operator")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert "Egress" in spec["policyTypes"]
    allowed: dict[int, list[dict]] = {}
    for rule in spec["egress"]:
        # a rule without `to` (or without ports) would admit every address (or every port)
        assert rule.get("to"), rule
        assert rule.get("ports"), rule
        for port in rule["ports"]:
            allowed.setdefault(int(port["port"]), []).extend(rule["to"])
        for peer in rule["to"]:
            for address in METADATA:
                assert not reaches(peer, address), (address, peer)
    # DNS (to kube-dns only), the API server, task apps over http and https.
    assert all("ipBlock" not in p for p in allowed[53])
    assert {443, 6443, 80} <= allowed.keys()
    assert any(reaches(p, ipaddress.ip_address("10.0.0.1")) for p in allowed[443])  # e.g. the API server
    assert set(allowed) <= {53, 80, 443, 6443, 8000, 8080}


@needs_kubectl
def test_the_operators_cluster_wide_reads_and_writes_by_name_are_narrowed_to_that_name():
    """The trainer policy is read by name and kopf patches only its own peering object: resourceNames."""
    role = find(render("overlays/prod"), "ClusterRole", "posttrain-operator")
    named: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                if (group, resource) in NAMED:
                    key = "named" if rule.get("resourceNames") == NAMED[(group, resource)] else "any"
                    named.setdefault((group, resource), set()).update(f"{key}:{v}" for v in rule["verbs"])
    assert named == {
        ("admissionregistration.k8s.io", "validatingadmissionpolicies"): {"named:get"},
        ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"): {"named:get"},
        ("kopf.dev", "clusterkopfpeerings"): {"any:list", "any:watch", "named:patch"},
        BINDS_ITS_SECRET_READ: {"named:bind"},
    }


@needs_kubectl
@pytest.mark.parametrize("rel", ["overlays/dev", "overlays/dev-node"])
def test_dev_jobs_get_their_namespaces_minio_user_never_the_root_pair(rel):
    """Storage per tenant (docs/storage.md): every posttrain-s3 holds a MinIO user named after its
    namespace, which the minio-tenants Job makes (with the root pair, which only it and MinIO see)."""
    import base64

    docs = render(rel)

    def data(doc):
        return {k: base64.b64decode(v).decode() for k, v in (doc.get("data") or {}).items()}

    root = data(find(docs, "Secret", "minio-credentials"))
    tenant_keys = data(find(docs, "Secret", "minio-tenant-keys"))
    s3_secrets = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "posttrain-s3"]
    assert s3_secrets
    for secret in s3_secrets:
        keys, namespace = data(secret), secret["metadata"]["namespace"]
        assert keys["S3_ACCESS_KEY_ID"] == namespace != root["MINIO_ROOT_USER"]
        assert keys["S3_SECRET_ACCESS_KEY"] != root["MINIO_ROOT_PASSWORD"]
        assert tenant_keys[namespace] == keys["S3_SECRET_ACCESS_KEY"]
    job = find(docs, "Job", "minio-tenants")
    spec = job["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["image"].startswith("posttrain/operator") and "posttrain.minio_tenants" in c["command"]
    assert {v["secret"]["secretName"] for v in spec["volumes"]} == {"minio-tenant-keys"}
    env_refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "valueFrom" in e}
    assert env_refs == {"minio-credentials"}
    # nothing else refers to the root pair but MinIO itself and this Job
    users = [d["metadata"]["name"] for d in docs if "minio-credentials" in str(d.get("spec", ""))]
    assert sorted(users) == ["minio", "minio-tenants"]
