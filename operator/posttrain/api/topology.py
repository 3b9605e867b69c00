"""How a job's GPUs split between its roles, and where its KL reference model runs: the one rule that the
config checks (posttrain.api.config), the operator's pods (posttrain.controller.render) and the local
runner (posttrain.local.runner) all follow.

An RL job's compute.gpu_count GPUs go to the rollout servers (vLLM, `tensor_parallel` GPUs per replica),
the trainer (spread evenly over compute.nodes pods) and, when the reference model is dedicated, a reference
server. compute.topology may give each count; the ones it leaves out are derived from the others. An SFT
job's GPUs all go to the trainer.

The reference model ("none", "shared": the trainer scores with a frozen copy of its own, "dedicated": a
server of its own) is placed by the first of: a [reference].placement other than "none", a
topology.reference_placement other than "none", gpus_for_ref > 0 (dedicated). "none" never overrides, since
synth's CLI injects topology.reference_placement = "none" into configs that ask for a dedicated reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from posttrain.api.sections import AlgorithmConfig, ComputeConfig, ReferenceConfig, TopologyConfig, VllmConfig
from posttrain.errors import Problem

Placement = Literal["none", "shared", "dedicated"]
PLACED: tuple[Placement, ...] = ("shared", "dedicated")


def reference_placement(reference: ReferenceConfig | None, topology: TopologyConfig | None) -> Placement:
    """Where the job's KL reference model runs (see the module's docstring for the precedence)."""
    if reference is not None and reference.placement in PLACED:
        return reference.placement
    if topology is not None and topology.reference_placement in PLACED:
        return topology.reference_placement
    if topology is not None and topology.gpus_for_ref:
        return "dedicated"
    return "none"


def settle_reference_placement(
    compute: ComputeConfig, reference: ReferenceConfig | None
) -> ReferenceConfig | None:
    """A config's placement written out: topology.reference_placement and [reference].placement, where
    unset or "none", become the resolved placement (only when the config has a [compute.topology]).
    Returns the [reference] section, made when the config has none."""
    topology = compute.topology
    if topology is None:
        return reference
    placement = reference_placement(reference, topology)
    if topology.reference_placement in (None, "none"):
        topology.reference_placement = placement
    if reference is None:
        return ReferenceConfig(placement=topology.reference_placement)
    if reference.placement in (None, "none"):
        reference.placement = topology.reference_placement
    return reference


@dataclass(frozen=True)
class Topology:
    """The GPU roles of one job."""

    gpu_count: int
    nodes: int
    gpus_for_vllm: int
    gpus_for_training: int
    gpus_for_ref: int
    tensor_parallel: int
    reference_dedicated: bool
    # compute.gpuType "CPU": the counts above are processes and servers, not GPUs; no pod asks for one.
    cpu_only: bool = False

    def gpus(self, count: int) -> int:
        """What a pod of this job requests of the GPU resource for `count` GPUs of its role."""
        return 0 if self.cpu_only else count

    @property
    def rollout_replicas(self) -> int:
        if self.gpus_for_vllm <= 0:
            return 0
        return max(1, self.gpus_for_vllm // self.tensor_parallel)

    @property
    def trainer_gpus_per_pod(self) -> int:
        return self.gpus_for_training // self.nodes if self.gpus_for_training > 0 else 0

    @property
    def nproc_per_node(self) -> int:
        return max(1, self.trainer_gpus_per_pod)


def is_cpu_only(compute: ComputeConfig) -> bool:
    """compute.gpuType "CPU" (as `make demo` and the real dev node run a job): no pod asks for a GPU."""
    return str(compute.gpu_type or "").strip().lower() == "cpu"


def uses_reference(algorithm: AlgorithmConfig | None) -> bool:
    """ReST-EM (variety "restem") trains with SFT updates on the samples it keeps: no KL reference."""
    return algorithm is None or algorithm.variety != "restem"


def rl_topology(
    compute: ComputeConfig,
    vllm: VllmConfig | None,
    reference: ReferenceConfig | None,
    algorithm: AlgorithmConfig | None = None,
) -> Topology:
    """An RL job's split. Without role counts, what the reference leaves is halved between the rollout
    servers and the trainer; a dedicated reference gets gpus_for_ref GPUs (at least one)."""
    topo = compute.topology or TopologyConfig()
    tp = topo.tensor_parallel or (vllm.tensor_parallel_size if vllm else None) or 1
    dedicated = uses_reference(algorithm) and reference_placement(reference, topo) == "dedicated"
    gpus_ref = max(1, topo.gpus_for_ref or 0) if dedicated else 0
    gpu_count = compute.gpu_count
    vllm_gpus, train_gpus = topo.gpus_for_vllm, topo.gpus_for_training
    if vllm_gpus is None and train_gpus is None:
        rest = max(0, gpu_count - gpus_ref)
        vllm_gpus = max(1, rest // 2) if rest else 1
        train_gpus = max(0, rest - vllm_gpus)
    elif vllm_gpus is None:
        vllm_gpus = max(1, gpu_count - (train_gpus or 0) - gpus_ref)
    elif train_gpus is None:
        train_gpus = max(0, gpu_count - vllm_gpus - gpus_ref)
    return Topology(
        gpu_count=gpu_count,
        nodes=max(1, compute.nodes or 1),
        gpus_for_vllm=vllm_gpus,
        gpus_for_training=train_gpus or 0,
        gpus_for_ref=gpus_ref,
        tensor_parallel=max(1, tp),
        reference_dedicated=dedicated,
        cpu_only=is_cpu_only(compute),
    )


def sft_topology(compute: ComputeConfig | None) -> Topology:
    """An SFT job's split: every GPU trains (compute.topology.gpus_for_training when given)."""
    topo = (compute.topology if compute else None) or TopologyConfig()
    gpu_count = compute.gpu_count if compute else 0
    train_gpus = topo.gpus_for_training if topo.gpus_for_training is not None else gpu_count
    return Topology(
        gpu_count=gpu_count,
        nodes=max(1, (compute.nodes if compute else None) or 1),
        gpus_for_vllm=0,
        gpus_for_training=train_gpus,
        gpus_for_ref=0,
        tensor_parallel=max(1, topo.tensor_parallel or 1),
        reference_dedicated=False,
        cpu_only=compute is not None and is_cpu_only(compute),
    )


def trainer_gpus(compute: ComputeConfig) -> int | None:
    """The trainer's GPUs as compute.topology gives them (directly, or what vLLM and the reference leave);
    None when the topology does not say."""
    topo = compute.topology
    if topo is None:
        return None
    if topo.gpus_for_training is not None:
        return topo.gpus_for_training
    if topo.gpus_for_vllm is not None:
        return compute.gpu_count - topo.gpus_for_vllm - (topo.gpus_for_ref or 0)
    return None


def split_problems(compute: ComputeConfig) -> list[Problem]:
    """What is inconsistent in an RL config's GPU split (checked before placement is settled)."""
    problems: list[Problem] = []
    topo = compute.topology
    if topo is not None:
        parts = (topo.gpus_for_vllm, topo.gpus_for_training, topo.gpus_for_ref)
        if all(p is not None for p in parts) and sum(parts) != compute.gpu_count:  # type: ignore[arg-type]
            problems.append(
                Problem(
                    f"gpus_for_vllm + gpus_for_training + gpus_for_ref = {sum(parts)} but compute.gpu_count = "  # type: ignore[arg-type]
                    f"{compute.gpu_count}",
                    field="compute.topology",
                    fix="make the three role counts add up to compute.gpu_count",
                )
            )
        if (
            topo.tensor_parallel
            and topo.gpus_for_vllm is not None
            and topo.gpus_for_vllm % topo.tensor_parallel
        ):
            problems.append(
                Problem(
                    f"tensor_parallel = {topo.tensor_parallel} does not divide gpus_for_vllm = {topo.gpus_for_vllm}",
                    field="compute.topology.tensor_parallel",
                    fix="choose a tensor_parallel that divides gpus_for_vllm",
                )
            )
        trainer = trainer_gpus(compute)
        if compute.nodes and trainer is not None and trainer % compute.nodes:
            problems.append(
                Problem(
                    f"compute.nodes = {compute.nodes} does not divide the {trainer} trainer GPUs",
                    field="compute.nodes",
                    fix="use a node count that divides gpus_for_training",
                )
            )
    return problems


def dedicated_reference_problems(compute: ComputeConfig) -> list[Problem]:
    """A dedicated reference needs GPUs (checked after placement is settled)."""
    topo = compute.topology
    if topo is not None and topo.reference_placement == "dedicated" and topo.gpus_for_ref == 0:
        return [
            Problem(
                "a dedicated reference model needs GPUs but gpus_for_ref = 0",
                field="compute.topology.gpus_for_ref",
                fix='set gpus_for_ref >= 1 or reference placement = "none"/"shared"',
            )
        ]
    return []


def tensor_parallel_problems(compute: ComputeConfig, vllm: VllmConfig | None) -> list[Problem]:
    """[vllm].tensor_parallel_size and topology.tensor_parallel, when both are given, agree."""
    topo = compute.topology
    vllm_tp = vllm.tensor_parallel_size if vllm else None
    if vllm_tp and topo and topo.tensor_parallel and vllm_tp != topo.tensor_parallel:
        return [
            Problem(
                f"vllm.tensor_parallel_size = {vllm_tp} but topology.tensor_parallel = {topo.tensor_parallel}",
                field="vllm.tensor_parallel_size",
                fix="make them equal",
            )
        ]
    return []
