"""Pure rules of storage per tenant: whose folder weights are in, who may read them, and the policies
rendered for each store (posttrain.api.model_ids, posttrain.storage_policy, controller/render/model.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.jobs import RL_SPEC, job_object
from posttrain import storage_policy as sp
from posttrain.api import model_ids as m
from posttrain.api.convert import toml_to_cr
from posttrain.controller import render
from posttrain.controller.objects import parse_job
from posttrain.controller.render.model import check_model_access
from posttrain.controller.render.taskapp import TaskAppTarget
from posttrain.controller.settings import OperatorSettings
from posttrain.controller.spec_errors import SpecError

BASE = "Qwen/Qwen3-0.6B"
REPO = Path(__file__).resolve().parents[2]


def test_weights_namespace() -> None:
    assert m.weights_namespace(f"rl:{BASE}:team-b.job.ab12cd34", "bkt") == "team-b"
    assert m.weights_namespace("s3://bkt/jobs/team-b/job-ab12cd34/final/", "bkt") == "team-b"
    assert m.weights_namespace("s3://bkt/models/Qwen/Qwen3-0.6B/", "bkt") is None  # shared base models
    assert m.weights_namespace("/models/qwen", "bkt") is None  # a path in the image
    assert m.weights_namespace("s3://other/jobs/team-b/x/", None) == "team-b"  # the CLI: the URI's bucket
    for outside in (
        "s3://other-bucket/jobs/team-b/x/",  # another bucket
        "s3://bkt/datasets/x/",  # outside jobs/<namespace>/
        "s3://bkt/jobs/",
        "s3://bkt/jobs/team-a",
        "s3://bkt/jobs/team-a/../team-b/x/",
        "s3://bkt/jobs/team-a/./x/",
        "s3://bkt/jobs//team-b/x/",
        "s3://bkt/models/../jobs/team-b/x/",
    ):
        with pytest.raises(m.ModelIdError):
            m.weights_namespace(outside, "bkt")


def test_sharing_is_the_owners_choice() -> None:
    shared = {"team-b": ["team-a"], "public": ["*"]}
    m.check_weights_access(f"rl:{BASE}:team-a.j.ab12cd34", "model.source", "team-a", "bkt", {})
    m.check_weights_access(f"rl:{BASE}:team-b.j.ab12cd34", "model.source", "team-a", "bkt", shared)
    m.check_weights_access("s3://bkt/jobs/public/j/final/", "model.source", "team-c", "bkt", shared)
    with pytest.raises(m.ModelIdError, match="'team-b', which does not share its models with namespace 'team-c'"):
        m.check_weights_access(f"rl:{BASE}:team-b.j.ab12cd34", "model.source", "team-c", "bkt", shared)
    with pytest.raises(m.ModelIdError, match="namespace .team-a.") as err:
        m.check_weights_access(f"rl:{BASE}:team-a.j.ab12cd34", "model.source", "team-b", "bkt", shared)
    assert "POSTTRAIN_SHARED_MODELS" in (err.value.fix or "")


def _job(model: dict, namespace: str = "team-a"):
    spec = {
        **RL_SPEC,
        "taskApp": {"url": "http://math.tasks.svc:8000", "apiKeySecretRef": {"name": "task-key"}},
        "model": model,
        "originalToml": "",
    }
    return parse_job(job_object("RLJob", spec, name="j", namespace=namespace))


def test_operator_refuses_another_namespaces_model_before_rendering() -> None:
    settings = OperatorSettings(s3_bucket="bkt")
    theirs = _job({"source": f"rl:{BASE}:team-b.job.ab12cd34", "trainerMode": "full"})
    with pytest.raises(SpecError) as err:
        check_model_access(theirs.spec, "team-a", settings)
    assert err.value.field == "model.source" and str(err.value).startswith("spec.model.source: ")
    target = TaskAppTarget(url="http://math.tasks.svc:8000", secret_name="task-key", name=None)
    with pytest.raises(SpecError):
        render.render_job(theirs, settings, target)
    base_uri = _job({"base": "s3://bkt/jobs/team-b/job-ab12cd34/final/", "trainerMode": "full"})
    with pytest.raises(SpecError, match="spec.model.base"):
        check_model_access(base_uri.spec, "team-a", settings)
    # the same jobs are fine where team-b shares with team-a, and for team-b itself
    check_model_access(theirs.spec, "team-a", OperatorSettings(s3_bucket="bkt", shared_models={"team-b": ["team-a"]}))
    check_model_access(theirs.spec, "team-b", settings)
    check_model_access(_job({"base": BASE, "trainerMode": "full"}).spec, "team-a", settings)
    check_model_access(_job({"base": "s3://bkt/models/x/", "trainerMode": "full"}).spec, "team-a", settings)


def test_shared_models_setting_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("POSTTRAIN_SHARED_MODELS", '{"team-b": ["team-a", "team-c"]}')
    assert OperatorSettings().shared_models == {"team-b": ["team-a", "team-c"]}


def test_cli_refuses_s3_source_outside_namespace_folders_and_warns_on_foreign() -> None:
    with pytest.raises(m.ModelIdError, match="outside"):
        m.normalize_source("s3://posttrain/datasets/weights/", "rl")
    assert m.normalize_source("s3://posttrain/jobs/team-a/j-1/final/", "rl").startswith("s3://")
    toml = (REPO / "examples/rl_from_ft.toml").read_text()  # source: ft:...:default.math-sft-full.7c1e2a9b
    kwargs = {"kind": "rl", "task_url": "http://math.tasks.svc:8000", "env": {}}
    _, warnings = toml_to_cr(toml, namespace="team-a", **kwargs)
    assert any("namespace 'default'" in w and "POSTTRAIN_SHARED_MODELS" in w for w in warnings), warnings
    _, warnings = toml_to_cr(toml, namespace="default", **kwargs)
    assert not any("POSTTRAIN_SHARED_MODELS" in w for w in warnings), warnings


def test_storage_policies() -> None:
    assert sp.read_from("team-a", {"team-b": ["team-a"], "pub": ["*"], "team-c": ["x"]}) == ["pub", "team-b"]
    actions = sp.seaweed_actions("bkt", "team-a", ["team-b"])
    assert "Write:bkt/jobs/team-a/*" in actions and "Read:bkt/jobs/team-b/*/final/*" in actions
    assert "Read:bkt/jobs/team-b/*" not in actions  # a share is the final models, not the whole folder
    assert not any(a.startswith("Write:bkt/jobs/team-b") for a in actions)
    assert all(a.endswith("/*") for a in actions)  # never a whole-bucket action
    policy = sp.iam_policy("bkt", "team-a")
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert by_sid["ReadWriteOwnFolder"]["Resource"] == ["arn:aws:s3:::bkt/jobs/team-a/*"]
    assert by_sid["ListOwnAndShared"]["Condition"]["StringLike"]["s3:prefix"] == ["jobs/team-a/*", "models/*"]
    shared = {s["Sid"]: s for s in sp.iam_policy("bkt", "team-a", ["team-b"])["Statement"]}
    assert shared["ReadSharedModels"]["Resource"] == ["arn:aws:s3:::bkt/jobs/team-b/*/final/*", "arn:aws:s3:::bkt/models/*"]
    assert "jobs/team-b/*/final/*" in shared["ListOwnAndShared"]["Condition"]["StringLike"]["s3:prefix"]
    assert not any(r.endswith("/jobs/team-b/*") for st in shared.values() for r in st["Resource"])
    assert "${aws:username}" in str(sp.iam_policy("bkt"))  # one MinIO policy for users named after namespaces


def test_minio_tenants_plan() -> None:
    from posttrain import minio_tenants

    users = minio_tenants.plan({"team-a": "a" * 12, "team-b": "b" * 12}, "bkt", {"team-b": ["team-a"]})
    assert [(u.namespace, u.policy_name) for u in users] == [("team-a", "posttrain-ns-team-a"), ("team-b", "posttrain-ns-team-b")]
    assert users[0].policy == sp.iam_policy("bkt", "team-a", ["team-b"])
    assert users[1].policy == sp.iam_policy("bkt", "team-b", [])
    with pytest.raises(ValueError, match="8 characters"):
        minio_tenants.plan({"team-a": "short"}, "bkt", {})


def test_the_docs_policy_template_is_the_rendered_one() -> None:
    """docs/storage.md shows the IAM policy storage_policy renders (placeholders for bucket and namespace)."""
    import json
    import re

    text = (REPO / "docs" / "storage.md").read_text()
    block = re.search(r"<!-- iam-policy -->\n```json\n(.*?)```", text, re.S)
    assert block, "docs/storage.md lost its IAM policy template"
    assert json.loads(block.group(1)) == sp.iam_policy("BUCKET", "NAMESPACE")
