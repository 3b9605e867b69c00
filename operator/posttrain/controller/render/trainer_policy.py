"""Pure: how the trainer Job treats a lost or failed pod.

- A pod that was disrupted (preempted, evicted, drained: the pod condition DisruptionTarget) is ignored:
  it does not count against the backoff limit, and the replacement pod resumes from the last checkpoint.
- A pod that exits with one of the trainer's configuration-error codes fails the Job at once: retrying the
  same job file cannot help.
- A pod that exits 75 stopped for a SIGTERM after saving a checkpoint (its pod was deleted: preemption, a
  drain): ignored too, its replacement resumes.
- Any other failure is retried, `retries` times per node (a multi-node failure usually takes every node's
  pod down together).
- A replacement pod is made only once the old one has fully terminated (podReplacementPolicy: Failed), so
  two pods of one index never hold the same GPUs or write the same checkpoint.

The exit codes are the trainer's, from posttrain.api.exitcodes."""

from __future__ import annotations

from typing import Any

from posttrain.api.exitcodes import CONFIG_ERROR_EXIT_CODES, EXIT_PREEMPTED


def pod_failure_policy(container: str) -> dict[str, Any]:
    return {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": container,
                    "operator": "In",
                    "values": list(CONFIG_ERROR_EXIT_CODES),
                },
            },
            {
                "action": "Ignore",
                "onExitCodes": {"containerName": container, "operator": "In", "values": [EXIT_PREEMPTED]},
            },
        ]
    }


def failure_handling(container: str, *, retries: int, nodes: int) -> dict[str, Any]:
    """The Job spec fields that implement the rules above."""
    return {
        "backoffLimit": max(0, retries) * max(1, nodes),
        "podFailurePolicy": pod_failure_policy(container),
        "podReplacementPolicy": "Failed",
    }
