"""Scheduling is the platform's, not the tenant's (controller/scheduling_policy.py), on the real control
plane with a real `posttrain operator` process: a job naming a PriorityClass, a keyless toleration or a
nodeSelector the operator's settings do not list fails with reason InvalidSpec naming the setting, and none
of its pods exist; the same asks, once a cluster admin allows them, run."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fixtures.operator_env import operator_env
from fixtures.operator_process import rljob_manifest
from kubernetes import client

pytestmark = [pytest.mark.cluster]


def job(name: str, url: str, scheduling: dict[str, Any]) -> dict[str, Any]:
    return rljob_manifest(name, url, scheduling=scheduling)


def test_disallowed_priority_toleration_and_node_selector_fail_the_job_with_no_pods_and_allowed_ones_run(
    cluster: Any, namespace: str, math_taskapp: Any, tmp_path: Path
) -> None:
    scheduling_api = client.SchedulingV1Api(cluster.api_client())
    top = f"top-{uuid.uuid4().hex[:8]}"  # a cluster's highest class, as an attacker would name it
    team = f"team-{uuid.uuid4().hex[:8]}"
    for name, value in ((top, 1_000_000), (team, 10)):
        scheduling_api.create_priority_class(client.V1PriorityClass(metadata=client.V1ObjectMeta(name=name),
                                                                    value=value))  # fmt: skip
    asks = {
        "prio": ({"priorityClassName": top}, "spec.scheduling.priorityClassName", "POSTTRAIN_ALLOWED_PRIORITY_CLASSES"),
        "tol": ({"tolerations": [{"operator": "Exists"}]}, "spec.scheduling.tolerations[0]",
                "POSTTRAIN_ALLOWED_TOLERATIONS"),
        "sel": ({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}},
                "spec.scheduling.nodeSelector.node-role.kubernetes.io/control-plane",
                "POSTTRAIN_ALLOWED_NODE_SELECTORS"),
    }  # fmt: skip
    settings = {
        "POSTTRAIN_ALLOWED_PRIORITY_CLASSES": team,
        "POSTTRAIN_ALLOWED_TOLERATIONS": "pool",
        "POSTTRAIN_ALLOWED_NODE_SELECTORS": "kubernetes.io/os",
    }
    try:
        with operator_env(cluster, namespace, tmp_path / "operator.log", settings=settings) as env:
            env.secret("task-key", math_taskapp.api_key)
            for name, (scheduling, _, _) in asks.items():
                env.create("rljobs", job(name, math_taskapp.url, scheduling))
            allowed = {"priorityClassName": team, "nodeSelector": {"kubernetes.io/os": "linux"},
                       "tolerations": [{"key": "pool", "operator": "Equal", "value": "train", "effect": "NoSchedule"}]}
            env.create("rljobs", job("fine", math_taskapp.url, allowed))  # fmt: skip
            for name, (_, field, setting) in asks.items():
                status = env.wait_phase("rljobs", name, "Failed", timeout=40)
                assert status["reason"] == "InvalidSpec", status
                assert status["message"].startswith(field), status["message"]
                assert setting in status["message"], status["message"]
            env.wait_phase("rljobs", "fine", "Running", timeout=90)
            for name in asks:
                children = env.children(name)
                assert not children["Pod"] and not children["Job"] and not children["Deployment"], name
            pods = env.children("fine")["Pod"]
            assert pods and all(p.spec.priority_class_name == team and p.spec.priority == 10 for p in pods)
            assert all(p.spec.node_selector == {"kubernetes.io/os": "linux"} for p in pods)
    finally:
        for name in (top, team):
            scheduling_api.delete_priority_class(name)


def test_a_required_queue_fails_a_job_without_one_naming_the_setting(
    cluster: Any, namespace: str, math_taskapp: Any, tmp_path: Path
) -> None:
    with operator_env(cluster, namespace, tmp_path / "operator.log",
                      settings={"POSTTRAIN_REQUIRE_QUEUE": "true"}) as env:  # fmt: skip
        env.secret("task-key", math_taskapp.api_key)
        env.create("rljobs", rljob_manifest("unqueued", math_taskapp.url))
        status = env.wait_phase("rljobs", "unqueued", "Failed", timeout=40)
        assert status["reason"] == "InvalidSpec"
        assert status["message"].startswith("spec.scheduling.queueName") and "POSTTRAIN_REQUIRE_QUEUE" in status["message"]
        assert not env.children("unqueued")["Pod"] and not env.children("unqueued")["Job"]
