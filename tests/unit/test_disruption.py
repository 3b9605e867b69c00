"""PodDisruptionBudgets of a job's trainer and rollout pods (render/disruption.py): each selects exactly its
role's pods of its own job, refuses every eviction of a healthy pod, and is owned by the job."""

from __future__ import annotations

from fixtures.jobs import UID
from posttrain.controller import render
from posttrain.controller.settings import OperatorSettings
from test_pod_security import SETTINGS, TARGET, rljob, sftjob


def selected(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_rl_and_sft_jobs_get_budgets_that_select_their_trainer_and_rollout_pods() -> None:
    for out, roles in ((render.render_rljob(rljob(), SETTINGS, TARGET), {"trainer", "rollout"}),
                       (render.render_sftjob(sftjob(), SETTINGS), {"trainer"})):  # fmt: skip
        budgets = [c for c in out.children if c["kind"] == "PodDisruptionBudget"]
        assert {b["metadata"]["labels"]["posttrain.dev/role"] for b in budgets} == roles
        templates = {c["metadata"]["name"]: c["spec"]["template"]["metadata"]["labels"]
                     for c in out.children if c["kind"] in ("Deployment", "Job")}  # fmt: skip
        for budget in budgets:
            assert budget["spec"]["maxUnavailable"] == 0
            assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
            assert budget["metadata"]["ownerReferences"][0]["uid"] == UID
            hits = [name for name, labels in templates.items() if selected(budget["spec"]["selector"], labels)]
            assert hits == [budget["metadata"]["name"]], (budget["metadata"]["name"], hits)


def test_budgets_can_be_switched_off() -> None:
    out = render.render_rljob(rljob(), OperatorSettings(disruption_budgets=False), TARGET)
    assert not [c for c in out.children if c["kind"] == "PodDisruptionBudget"]
