"""compute.gpuType chooses nodes: every pod that asks for GPUs requires the GPU-product label (render/gpu.py)."""

from __future__ import annotations

import pytest
from fixtures.jobs import job_object, sft_spec
from posttrain.controller import render
from posttrain.controller.objects import parse_job
from posttrain.controller.render.gpu import gpu_affinity, gpu_products
from posttrain.controller.settings import OperatorSettings
from posttrain.controller.spec_errors import SpecError
from test_render import SETTINGS, TARGET, by, rljob

H100 = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"]


def node_terms(pod: dict) -> list[dict]:
    return pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def test_every_gpu_pod_of_an_rljob_requires_the_gpu_product_of_its_gpu_type() -> None:
    out = render.render_rljob(rljob(scheduling={"nodeSelector": {"pool": "train"}}), SETTINGS, TARGET)
    pods = [d["spec"]["template"]["spec"] for d in out.deployments()]
    pods.append(by(out.children, "Job", "trainer")["spec"]["template"]["spec"])
    assert len(pods) == 3  # rollout, reference, trainer
    for pod in pods:
        expr = {"key": "nvidia.com/gpu.product", "operator": "In", "values": H100}
        assert node_terms(pod) == [{"matchExpressions": [expr]}]
        assert pod["nodeSelector"] == {"pool": "train"}  # the user's own selector still applies (ANDed)


def test_cpu_runs_and_pods_without_gpus_choose_no_node() -> None:
    compute = {"gpuType": "CPU", "gpuCount": 2, "topology": {"gpusForVllm": 1, "gpusForTraining": 1}}
    out = render.render_rljob(rljob(compute=compute, reference={}), SETTINGS, TARGET)
    for child in out.children:
        pod = child.get("spec", {}).get("template", {}).get("spec")
        if pod is not None:
            assert "affinity" not in pod, child["metadata"]["name"]
    assert gpu_affinity("H100", 0, "nvidia.com/gpu.product", {"H100": H100}) == {}


def test_sftjob_trainer_and_the_operators_mapping_override() -> None:
    job = parse_job(job_object("SFTJob", sft_spec(compute={"gpuType": "a100", "gpuCount": 2}), namespace="t"))
    trainer = by(render.render_sftjob(job, SETTINGS).children, "Job", "trainer")["spec"]["template"]["spec"]
    assert node_terms(trainer)[0]["matchExpressions"][0]["values"][0] == "NVIDIA-A100-SXM4-80GB"
    custom = OperatorSettings(gpu_node_label="example.com/gpu", gpu_products={"A100": ["a100-80g"]})
    trainer = by(render.render_sftjob(job, custom).children, "Job", "trainer")["spec"]["template"]["spec"]
    assert node_terms(trainer) == [
        {"matchExpressions": [{"key": "example.com/gpu", "operator": "In", "values": ["a100-80g"]}]}
    ]
    off = by(render.render_sftjob(job, OperatorSettings(gpu_node_label="")).children, "Job", "trainer")
    assert "affinity" not in off["spec"]["template"]["spec"]


def test_settings_mapping_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTTRAIN_GPU_PRODUCTS", '{"H100": ["NVIDIA-H100-80GB-HBM3"]}')
    monkeypatch.setenv("POSTTRAIN_GPU_NODE_LABEL", "cloud.example/accelerator")
    settings = OperatorSettings()
    assert settings.gpu_products == {"H100": ["NVIDIA-H100-80GB-HBM3"]}
    assert settings.gpu_node_label == "cloud.example/accelerator"


def test_unknown_gpu_type_is_a_label_value_or_a_spec_error() -> None:
    assert gpu_products("NVIDIA-RTX-PRO-6000", {"H100": H100}) == ["NVIDIA-RTX-PRO-6000"]
    with pytest.raises(SpecError) as err:
        gpu_products("H100 PCIe (80 GB)", {"H100": H100})
    assert err.value.field == "compute.gpuType"
