"""LLM-judge scores for the RL reward (synth semantics: the trainer side, not the task app, calls the judge).

When [judge] is configured (options.provider + options.model; not disabled) and rubric scoring gives the
outcome or event score a non-zero weight, every training rollout's episode is scored by
posttrain_rollout.judge.JudgeClient:
  - a self-hosted judge (provider "self-hosted"/"vllm"): the job file's endpoints.judges["judge"] (the
    operator's judge Service) or [judge.options].base_url;
  - an external provider (openai / groq / gemini) or a base_url: its OpenAI-compatible API with the key
    from the variable [judge.options].api_key_env names. In a cluster the operator sets that name to
    POSTTRAIN_JUDGE_API_KEY, filled from the Secret the job names (spec.judge.apiKeySecretRef): a spec
    cannot make the trainer send another of its variables (S3 keys) to a URL it chose. Locally
    (`posttrain train --local`) it is the person's own environment (default <PROVIDER>_API_KEY).
The outcome is the trajectory's final state and last action, the events are its steps (observation, action,
reward); rubrics come from [judge.options].rubric_overrides.{outcome,event}. A judge score replaces the task
app's outcome_score / events_score for that rollout.

A judge failure is never replaced by the task app's score: that would put two reward scales in one group.
The rule: a rollout the judge did not fully score (no outcome score where the outcome is judged, any event
without a score where events are judged, a timeout, a rollout without a trajectory) is a failed rollout. It
leaves its group (the group's advantages are computed over the members the judge scored, as for any failed
rollout), it counts in the iteration's `judge_failed` metric and progress, and it counts against
rollout.error_budget, so a judge that stays down ends the job with a message instead of training on
nothing. A slow judge never stalls an iteration: each episode is bounded by twice the judge's timeout."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from posttrain.api.sections import is_self_hosted_judge

MAX_FIELD_CHARS = 4000  # keep judge prompts bounded: long observations are cut


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def judge_options(config: dict[str, Any], weights: dict[str, float]) -> dict[str, Any] | None:
    """[judge.options] (with judge.timeout_s migrated in, as synth does) when the judge must be called."""
    judge = _section(config, "judge")
    if not judge or judge.get("enabled") is False:
        return None
    options = dict(_section(judge, "options"))
    if not options.get("provider") or not options.get("model"):
        return None  # synth: an incomplete [judge.options] means no judge
    if judge.get("timeout_s") and not options.get("timeout_s"):
        options["timeout_s"] = judge["timeout_s"]
    wants_outcome = weights.get("outcome", 0.0) > 0 and options.get("outcome", True) is not False
    wants_events = weights.get("event", 0.0) > 0 and options.get("event", True) is not False
    if not (wants_outcome or wants_events):
        return None
    options["outcome"] = wants_outcome
    options["event"] = wants_events
    return options


def judge_base_url(options: dict[str, Any], endpoints: dict[str, str] | None) -> str:
    """Where the judge is: an explicit base_url, the operator's judge Service, else the provider's name."""
    provider = str(options["provider"]).lower()
    if options.get("base_url"):
        return str(options["base_url"])
    if is_self_hosted_judge(provider):
        url = (endpoints or {}).get("judge") or next(iter((endpoints or {}).values()), None)
        if not url:
            raise ValueError(
                f"[judge.options].provider = {options['provider']!r} (self-hosted) but the job has no judge "
                "endpoint: set [judge.options].base_url or let the operator deploy the judge"
            )
        return str(url)
    return provider


def _cut(value: Any) -> Any:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_FIELD_CHARS else text[:MAX_FIELD_CHARS] + " ...(cut)"


def episode_for_judge(response: dict[str, Any]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """A /rollout response -> (outcome, events) as the judge sees them (first trajectory)."""
    trajectories = response.get("trajectories") or []
    if not trajectories:
        return None, []
    trajectory = trajectories[0]
    steps = trajectory.get("steps") or []
    events = [
        {
            "observation": _cut(step.get("obs")),
            "action": _cut(step.get("tool_calls")),
            "reward": step.get("reward"),
            "done": step.get("done"),
        }
        for step in steps
    ]
    outcome = {
        "final": _cut(trajectory.get("final")),
        "last_action": events[-1]["action"] if events else None,
        "steps": len(steps),
    }
    return outcome, events


@dataclass
class JudgeVerdict:
    """The judge's scores for one episode; `failure` says why it could not score it (then the rollout fails)."""

    outcome_score: float | None = None
    events_score: float | None = None
    failure: str | None = None


@dataclass
class EpisodeJudge:
    """The configured judge for one job: scores episodes, keeps counts for the iteration stats."""

    client: Any
    options: dict[str, Any]
    timeout_s: float
    stats: dict[str, int] = field(default_factory=lambda: {"judged": 0, "failed": 0})

    @classmethod
    def from_config(
        cls, config: dict[str, Any], weights: dict[str, float], endpoints: dict[str, str] | None = None
    ) -> EpisodeJudge | None:
        options = judge_options(config, weights)
        if options is None:
            return None
        from posttrain_rollout.judge import JudgeClient

        client = JudgeClient.from_options(options, base_url=judge_base_url(options, endpoints))
        return cls(client=client, options=options, timeout_s=client.timeout)

    def _failed(self, reason: str) -> JudgeVerdict:
        self.stats["failed"] += 1
        return JudgeVerdict(failure=reason)

    async def score(self, response: dict[str, Any]) -> JudgeVerdict:
        """The judged outcome score and events score (sum of event scores), or the reason it failed."""
        outcome, events = episode_for_judge(response)
        if outcome is None:
            return self._failed("the rollout has no trajectory to judge")
        try:
            # the client bounds each call; this bounds the whole episode (events queue on its semaphore)
            judged = await asyncio.wait_for(
                self.client.judge_episode(self.options, outcome=outcome, events=events),
                timeout=self.timeout_s * 2,
            )
        except TimeoutError:
            return self._failed(f"no verdict within {self.timeout_s * 2:g} s")
        outcome_score = judged.get("outcome_score")
        event_scores = list(judged.get("event_scores") or [])
        if self.options.get("outcome") and outcome_score is None:
            return self._failed("no outcome score (timeout, HTTP error or an unreadable reply)")
        missing = sum(1 for s in event_scores if s is None)
        if self.options.get("event") and events and (missing or len(event_scores) != len(events)):
            return self._failed(
                f"{missing or len(events)} of {len(events)} events without a score "
                "(timeout, HTTP error or an unreadable reply)"
            )
        self.stats["judged"] += 1
        events_score = float(sum(event_scores)) if self.options.get("event") else None
        return JudgeVerdict(outcome_score=outcome_score, events_score=events_score)
