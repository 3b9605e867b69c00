"""Keys posttrain accepts (synth's schema types them, so a synth config keeps loading) that change nothing
here, each with the reason. `posttrain validate` and `convert` print a warning for every one a config sets
(load_rl / load_sft add them to their warnings); tests/unit/test_accepted_keys.py walks every key the RL and
SFT models accept and fails unless it is read by the trainer, the operator or the rollout request, or is
listed here."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

_TP = "the trainer shards with DDP, FSDP2 or DeepSpeed ZeRO; it has no tensor or pipeline parallelism"
# Vision RL needs none of these: images flow whenever the task app sends image parts and the model is a
# vision-language model (the trainer reads that from its config.json and loads the processor saved with it).
_VISION = (
    "a vision-language model is detected from its config.json and trains on the images its task app sends "
    "(docs/vision-rl.md)"
)
_FP16 = "precision comes from the CPU/GPU capability probe (bf16 where native, else fp32; parallelism.bf16)"

RL_INERT: dict[str, str] = {
    "rollout.use_vision": _VISION + "; rollout.policy_config.use_vision reaches the task app",
    "model.supports_vision": _VISION,
    "model.vision_processor_id": "the trainer and vLLM use the processor saved with the model's weights",
    "training.supports_vision": _VISION,
    "rollout.task_app_origin_rewards_only": "the env reward is always the task app's; judge scores blend only "
    "through [rubric]/[judge]",
    "judge.options.rubric_id": "there is no rubric store: the judge scores with judge.options.rubric_overrides "
    "or the task app's /task_info rubric",
    "training.max_accumulated_minibatch": "mini-batches are training.num_minibatches; micro-batches "
    "training.micro_batch",
    "training.parallelism.tensor_parallel_size": _TP + " (vLLM's is [vllm].tensor_parallel_size)",
    "training.parallelism.pipeline_parallel_size": _TP,
    "training.parallelism.fp16": _FP16,
    "training.weight_sync.direct": "weights always sync through object storage (POST /v1/weights)",
    "training.weight_sync.verify_every_k": "each sync is checked by the rollout server's weight version",
    "vllm.gpu_memory_utilization": "the rollout server sizes vLLM's KV cache itself",
    "reference.health_interval_ms": "the trainer's init container waits for the reference with its own timing",
    "reference.health_max_wait_s": "the trainer's init container waits for the reference with its own timing",
    "data.seeds": "training seeds are data.seed_start + iteration x batch_size + j; evaluation seeds are "
    "[evaluation].seeds",
    "training.weight_sync.mode": "what is synced is training.weight_sync.format (full, or lora for a LoRA policy)",
    "policy.inference_url": "the policy is served by the job's own rollout servers",
    "reference.port": "the reference server listens where posttrain's Service for it points (port 8000)",
}
# Keys that are metadata: kept with the job's record (config.json, manifest.json), no warning.
RECORD_ONLY: dict[str, str] = {"tags": "metadata, kept in the job's config.json and manifest.json"}
# Keys whose one value is what posttrain does anyway: set to anything else, they warn.
RL_FIXED: dict[str, tuple[Any, str]] = {
    "rollout.batches_per_step": (1, "every iteration is one batch"),
    "training.log_interval": (1, "every iteration is logged and reported"),
    "compute.topology.type": ("single_node_split", "the split comes from the gpus_for_* counts and compute.nodes"),
    "training.gradient_accumulation_steps": (1, "an iteration's optimizer steps are training.num_minibatches; "
                                             "micro-batches training.micro_batch"),
    "training.weight_sync.enable": (True, "weights always sync to the policy rollout servers every "
                                    "weight_sync_interval iterations"),
    "training.weight_sync.targets": (["policy"], "the policy rollout servers are the only servers whose weights "
                                     "change"),
}
_SFT_TOPOLOGY = "SFT has no rollout or reference servers: [compute.topology] splits an RL job's GPUs"
_SFT_POLICY = "SFT samples nothing: [policy] is kept for synth compatibility (its trainer_mode is read)"
SFT_INERT: dict[str, str] = {
    **{f"compute.topology.{key}": _SFT_TOPOLOGY
       for key in ("type", "gpus_for_vllm", "gpus_for_ref", "tensor_parallel", "reference_placement")},
    **{f"policy.{key}": _SFT_POLICY
       for key in ("model_name", "source", "max_tokens", "temperature", "top_p", "top_k", "repetition_penalty",
                   "stop_sequences", "label", "inference_url")},
    "job.poll_seconds": "`posttrain train` polls every --poll-interval seconds",
    "data.topology.container_count": "the trainer's process count comes from [compute]",
    "hyperparameters.parallelism.tensor_parallel_size": _TP,
    "hyperparameters.parallelism.pipeline_parallel_size": _TP,
    "hyperparameters.parallelism.fp16": _FP16,
}


def _lookup(node: Any, parts: list[str]) -> Any:
    for part in parts:
        if node is None:
            return None
        if isinstance(node, BaseModel):
            extra = node.model_extra or {}
            node = getattr(node, part, None) if part in type(node).model_fields else extra.get(part)
        elif isinstance(node, dict):
            node = node.get(part)
        else:
            return None
    return node


def is_set(config: BaseModel, path: str) -> bool:
    """Whether the config sets `path` (explicitly: a field left at its default is not set)."""
    parts = path.split(".")
    parent = _lookup(config, parts[:-1])
    if isinstance(parent, BaseModel):
        leaf = parts[-1]
        if leaf in type(parent).model_fields:
            return leaf in parent.model_fields_set and getattr(parent, leaf) is not None
        return (parent.model_extra or {}).get(leaf) is not None
    if isinstance(parent, dict):
        return parent.get(parts[-1]) is not None
    return False


def inert_warnings(config: BaseModel, inert: dict[str, str]) -> list[str]:
    """One warning per accepted-without-effect key the config sets; for RL also rollout.episodes_per_batch
    (synth requires it) when it disagrees with what an iteration collects, training.max_turns (required too)
    when it disagrees with rollout.max_turns, and the RL_FIXED keys when set to another value than the one
    posttrain uses anyway."""
    out = [
        f"{path}: accepted for synth compatibility but has no effect here ({reason})"
        for path, reason in inert.items()
        if is_set(config, path)
    ]
    if inert is not RL_INERT:
        return out
    per_batch = _lookup(config, ["rollout", "episodes_per_batch"])
    batch, group = _lookup(config, ["training", "batch_size"]), _lookup(config, ["training", "group_size"])
    if (
        isinstance(per_batch, int)
        and isinstance(batch, int)
        and isinstance(group, int)
        and per_batch != batch * group
    ):
        out.append(
            f"rollout.episodes_per_batch = {per_batch} has no effect: an iteration collects training.batch_size "
            f"x training.group_size = {batch * group} rollouts"
        )
    turns, rollout_turns = _lookup(config, ["training", "max_turns"]), _lookup(config, ["rollout", "max_turns"])
    if isinstance(turns, int) and isinstance(rollout_turns, int) and turns != rollout_turns:
        out.append(f"training.max_turns = {turns} has no effect: rollout.max_turns = {rollout_turns} sets the turns "
                   "per episode")  # fmt: skip
    tp, ref_gpus = _lookup(config, ["reference", "tp"]), _lookup(config, ["compute", "topology", "gpus_for_ref"])
    if isinstance(tp, int) and tp != (ref_gpus or 1):
        out.append(f"reference.tp = {tp} has no effect: the reference server's tensor-parallel degree is "
                   f"compute.topology.gpus_for_ref = {ref_gpus or 1}")  # fmt: skip
    for path, (value, reason) in RL_FIXED.items():
        got = _lookup(config, path.split("."))
        if got is not None and got != value:
            out.append(f"{path} = {got} has no effect: {reason}")
    return out
