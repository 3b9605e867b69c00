"""LLM-judge scores for the RL reward (synth semantics: the trainer side, not the task app, calls the judge).

The job's typed judge settings (posttrain.api.judge_settings.JudgeSettings, `job.settings.judge`) say whether
a judge is called: [judge] not disabled, [judge.options] provider + model, and a reward blend ([judge]
reward_blend, or [rubric] enabled with [rubric.weights]) giving the outcome or event score a non-zero weight
whose [judge.options] switch is not off. Then every training rollout's episode is scored by
posttrain_trainer.judge_client.JudgeClient:
  - a self-hosted judge (provider "self-hosted"/"vllm"): the job file's endpoints.judges["judge"] (the
    operator's judge Service) or [judge.options].base_url;
  - an external provider (openai / groq / gemini) or a base_url: its OpenAI-compatible API with the key
    from the variable [judge.options].api_key_env names. In a cluster the operator sets that name to
    POSTTRAIN_JUDGE_API_KEY, filled from the Secret the job names (spec.judge.apiKeySecretRef): a spec
    cannot make the trainer send another of its variables (S3 keys) to a URL it chose. Locally
    (`posttrain train --local`) it is the person's own environment (default <PROVIDER>_API_KEY).
The outcome is the trajectory's final state and last action, the events are its steps (observation, action,
reward); each is scored against its rubric: [judge.options].rubric_overrides.{outcome,event}, else the task
app's /task_info rubric (task_rubric.py). A judge score replaces the task app's outcome_score / events_score
for that rollout.

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

from posttrain.api.judge_settings import JudgeSettings
from posttrain.api.sections import is_self_hosted_judge

from posttrain_trainer.task_rubric import JudgeRubrics, judge_rubrics

MAX_FIELD_CHARS = 4000  # keep judge prompts bounded: long observations are cut


def judge_base_url(settings: JudgeSettings, endpoints: dict[str, str] | None) -> str:
    """Where the judge is: an explicit base_url, the operator's judge Service, else the provider's name."""
    provider = str(settings.provider).lower()
    if settings.base_url:
        return str(settings.base_url)
    if is_self_hosted_judge(provider):
        url = (endpoints or {}).get("judge") or next(iter((endpoints or {}).values()), None)
        if not url:
            raise ValueError(
                f"[judge.options].provider = {settings.provider!r} (self-hosted) but the job has no judge "
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
    settings: JudgeSettings
    rubrics: JudgeRubrics
    timeout_s: float
    stats: dict[str, int] = field(default_factory=lambda: {"judged": 0, "failed": 0})

    @classmethod
    def from_settings(
        cls,
        settings: JudgeSettings,
        endpoints: dict[str, str] | None = None,
        *,
        rubrics: JudgeRubrics | None = None,
        **client_kw: Any,
    ) -> EpisodeJudge | None:
        """The job's judge, or None when no judge is called (settings.enabled is false). `rubrics`: each
        judged score's rubric (task_rubric.judge_rubrics); by default the overrides alone."""
        if not settings.enabled:
            return None
        from posttrain_trainer.judge_client import JudgeClient

        client = JudgeClient.from_settings(
            settings, base_url=judge_base_url(settings, endpoints), **client_kw
        )
        if rubrics is None:
            rubrics = judge_rubrics(settings, task_url=None, headers={}, seed=0)
        return cls(client=client, settings=settings, rubrics=rubrics, timeout_s=client.timeout)

    def describe(self) -> str:
        """One line for the log: which judge, where, what it scores, against which rubric."""
        s = self.settings
        scored = " and ".join(("outcome" if k == "outcome" else "events") for k in s.judged())
        return (f"judge {s.provider}/{s.model} at {self.client.base_url} scores {scored} (blend "
                f"{s.blend()} from {s.weights_from}; rubric: " + ", ".join(
                    f"{k} from {v}" for k, v in self.rubrics.sources.items()) + ")")  # fmt: skip

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
                self.client.judge_episode(
                    self.rubrics.for_client(),
                    outcome=outcome,
                    events=events,
                    score_outcome=self.settings.outcome,
                    score_events=self.settings.event,
                ),
                timeout=self.timeout_s * 2,
            )
        except TimeoutError:
            return self._failed(f"no verdict within {self.timeout_s * 2:g} s")
        outcome_score = judged.get("outcome_score")
        event_scores = list(judged.get("event_scores") or [])
        if self.settings.outcome and outcome_score is None:
            return self._failed("no outcome score (timeout, HTTP error or an unreadable reply)")
        missing = sum(1 for s in event_scores if s is None)
        if self.settings.event and events and (missing or len(event_scores) != len(events)):
            return self._failed(
                f"{missing or len(events)} of {len(events)} events without a score "
                "(timeout, HTTP error or an unreadable reply)"
            )
        self.stats["judged"] += 1
        events_score = float(sum(event_scores)) if self.settings.event else None
        return JudgeVerdict(outcome_score=outcome_score, events_score=events_score)
