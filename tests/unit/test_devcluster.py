"""Pure parts of the control-plane harness: certificates, kubeconfig, node manifests, arguments."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID
from posttrain_dev import devcluster, kueue
from posttrain_dev.devcluster import (
    DISABLED_CONTROLLERS,
    GPU_RESOURCE,
    KWOK_NODE_ANNOTATION,
    DevCluster,
    kubeconfig_dict,
    write_certificates,
)


def test_certificates_are_signed_by_one_ca_and_admin_is_system_masters(tmp_path: Path):
    write_certificates(tmp_path)
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "apiserver.crt").read_bytes())
    admin = x509.load_pem_x509_certificate((tmp_path / "admin.crt").read_bytes())
    for cert in (server, admin):
        cert.verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert [o.value for o in admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:masters"
    ]
    assert (tmp_path / "sa.key").stat().st_mode & 0o077 == 0


def test_kubeconfig_points_at_the_server_with_client_certs(tmp_path: Path):
    cfg = kubeconfig_dict("https://127.0.0.1:6443", tmp_path)
    assert cfg["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert cfg["users"][0]["user"]["client-certificate"].endswith("admin.crt")
    assert cfg["current-context"] == cfg["contexts"][0]["name"]


def test_nodes_are_kwok_managed_with_the_configured_gpus(tmp_path: Path):
    node = DevCluster(tmp_path, gpus_per_node=4).node_manifest(2)
    assert node["metadata"]["name"] == "kwok-gpu-2"
    assert node["metadata"]["annotations"][KWOK_NODE_ANNOTATION] == "fake"
    assert node["status"]["allocatable"][GPU_RESOURCE] == "4"


def test_controller_manager_runs_gc_and_jobs_but_not_node_lifecycle(tmp_path: Path):
    cluster = DevCluster(tmp_path)
    cluster.ports.update(apiserver=1, etcd=2, scheduler=3)
    flag = next(a for a in cluster._controller_manager_args() if a.startswith("--controllers="))
    enabled = flag.split("=", 1)[1].split(",")
    assert enabled[0] == "*"
    assert "-node-lifecycle-controller" in enabled
    assert "-garbage-collector-controller" not in enabled and "-job-controller" not in enabled
    assert len(DISABLED_CONTROLLERS) == len(enabled) - 1
    assert all("127.0.0.1" in a for a in cluster._apiserver_args() if a.startswith("--bind-address"))


def test_apiserver_enforces_owner_reference_permissions(tmp_path: Path):
    """Clusters that run OwnerReferencesPermissionEnforcement refuse ownerReferences a client may not set
    (blockOwnerDeletion without `update` on the owner's finalizers); the dev control plane runs it too."""
    cluster = DevCluster(tmp_path)
    cluster.ports.update(apiserver=1, etcd=2)
    assert "--enable-admission-plugins=OwnerReferencesPermissionEnforcement" in cluster._apiserver_args()
    bare = DevCluster(tmp_path, admission_plugins=())
    bare.ports.update(apiserver=1, etcd=2)
    assert not [a for a in bare._apiserver_args() if a.startswith("--enable-admission-plugins")]


def test_down_stops_the_control_plane_a_kept_run_left(tmp_path):
    """`make e2e` with --keep leaves its control plane running with no harness to stop it; `devcluster down`
    stopped only the real node, and etcd, kube-apiserver, the controller manager, the scheduler and kwok
    kept running (found after a kept run on the real dev node). The recorded pids are stopped when their
    command line names the workdir, and only then."""
    workdir = tmp_path / "cluster"
    workdir.mkdir()
    # Ignores SIGTERM, like a control-plane process slow to shut down: SIGKILL after the grace period.
    ours = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; echo trapped; while :; do sleep 0.1; done", str(workdir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    other = subprocess.Popen(["sleep", "60"])
    try:
        assert ours.stdout is not None and ours.stdout.readline() == "trapped\n"  # SIGTERM only after the trap
        (workdir / devcluster.PIDS_FILE).write_text(json.dumps({"etcd": ours.pid, "kwok": other.pid}))
        assert devcluster.stop_recorded_processes(workdir, grace=1.0) == ["etcd"]
        assert ours.wait(timeout=10) == -9
        assert other.poll() is None
        assert not (workdir / devcluster.PIDS_FILE).exists()
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()


def test_kwok_gpu_nodes_carry_the_gpu_product_label(tmp_path: Path):
    """compute.gpuType H100 (the default in examples and tests) chooses these nodes (render/gpu.py)."""
    node = DevCluster(tmp_path).node_manifest(0)
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    other = DevCluster(tmp_path).node_manifest(1, "NVIDIA-L40S")
    assert other["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L40S"


def test_kueue_runs_on_loopback_with_its_crds_ready_for_cert_injection(tmp_path: Path):
    crd_dir = tmp_path / "crd"
    crd_dir.mkdir()
    for plural in ("workloads", "resourceflavors"):
        (crd_dir / f"kueue.x-k8s.io_{plural}.yaml").write_text(yaml.safe_dump(
            {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
             "metadata": {"name": f"{plural}.kueue.x-k8s.io"}, "spec": {"names": {"plural": plural}}}))  # fmt: skip
    crds = {c["spec"]["names"]["plural"]: c for c in kueue.crd_manifests(crd_dir)}
    # cert-controller injects its CA into these CRDs' conversion webhooks: without the stanza it never
    # reports ready.
    assert crds["workloads"]["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["name"] == (
        kueue.WEBHOOK_SERVICE
    )
    assert "conversion" not in crds["resourceflavors"]["spec"]
    cfg = kueue.config(tmp_path, 8081, 9443)
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:8081"
    assert cfg["webhook"]["host"] == "127.0.0.1" and cfg["metrics"]["bindAddress"] == "0"
    assert cfg["internalCertManagement"]["enable"] is True and cfg["leaderElection"]["leaderElect"] is False
    assert cfg["fairSharing"]["preemptionStrategies"]
    args = kueue.args(tmp_path, tmp_path / "kubeconfig", 8081, 9443)
    assert "--feature-gates=VisibilityOnDemand=false" in args
    assert yaml.safe_load((tmp_path / "kueue-config.yaml").read_text()) == cfg
