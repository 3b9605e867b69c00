"""A vision RL job's image settings -> the rollout server's flags (pure): the one place that reads them, for
the operator's rollout Deployment and the local runner alike.

synth puts them in [rollout] and [rollout.policy_config] (policy_config wins), max_images_per_message in
[model]; vllm.limit_mm_per_prompt goes to vLLM as it is. The rollout server applies the limits to every chat
request before vLLM sees it (posttrain_rollout.vision), so a task app cannot exceed them, and the captured
images are exactly the ones vLLM got."""

from __future__ import annotations

import json
from typing import Any


def _section(config: dict[str, Any], *path: str) -> dict[str, Any]:
    node: Any = config
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def rollout_image_args(config: dict[str, Any]) -> list[str]:
    """Flags of `posttrain_rollout serve` for a normalised RL config (snake_case, as spec_to_config gives)."""
    rollout, policy = _section(config, "rollout"), _section(config, "rollout", "policy_config")
    args: list[str] = []
    per_step = _first(policy.get("max_images_per_step"), rollout.get("max_images_per_step"))
    per_message = _first(
        _section(config, "model").get("max_images_per_message"),
        _section(config, "training").get("max_images_per_message"),
    )
    if per_step:
        args += ["--max-images-per-step", str(int(per_step))]
    if per_message:
        args += ["--max-images-per-message", str(int(per_message))]
    if _first(policy.get("image_only_mode"), rollout.get("image_only_mode")):
        args.append("--image-only-mode")
    limit = _section(config, "vllm").get("limit_mm_per_prompt")
    if limit:
        args += ["--limit-mm-per-prompt", json.dumps(limit, sort_keys=True)]
    return args


def rollout_server_args(config: dict[str, Any]) -> list[str]:
    """Every flag of the policy's `posttrain_rollout serve` a normalised RL config sets: the image limits
    (applied before vLLM sees a request), [vllm].tool_call_parser and the job's seed (sampling_seed)."""
    from posttrain.api.sampling_seed import seed_args

    parser = _section(config, "vllm").get("tool_call_parser")
    return [*rollout_image_args(config), *(["--tool-call-parser", str(parser)] if parser else []),
            *seed_args(config)]  # fmt: skip
