"""What the trainers that sample from the policy share (GSPO/DAPO in rl.py, ReST-EM in restem_job.py): the
seeds of an iteration, waiting for the rollout servers, the job file's endpoints they need, and an
evaluation (its rollouts and its record). Both import it; neither imports the other."""

from __future__ import annotations

import math
import time
from typing import Any

from posttrain.api.jobfile import JobFile

from posttrain_trainer import distributed as D
from posttrain_trainer.rollouts import RolloutClient, RolloutLoop, RolloutResult, wait_for_servers


def iteration_seeds(iteration: int, batch_size: int, seed_start: int = 0) -> list[int]:
    """The task seeds of an iteration: data.seed_start + iteration x batch_size + j."""
    return [seed_start + iteration * batch_size + j for j in range(batch_size)]


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def std(values: list[float]) -> float | None:
    """Population standard deviation (the spread of one step's rewards)."""
    center = mean(values)
    return math.sqrt(sum((v - center) ** 2 for v in values) / len(values)) if center is not None else None


def evaluation_record(at: int, results: list[RolloutResult], seconds: float | None = None) -> dict[str, Any]:
    """The "evaluation" event and metrics line of one evaluation: mean reward of the rollouts that ran, and
    how long they took (the demo's phase table reads it)."""
    ok = [r.reward for r in results if r.ok]
    record = {
        "step": at,
        "eval_score": mean(ok),
        "eval_rollouts": len(results),
        "eval_failed": len(results) - len(ok),
    }
    if seconds is not None:
        record["eval_seconds"] = round(seconds, 3)
    return record


def wait_until_serving(job: JobFile) -> None:
    """Block until the job's rollout servers answer /health (rollouts.wait_for_servers); say so if it took a while."""
    urls = [*job.endpoints.policy, *([job.endpoints.reference] if job.endpoints.reference else [])]
    waited = wait_for_servers(urls)
    if waited >= 1.0 and D.is_main():
        print(
            f"[posttrain] rollout servers ready after {waited:.1f} s (the model was loaded meanwhile)",
            flush=True,
        )


def require_rollout_endpoints(job: JobFile, error: type[Exception], article_and_kind: str) -> None:
    """A job that samples needs the task app and the policy's rollout servers in its job file."""
    if job.task_app is None:
        raise error(f"{article_and_kind} job file needs task_app.url")
    if not job.endpoints.policy:
        raise error(f"{article_and_kind} job file needs endpoints.policy (the rollout servers)")


def run_evaluation(
    loop: RolloutLoop,
    client: RolloutClient,
    specs: list[Any],
    at: int,
    temperature: float,
    on_results: Any = None,
) -> dict[str, Any]:
    """Evaluation rollouts (mode eval, no tokens captured, the evaluation's temperature) -> their record;
    `on_results(results)` sees them first (the trace store)."""
    started = time.perf_counter()
    results = loop.collect(
        client, specs, mode="eval", want_tokens=False, policy_overrides={"temperature": temperature}
    )
    if on_results is not None:
        on_results(results)
    return evaluation_record(at, results, time.perf_counter() - started)
