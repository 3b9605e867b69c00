"""Bounds (docs/security.md): every container the operator renders has CPU/memory requests (and the
operator's limits where set), whatever the spec leaves out; a TaskApp's replicas are bounded."""

from __future__ import annotations

from typing import Any

import pytest
from fixtures.jobs import UID
from posttrain.controller import render
from posttrain.controller.objects import parse_task_app
from posttrain.controller.render.pods import default_resources
from posttrain.controller.render.taskapp import render_task_app
from posttrain.controller.scheduling_policy import check_task_app_replicas
from posttrain.controller.settings import OperatorSettings
from posttrain.controller.spec_errors import SpecError
from test_pod_security import TARGET, pods, rljob, sftjob


def containers(children: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, c) for name, pod in pods(children) for c in pod["containers"]]


def test_every_job_container_gets_the_default_requests() -> None:
    settings = OperatorSettings(default_requests={"cpu": "250m", "memory": "1Gi"}, default_limits={"memory": "8Gi"})
    for out in (render.render_rljob(rljob(), settings, TARGET), render.render_sftjob(sftjob(), settings)):
        found = containers(out.children)
        assert found
        for name, container in found:
            res = container["resources"]
            assert res["requests"]["cpu"] == "250m" and res["requests"]["memory"] == "1Gi", name
            assert res["limits"]["memory"] == "8Gi", name


def test_the_specs_own_resources_win_and_a_limit_alone_is_not_given_a_request() -> None:
    spec = {"scheduling": {"resources": {"requests": {"memory": "32Gi"}, "limits": {"cpu": "4"}}}}
    out = render.render_rljob(rljob(**spec), OperatorSettings(default_limits={"memory": "8Gi"}), TARGET)
    for name, container in containers(out.children):
        res = container["resources"]
        assert res["requests"]["memory"] == "32Gi", name
        assert "cpu" not in res["requests"] and res["limits"]["cpu"] == "4", name  # Kubernetes requests 4
        assert "memory" not in res["limits"], name  # below the spec's request it would be refused


def test_default_resources_is_pure() -> None:
    req, lim = {"cpu": "1"}, {}
    assert default_resources(req, lim, {"cpu": "2", "memory": "1Gi"}, {"memory": "2Gi"}) == (
        {"cpu": "1", "memory": "1Gi"}, {"memory": "2Gi"})  # fmt: skip
    assert req == {"cpu": "1"} and lim == {}


def task_app(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "posttrain.dev/v1alpha1", "kind": "TaskApp",
            "metadata": {"name": "math", "namespace": "team-a", "uid": UID},
            "spec": {"image": "reg/math:1", **spec}}  # fmt: skip


def test_task_app_pods_get_their_own_defaults_and_the_specs_resources_win() -> None:
    (dep, _svc) = render_task_app(parse_task_app(task_app()), OperatorSettings())
    res = dep["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res == {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "2Gi"}}
    given = {"resources": {"requests": {"memory": "4Gi"}, "limits": {"memory": "6Gi"}}}
    (dep, _svc) = render_task_app(parse_task_app(task_app(scheduling=given)), OperatorSettings())
    res = dep["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res["requests"]["memory"] == "4Gi" and res["limits"]["memory"] == "6Gi" and res["limits"]["cpu"] == "2"


def test_task_app_replicas_are_bounded_by_the_setting_and_the_crd() -> None:
    check_task_app_replicas(8, OperatorSettings())
    with pytest.raises(SpecError) as err:
        check_task_app_replicas(9, OperatorSettings())
    assert err.value.field == "replicas" and "POSTTRAIN_TASK_APP_MAX_REPLICAS" in str(err.value)
    check_task_app_replicas(20, OperatorSettings(task_app_max_replicas=20))
    with pytest.raises(SpecError):
        parse_task_app(task_app(replicas=65))  # the CRD's (and the model's) own maximum
