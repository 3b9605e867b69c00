"""What the operator made, it keeps: on the real control plane with a real `posttrain operator` whose
periodic pass is 5 minutes away, a running job's Secret, its rollout Service, its PodDisruptionBudget and
the namespace's NetworkPolicy, each deleted by someone, are made again within 30 s (the deletion wakes the
job's loop; the Secret, which the operator may not watch, is looked for every POSTTRAIN_SECRET_CHECK_SECONDS)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fixtures.operator_env import operator_env, wait_for
from fixtures.operator_process import rljob_manifest
from kubernetes import client
from kubernetes.client.rest import ApiException

pytestmark = [pytest.mark.cluster]
WITHIN_S = 30.0


def test_deleted_children_of_a_running_job_are_made_again_within_30s(
    cluster: Any, namespace: str, math_taskapp: Any, tmp_path: Path
) -> None:
    settings = {"POSTTRAIN_RESYNC_SECONDS": "300"}  # the periodic pass is not what brings them back
    with operator_env(cluster, namespace, tmp_path / "operator.log", settings=settings) as env:
        env.secret("task-key", math_taskapp.api_key)
        env.create("rljobs", rljob_manifest("kept", math_taskapp.url))
        env.wait_phase("rljobs", "kept", "Running", timeout=90)
        policy = client.PolicyV1Api(env.api)
        net = client.NetworkingV1Api(env.api)
        children = {
            "Secret kept-config": (lambda: env.core.read_namespaced_secret("kept-config", env.ns),
                                   lambda: env.core.delete_namespaced_secret("kept-config", env.ns)),
            "Service kept-rollout": (lambda: env.core.read_namespaced_service("kept-rollout", env.ns),
                                     lambda: env.core.delete_namespaced_service("kept-rollout", env.ns)),
            "PodDisruptionBudget kept-trainer": (
                lambda: policy.read_namespaced_pod_disruption_budget("kept-trainer", env.ns),
                lambda: policy.delete_namespaced_pod_disruption_budget("kept-trainer", env.ns)),
            "NetworkPolicy posttrain-jobs": (
                lambda: net.read_namespaced_network_policy("posttrain-jobs", env.ns),
                lambda: net.delete_namespaced_network_policy("posttrain-jobs", env.ns)),
        }  # fmt: skip
        time.sleep(16)  # past the operator's own apply grace for what it just made (apply.APPLY_GRACE)
        for what, (read, delete) in children.items():
            uid = read().metadata.uid
            delete()
            started = time.monotonic()

            def again(read=read, uid=uid) -> bool:
                try:
                    return read().metadata.uid != uid
                except ApiException as err:
                    if err.status == 404:
                        return False
                    raise

            try:
                wait_for(again, WITHIN_S, f"{what} made again")
            except AssertionError as err:
                raise AssertionError(f"{err}\n{env.operator.log_tail()}") from None
            print(f"{what}: made again after {time.monotonic() - started:.1f}s")
        assert env.phase("rljobs", "kept") == "Running"
