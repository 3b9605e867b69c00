"""examples/: an index (examples/README.md) that names every example, the examples users asked for (each
one converts: tests/unit/test_convert.py compares its committed CR with `posttrain convert`), and names that
agree across examples/ and manifests/. The two that wire Secrets or queues are rendered by the operator's pure
render functions to show the wiring holds."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from fixtures.jobs import job_object
from posttrain.controller import render
from posttrain.controller.objects import parse_job
from posttrain.controller.render.taskapp import TaskAppTarget
from posttrain.controller.render.workload import render_workload
from posttrain.controller.settings import OperatorSettings

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SETTINGS = OperatorSettings(trainer_image="reg/trainer:1", rollout_image="reg/rollout:1", s3_bucket="bkt")
TARGET = TaskAppTarget(url="http://math.team-a.svc:8000", secret_name="math-task-app-key", name="math")


def cr(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / "crs" / f"{name}.yaml").read_text())


def test_the_index_names_every_example():
    index = (EXAMPLES / "README.md").read_text()
    tomls = [p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("*.toml") if "taskapps" not in p.parts]
    assert tomls
    for rel in tomls:
        assert f"`{rel}`" in index, f"examples/README.md does not list {rel}"
    for folder in ("crs/", "taskapps/math/", "datasets/", "kueue/queues.yaml", "secrets/"):
        assert f"`{folder}`" in index
        assert (EXAMPLES / folder).exists()


def test_the_examples_issue_30_asked_for_exist_and_say_what_they_are():
    assert cr("sft_qlora")["spec"]["training"]["useQlora"] is True
    multinode = cr("sft_multinode_full")["spec"]
    assert multinode["compute"]["nodes"] == 2 and multinode["algorithm"]["variety"] == "fft"
    assert multinode["hyperparameters"]["parallelism"]["deepspeedStage"] == 3
    zero3 = cr("rl_full_zero3")["spec"]
    assert zero3["model"]["trainerMode"] == "full" and zero3["training"]["parallelism"]["deepspeedStage"] == 3
    vision = cr("sft_vision")["spec"]
    assert vision["dataset"]["uri"].endswith("vision_chat.jsonl") and "VL" in vision["model"]["base"]
    judge = cr("rl_judge_openai")["spec"]["judge"]
    assert judge["options"]["provider"] == "openai" and judge["apiKeySecretRef"]["name"] == "openai-judge-key"
    assert cr("rl_kueue")["spec"]["scheduling"]["queueName"] == "team-a-gpus"


def _render(name: str):
    doc = cr(name)
    job = parse_job(job_object(doc["kind"], doc["spec"], name=doc["metadata"]["name"], namespace="team-a"))
    return render.render_rljob(job, SETTINGS, TARGET)


def test_the_external_judge_key_comes_from_its_secret_and_nowhere_else():
    out = _render("rl_judge_openai")
    trainer = next(c for c in out.children if c["kind"] == "Job")
    env = {e["name"]: e for e in trainer["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POSTTRAIN_JUDGE_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "openai-judge-key"
    assert env["POSTTRAIN_JUDGE_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "OPENAI_API_KEY"
    assert "OPENAI_API_KEY" not in env  # never a trainer variable a TOML could name (docs/secrets-and-urls.md)
    assert not [c for c in out.children if c["metadata"]["labels"]["posttrain.dev/role"] == "judge"]
    template = yaml.safe_load((EXAMPLES / "secrets" / "openai-judge-key.template.yaml").read_text())
    assert template["metadata"]["name"] == "openai-judge-key" and "OPENAI_API_KEY" in template["stringData"]
    assert template["stringData"]["OPENAI_API_KEY"].startswith("<")  # a template, never a real key


def test_the_kueue_example_queues_on_a_local_queue_that_exists():
    queues = list(yaml.safe_load_all((EXAMPLES / "kueue" / "queues.yaml").read_text()))
    local = [q for q in queues if q["kind"] == "LocalQueue"]
    cluster = {q["metadata"]["name"] for q in queues if q["kind"] == "ClusterQueue"}
    assert [q["metadata"]["name"] for q in local] == ["team-a-gpus"]
    assert local[0]["spec"]["clusterQueue"] in cluster
    doc = cr("rl_kueue")
    job = parse_job(job_object(doc["kind"], doc["spec"], name=doc["metadata"]["name"], namespace="team-a"))
    out = render.render_rljob(job, SETTINGS, TARGET)
    # one Workload for the whole topology (all or nothing), in the example's LocalQueue; no child is labelled
    workload = render_workload(job.owner, out.children, job.spec.scheduling.queue_name)
    assert workload["spec"]["queueName"] == "team-a-gpus"
    assert {s["name"] for s in workload["spec"]["podSets"]} >= {"trainer", "rollout"}
    assert not any("kueue.x-k8s.io/queue-name" in c["metadata"].get("labels", {}) for c in out.children)
    # its priority class is one the queues file defines, and that ClusterQueue preempts by priority
    classes = {q["metadata"]["name"] for q in queues if q["kind"] == "WorkloadPriorityClass"}
    assert job.spec.scheduling.workload_priority_class_name in classes
    (cq,) = [q for q in queues if q["kind"] == "ClusterQueue"]
    assert cq["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"


def test_names_agree_across_examples_and_manifests():
    names = set()
    for path in [*(EXAMPLES / "crs").glob("*.yaml"), *(REPO / "manifests").rglob("*.yaml")]:
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") not in ("RLJob", "TaskApp"):
                continue
            spec = doc.get("spec") or {}
            task_app = spec.get("taskApp") or {}
            ref = spec.get("apiKeySecretRef") or task_app.get("apiKeySecretRef")
            if (doc["kind"] == "TaskApp" and doc["metadata"]["name"] == "math") or task_app.get("name") == "math":
                assert ref and ref["name"] == "math-task-app-key", path
                names.add(json.dumps(ref, sort_keys=True))
    assert len(names) == 1
