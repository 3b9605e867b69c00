"""The namespaced install's tenant namespace template (manifests/overlays/namespaced/tenant-namespace.yaml)
bounds what one tenant may hold: a ResourceQuota on stored jobs and TaskApps, pods and GPUs."""

from __future__ import annotations

from test_manifests import needs_kubectl, render


@needs_kubectl
def test_the_tenant_namespace_template_carries_a_quota_on_jobs_pods_and_gpus() -> None:
    docs = render("overlays/namespaced")
    (namespace,) = [d for d in docs if d["kind"] == "Namespace" and d["metadata"]["name"] == "team-a"]
    assert namespace["metadata"]["labels"]["posttrain.dev/tenant"] == "enabled"
    (quota,) = [d for d in docs if d["kind"] == "ResourceQuota"]
    assert quota["metadata"]["namespace"] == "team-a"
    hard = quota["spec"]["hard"]
    for key in ("count/rljobs.posttrain.dev", "count/sftjobs.posttrain.dev", "count/taskapps.posttrain.dev",
                "pods", "requests.nvidia.com/gpu"):  # fmt: skip
        assert int(hard[key]) > 0, key
