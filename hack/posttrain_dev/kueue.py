"""Kueue (sigs.k8s.io/kueue, built by hack/build-kueue.sh) as a process beside the dev control plane:
`make cluster-up KUEUE=1`, or DevCluster(kueue=True) in tests.

What it takes to run Kueue's manager outside a cluster, on 127.0.0.1:
* its CRDs (bin/kueue-crd, copied from the module's config/components/crd/bases), with the conversion
  webhook stanza its kustomize overlay adds (config/components/crd/patches/webhook_in_*.yaml): the
  manager's internal certificate management (open-policy-agent/cert-controller) refuses to report ready
  until it has written its CA into those CRDs and into its two webhook configurations;
* internal certificate management on: with it off, the manager insists on metrics certificates at the
  fixed path /etc/kueue/metrics/certs (cmd/kueue/main.go), outside any work directory;
* its two webhook configurations exist but hold no webhooks. The API server could not call them anyway: the
  generated certificate names kueue-webhook-service.kueue-system.svc, and an Endpoints object may not point
  at a loopback address. So Kueue's admission webhooks (defaulting/validation of Workloads, and the gates
  its pod integration adds to pods) do not run here: posttrain writes complete Workloads itself
  (controller/render/workload.py), one per job, and creates a job's pods only once Kueue admits it. The
  conversion webhooks are not reached either: everything uses v1beta2, the CRDs' storage version.
* leader election off, its visibility API server off (it would bind a port on every interface)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
# The CRDs whose conversion webhook cert-controller fills in (sigs.k8s.io/kueue pkg/util/cert/cert.go).
CONVERTED = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")
WEBHOOK_CONFIGURATIONS = (
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", "kueue-validating-webhook-configuration"),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "kueue-mutating-webhook-configuration"),
)


def crd_manifests(crd_dir: Path) -> list[dict[str, Any]]:
    """Kueue's CRDs, the converted ones with the conversion webhook stanza cert-controller expects."""
    out = []
    for path in sorted(crd_dir.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"service": {"namespace": NAMESPACE, "name": WEBHOOK_SERVICE, "path": "/convert"}},
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


def config(workdir: Path, health_port: int, webhook_port: int) -> dict[str, Any]:
    """The manager's Configuration (config.kueue.x-k8s.io/v1beta2)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(workdir / "kueue-certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": WEBHOOK_SECRET,
        },
        # batch/job only (posttrain's trainer Jobs carry no queue label when it writes the job's Workload,
        # so Kueue leaves them alone); without any, the manager refuses the configuration.
        "integrations": {"frameworks": ["batch/job"]},
        "manageJobsWithoutQueueName": False,
        # Fair sharing between namespaces (one LocalQueue per namespace, ClusterQueues in a Cohort):
        # preemption for fairness only when a queue is above its share (manifests/overlays/kueue).
        "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]},
    }


def args(workdir: Path, kubeconfig: Path, health_port: int, webhook_port: int) -> list[str]:
    path = workdir / "kueue-config.yaml"
    path.write_text(yaml.safe_dump(config(workdir, health_port, webhook_port)))
    return [
        f"--config={path}",
        f"--kubeconfig={kubeconfig}",
        "--feature-gates=VisibilityOnDemand=false",
        "--zap-log-level=info",
    ]


def setup_objects() -> list[tuple[str, dict[str, Any]]]:
    """(API path, object) to create before the manager starts: its namespace, the Secret cert-controller
    fills (it updates it, never creates it: config/components/internalcert) and empty webhook configs."""
    objs: list[tuple[str, dict[str, Any]]] = [
        ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        (f"/api/v1/namespaces/{NAMESPACE}/secrets",
         {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": WEBHOOK_SECRET, "namespace": NAMESPACE}}),
    ]
    for api_version, kind, name in WEBHOOK_CONFIGURATIONS:
        plural = kind.lower() + "s"
        objs.append((f"/apis/{api_version}/{plural}",
                     {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "webhooks": []}))  # fmt: skip
    return objs
