"""What a tenant's spec.scheduling may ask for (controller/scheduling_policy.py): nothing beyond the
operator's settings, and a refusal names the field and the setting to change."""

from __future__ import annotations

import pytest
from posttrain.api.resources import JobScheduling, Scheduling
from posttrain.controller.scheduling_policy import check_scheduling
from posttrain.controller.settings import OperatorSettings
from posttrain.controller.spec_errors import SpecError


def sched(**fields: object) -> JobScheduling:
    return JobScheduling.model_validate(fields)


@pytest.mark.parametrize(
    ("fields", "field", "setting"),
    [
        ({"priorityClassName": "system-cluster-critical"}, "scheduling.priorityClassName",
         "POSTTRAIN_ALLOWED_PRIORITY_CLASSES"),
        ({"workloadPriorityClassName": "top"}, "scheduling.workloadPriorityClassName",
         "POSTTRAIN_ALLOWED_WORKLOAD_PRIORITY_CLASSES"),
        ({"tolerations": [{"operator": "Exists"}]}, "scheduling.tolerations[0]", "POSTTRAIN_ALLOWED_TOLERATIONS"),
        ({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}},
         "scheduling.nodeSelector.node-role.kubernetes.io/control-plane", "POSTTRAIN_ALLOWED_NODE_SELECTORS"),
    ],
)  # fmt: skip
def test_the_default_settings_refuse_each_scheduling_ask_naming_field_and_setting(
    fields: dict, field: str, setting: str
) -> None:
    with pytest.raises(SpecError) as err:
        check_scheduling(sched(**fields), OperatorSettings())
    assert err.value.field == field
    assert setting in str(err.value), str(err.value)


def test_allowed_entries_pass_and_others_still_fail() -> None:
    settings = OperatorSettings(
        allowed_priority_classes="team-normal",
        allowed_workload_priority_classes="posttrain-low,posttrain-high",
        allowed_tolerations="nvidia.com/gpu,pool=train",
        allowed_node_selectors="pool",
    )
    ok = sched(priorityClassName="team-normal", workloadPriorityClassName="posttrain-high",
               tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                            {"key": "pool", "operator": "Equal", "value": "train"}],
               nodeSelector={"pool": "anything"})  # fmt: skip
    check_scheduling(ok, settings)
    refused = [
        sched(priorityClassName="system-node-critical"),
        sched(tolerations=[{"operator": "Exists"}]),  # keyless: every taint
        sched(tolerations=[{"key": "pool", "operator": "Exists"}]),  # only pool=train is allowed
        sched(tolerations=[{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]),
        sched(nodeSelector={"kubernetes.io/hostname": "cp-0"}),
    ]
    for spec in refused:
        with pytest.raises(SpecError):
            check_scheduling(spec, settings)


def test_star_allows_anything_including_a_keyless_toleration() -> None:
    settings = OperatorSettings(allowed_priority_classes="*", allowed_tolerations="*", allowed_node_selectors="*")
    check_scheduling(sched(priorityClassName="x", tolerations=[{"operator": "Exists"}], nodeSelector={"a": "b"}),
                     settings)  # fmt: skip


def test_a_required_queue_refuses_a_job_without_one_but_not_a_task_app() -> None:
    settings = OperatorSettings(require_queue=True)
    for spec in (None, sched(nodeSelector=None)):
        with pytest.raises(SpecError) as err:
            check_scheduling(spec, settings)
        assert err.value.field == "scheduling.queueName" and "POSTTRAIN_REQUIRE_QUEUE" in str(err.value)
    check_scheduling(sched(queueName="team-a"), settings)
    check_scheduling(Scheduling(), settings, job=False)
    check_scheduling(None, settings, job=False)


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTTRAIN_ALLOWED_PRIORITY_CLASSES", "a,b")
    monkeypatch.setenv("POSTTRAIN_REQUIRE_QUEUE", "true")
    settings = OperatorSettings()
    assert settings.require_queue is True
    check_scheduling(sched(priorityClassName="b", queueName="q"), settings)
