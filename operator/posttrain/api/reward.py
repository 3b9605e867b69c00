"""The reward of one RL episode: synth's weighted blend of the task app's return with the
judge's (or the task app's own) outcome and event scores. The trainer computes it; it lives here, beside the
[judge]/[rubric] sections its weights come from, so that the formula has one home."""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_WEIGHTS = {"env": 1.0, "event": 0.0, "outcome": 0.0}


def blend_reward(
    env_return: float,
    outcome_score: float | None = None,
    event_scores: float | Sequence[float] | None = None,
    weights: dict[str, float] | None = None,
) -> float:
    """total = env * env_return + event * sum(event_scores) + outcome * outcome_score; a missing score
    counts 0, and the weights default to {env: 1, event: 0, outcome: 0}."""
    w = {**DEFAULT_WEIGHTS, **(weights or {})}
    if isinstance(event_scores, (list, tuple)):
        events = float(sum(float(x) for x in event_scores if x is not None))
    else:
        events = float(event_scores or 0.0)
    return w["env"] * float(env_return) + w["event"] * events + w["outcome"] * float(outcome_score or 0.0)
