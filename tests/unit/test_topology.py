"""posttrain.api.topology: the GPU split of a job and where its reference model runs, one rule for the config
checks, the operator and the local runner."""

from __future__ import annotations

import pytest
from posttrain.api.sections import AlgorithmConfig, ComputeConfig, ReferenceConfig, TopologyConfig
from posttrain.api.topology import reference_placement, rl_topology, sft_topology


def compute(gpu_count: int, **topology: object) -> ComputeConfig:
    return ComputeConfig.model_validate(
        {"gpu_type": "H100", "gpu_count": gpu_count, **({"topology": topology} if topology else {})}
    )


@pytest.mark.parametrize(
    ("given", "reference", "want"),
    [
        (compute(2, gpus_for_vllm=1, gpus_for_training=1), None, (1, 1, 0, 1)),
        (compute(8, gpus_for_vllm=5, gpus_for_training=2, gpus_for_ref=1), None, (5, 2, 1, 5)),
        (
            compute(8, gpus_for_vllm=4, gpus_for_training=4, reference_placement="none"),
            ReferenceConfig(placement="dedicated"),
            (4, 4, 1, 4),
        ),
        (compute(4, gpus_for_vllm=4, tensor_parallel=4, gpus_for_training=0), None, (4, 0, 0, 1)),
        (compute(4), None, (2, 2, 0, 2)),
    ],
)
def test_rl_split(given: ComputeConfig, reference: ReferenceConfig | None, want: tuple) -> None:
    topo = rl_topology(given, None, reference)
    assert (topo.gpus_for_vllm, topo.gpus_for_training, topo.gpus_for_ref, topo.rollout_replicas) == want


def test_restem_runs_no_reference_and_gpu_type_cpu_asks_for_no_gpu() -> None:
    given, dedicated = (
        compute(3, gpus_for_vllm=1, gpus_for_training=1, gpus_for_ref=1),
        ReferenceConfig(placement="dedicated"),
    )
    gspo = AlgorithmConfig(type="online", method="policy_gradient", variety="gspo")
    restem = AlgorithmConfig(type="online", method="restem", variety="restem")
    assert rl_topology(given, None, dedicated, gspo).reference_dedicated
    topo = rl_topology(given, None, dedicated, restem)
    assert not topo.reference_dedicated and topo.gpus_for_ref == 0
    cpu = rl_topology(ComputeConfig(gpu_type="CPU", gpu_count=2), None, None)
    assert cpu.cpu_only and (cpu.gpus_for_vllm, cpu.gpus_for_training) == (1, 1) and cpu.gpus(1) == 0
    assert not topo.cpu_only and topo.gpus(1) == 1


def test_sft_split_gives_every_gpu_to_the_trainer() -> None:
    topo = sft_topology(ComputeConfig(gpu_type="H100", gpu_count=4, nodes=2))
    assert (topo.gpus_for_training, topo.trainer_gpus_per_pod, topo.nodes, topo.gpus_for_vllm) == (4, 2, 2, 0)
    assert sft_topology(None).nproc_per_node == 1


@pytest.mark.parametrize(
    ("reference", "topology", "gpus", "want"),
    [
        (None, None, None, "none"),
        ("dedicated", "none", None, "dedicated"),  # synth's CLI injects "none": it never overrides
        ("shared", "dedicated", None, "shared"),  # [reference] first
        (None, "shared", None, "shared"),
        ("none", "dedicated", None, "dedicated"),
        (None, None, 1, "dedicated"),  # gpus_for_ref > 0
        ("none", "none", 2, "dedicated"),
        (None, "shared", 1, "shared"),  # an explicit placement before gpus_for_ref
    ],
)
def test_reference_placement_precedence(
    reference: str | None, topology: str | None, gpus: int | None, want: str
) -> None:
    ref = ReferenceConfig(placement=reference) if reference else None
    topo = TopologyConfig(reference_placement=topology, gpus_for_ref=gpus)
    assert reference_placement(ref, topo) == want
