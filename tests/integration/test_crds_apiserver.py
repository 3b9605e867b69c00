"""The generated CRDs on the real API server: they install and become Established, the API server itself
rejects invalid jobs with the CEL/OpenAPI message, keeps spec immutable except `suspend`, accepts every
committed example, and kubectl shows the printer columns and explains the schema."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from posttrain.api.resources import GROUP, VERSION, plural

REPO = Path(__file__).resolve().parents[2]
KINDS = ("RLJob", "SFTJob", "TaskApp")


def install_crds(cluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPO / "crds"))
    # Discovery lags Established by a moment; creating objects before it fails with 404.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = cluster.kubectl("api-resources", "--api-group=posttrain.dev", "-o", "name", check=False).stdout
        if all(f"{p}.posttrain.dev" in out for p in map(plural, KINDS)):
            return
        time.sleep(0.3)
    raise AssertionError("posttrain.dev resources never appeared in discovery")


@pytest.fixture(scope="module")
def crds(cluster):
    install_crds(cluster)
    return cluster


@pytest.fixture
def custom(crds) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(crds.api_client())


def example(name: str) -> dict:
    return yaml.safe_load((REPO / "examples" / "crs" / name).read_text())


def create(custom: client.CustomObjectsApi, namespace: str, obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("namespace", None)
    return custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural(obj["kind"]), obj)


def rejection(custom: client.CustomObjectsApi, namespace: str, obj: dict) -> str:
    with pytest.raises(ApiException) as err:
        create(custom, namespace, obj)
    assert err.value.status == 422, err.value.body
    return err.value.body


def test_crds_are_established_with_short_names_and_category(crds):
    out = crds.kubectl("api-resources", "--api-group=posttrain.dev", "-o", "wide").stdout
    for short in ("rlj", "sftj", "ta"):
        assert f" {short} " in out
    assert "posttrain" in out  # category


@pytest.mark.parametrize("path", sorted(p.name for p in (REPO / "examples" / "crs").glob("*.yaml")))
def test_every_committed_example_is_accepted(custom, namespace, path):
    created = create(custom, namespace, example(path))
    assert created["metadata"]["uid"]


def test_both_model_source_and_base_is_rejected_by_the_api_server(custom, namespace):
    obj = example("rl_qwen3_4b.yaml")
    obj["spec"]["model"]["source"] = "ft:Qwen/Qwen3-4B:team.job.abcd1234"
    body = rejection(custom, namespace, obj)
    assert "model.source" in body and "model.base" in body


def test_neither_model_source_nor_base_is_rejected(custom, namespace):
    obj = example("rl_qwen3_4b.yaml")
    del obj["spec"]["model"]["base"]
    body = rejection(custom, namespace, obj)
    assert "model.source" in body


def test_topology_that_does_not_add_up_is_rejected(custom, namespace):
    obj = example("rl_qwen3_4b.yaml")
    obj["spec"]["compute"]["topology"]["gpusForTraining"] = 3  # 2 + 3 + 1 != gpuCount 4
    body = rejection(custom, namespace, obj)
    assert "gpu" in body.lower()


def test_tensor_parallel_must_divide_vllm_gpus(custom, namespace):
    obj = example("rl_qwen3_4b.yaml")
    obj["spec"]["compute"]["topology"]["tensorParallel"] = 3
    rejection(custom, namespace, obj)


def test_unknown_fields_outside_extras_are_rejected_not_silently_dropped(custom, namespace):
    obj = example("rl_qwen3_4b.yaml")
    obj["spec"]["model"]["noSuchField"] = 1
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "rljobs", obj, field_validation="Strict"
        )
    assert "noSuchField" in err.value.body


def test_spec_is_immutable_except_suspend(custom, namespace):
    created = create(custom, namespace, example("rl_qwen3_4b.yaml"))
    name = created["metadata"]["name"]
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "rljobs", name, {"spec": {"model": {"label": "changed"}}}
        )
    assert err.value.status == 422 and "immutable" in err.value.body
    patched = custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "rljobs", name, {"spec": {"suspend": True}}
    )
    assert patched["spec"]["suspend"] is True


def test_kubectl_get_shows_the_printer_columns(crds, custom, namespace):
    from posttrain_trainer.report import camel_progress

    created = create(custom, namespace, example("rl_qwen3_4b.yaml"))
    name = created["metadata"]["name"]
    fine_tuned = f"rl:Qwen/Qwen3-4B:{namespace}.{name}.1a2b3c4d"
    custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        "rljobs",
        name,
        {
            "status": {
                "phase": "Running",
                "reason": "Running",
                "model": "Qwen/Qwen3-4B",
                "fineTunedModel": fine_tuned,
                # what the trainer's reporter patches
                "progress": camel_progress(step=12, total=50, mean_return=0.5, eval_score=0.25),
            }
        },
    )
    out = crds.kubectl("get", "rljobs", "-n", namespace).stdout
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "PROGRESS", "REWARD", "EVAL", "REASON", "AGE"]
    assert row.split()[:6] == [name, "Running", "12/50", "0.5", "0.25", "Running"]
    assert fine_tuned not in out  # ~70 characters: only with -o wide
    wide = crds.kubectl("get", "rljobs", "-n", namespace, "-o", "wide").stdout
    assert wide.splitlines()[0].split()[-2:] == ["MODEL", "FINE-TUNED-MODEL"]
    assert wide.splitlines()[1].split()[-2:] == ["Qwen/Qwen3-4B", fine_tuned]


def test_kubectl_get_sftjobs_shows_loss_and_taskapps_their_reason(crds, custom, namespace):
    from posttrain_trainer.report import camel_progress

    name = create(custom, namespace, example("sft_lora.yaml"))["metadata"]["name"]
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sftjobs", name,
        {"status": {"phase": "Running", "reason": "Running", "progress": camel_progress(step=3, total=40, loss=1.25)}},
    )  # fmt: skip
    header, row = crds.kubectl("get", "sftjobs", "-n", namespace).stdout.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "PROGRESS", "LOSS", "EVAL", "REASON", "AGE"]
    assert row.split()[:4] == [name, "Running", "3/40", "1.25"]
    app = create(custom, namespace, example("taskapp-math.yaml"))["metadata"]["name"]
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "taskapps", app,
        {"status": {"verified": False, "reason": "Unauthorized", "url": "http://math:8000"}},
    )  # fmt: skip
    header, row = crds.kubectl("get", "taskapps", "-n", namespace).stdout.splitlines()[:2]
    assert header.split() == ["NAME", "VERIFIED", "REASON", "AGE"]
    assert row.split()[:3] == [app, "false", "Unauthorized"]


def test_kubectl_explain_documents_the_spec(crds):
    out = crds.kubectl("explain", "rljob.spec").stdout
    assert "model" in out and "compute" in out and "suspend" in out


def test_adding_a_field_after_creation_is_also_a_spec_change(custom, namespace):
    obj = example("rl_qwen3_4b.yaml")
    obj["spec"].pop("activeDeadlineSeconds", None)
    name = create(custom, namespace, obj)["metadata"]["name"]
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "rljobs", name, {"spec": {"activeDeadlineSeconds": 60}}
        )
    assert err.value.status == 422


def test_overlong_and_retention_keys_are_checked_by_the_api_server(custom, namespace):
    obj = example("rl_qwen3_4b.yaml")
    training = obj["spec"]["training"]
    training.update(overlong="mask", overlongPenalty=-0.5, keepCheckpoints=2, keepWeightVersions=1)
    assert create(custom, namespace, obj)["spec"]["training"]["overlong"] == "mask"
    for field, value in (("overlong", "chop"), ("keepCheckpoints", -1), ("overlongPenalty", 0.5)):
        bad = example("rl_qwen3_4b.yaml")
        bad["metadata"]["name"] += "-bad"
        bad["spec"]["training"][field] = value
        assert f"spec.training.{field}" in rejection(custom, namespace, bad)
