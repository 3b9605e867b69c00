"""A client for a synth-contract task app: GET /health, /task_info, POST /rollout, with the credentials sent
the way synth's clients send them (X-API-Key, X-API-Keys with aliases, Authorization: Bearer).

Used by `posttrain verify-task-app`, the local runner, the demo's evaluation and the operator's TaskApp
verification. Every failure is a TaskAppError with a `kind` a caller can act on:
unreachable | unauthorised | unconfigured | http | bad_response."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx


class TaskAppError(Exception):
    def __init__(self, kind: str, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.code = code

    def __str__(self) -> str:
        return self.args[0]


def auth_headers(api_key: str | None, aliases: list[str] | None = None) -> dict[str, str]:
    if not api_key:
        return {}
    keys = [api_key, *[a for a in (aliases or []) if a and a != api_key]]
    return {"X-API-Key": api_key, "X-API-Keys": ",".join(keys), "Authorization": f"Bearer {api_key}"}


def _error_code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, dict) and isinstance(detail.get("error"), dict):
        return detail["error"].get("code")
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"].get("code")
    return None


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
        detail = body.get("detail") if isinstance(body, dict) else None
        if isinstance(detail, dict) and isinstance(detail.get("error"), dict):
            return str(detail["error"].get("message") or "")
        if isinstance(detail, str):
            return detail
    except ValueError:
        pass
    return response.text[:300]


@dataclass
class TaskAppClient:
    base_url: str
    api_key: str | None = None
    aliases: list[str] = field(default_factory=list)
    timeout: float = 10.0
    rollout_timeout: float = 600.0

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")
        self._http = httpx.Client(timeout=self.timeout, headers=auth_headers(self.api_key, self.aliases))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TaskAppClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        url = f"{self.base_url}{path}"
        try:
            response = self._http.request(method, url, **kwargs)
        except httpx.TimeoutException as exc:
            raise TaskAppError("unreachable", f"{method} {url} timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise TaskAppError("unreachable", f"{method} {url} failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            code = _error_code(response)
            message = _error_message(response)
            if code == "missing_environment_api_key" or response.status_code == 503 and code is None:
                kind = "unconfigured"
            elif code == "unauthorised" or response.status_code in (401, 403):
                kind = "unauthorised"
            else:
                kind = "http"
            raise TaskAppError(
                kind,
                f"{method} {path} -> HTTP {response.status_code}{f' {code}' if code else ''}: {message}",
                status=response.status_code,
                code=code,
            )
        try:
            return response.json()
        except ValueError as exc:
            raise TaskAppError(
                "bad_response", f"{method} {path} returned non-JSON: {response.text[:200]}"
            ) from exc

    def root(self) -> Any:
        return self._request("GET", "/")

    def health(self) -> dict[str, Any]:
        body = self._request("GET", "/health")
        if not isinstance(body, dict):
            raise TaskAppError("bad_response", f"/health returned {type(body).__name__}, expected an object")
        if body.get("healthy") is False:
            raise TaskAppError("bad_response", f"/health says healthy=false: {body}")
        return body

    def task_info(self, seeds: list[int] | None = None) -> Any:
        params = [("seed", s) for s in seeds] if seeds else None
        body = self._request("GET", "/task_info", params=params)
        if seeds is None:
            if not isinstance(body, dict) or "taskset" not in body:
                raise TaskAppError("bad_response", "/task_info without seeds must return {'taskset': ...}")
        elif len(seeds) > 1 and not isinstance(body, list):
            raise TaskAppError("bad_response", "/task_info with several seeds must return a list")
        return body

    def info(self) -> Any:
        return self._request("GET", "/info")

    def rollout(self, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        body = self._request("POST", "/rollout", json=request, timeout=timeout or self.rollout_timeout)
        problems = check_rollout_response(body, require_cid=request.get("mode") == "rl")
        if problems:
            raise TaskAppError("bad_response", "/rollout response: " + "; ".join(problems))
        return body


def rollout_request(
    *,
    seed: int,
    inference_url: str,
    model: str,
    env_name: str = "default",
    policy_name: str = "policy",
    mode: str = "rl",
    env_config: dict[str, Any] | None = None,
    policy_config: dict[str, Any] | None = None,
    run_id: str | None = None,
    max_turns: int = 1,
) -> dict[str, Any]:
    """A synth RolloutRequest. `inference_url` should already carry `?cid=`."""
    return {
        "run_id": run_id or f"run-{uuid.uuid4().hex[:12]}",
        "mode": mode,
        "env": {"env_name": env_name, "seed": seed, "config": dict(env_config or {})},
        "policy": {
            "policy_name": policy_name,
            "config": {**(policy_config or {}), "model": model, "inference_url": inference_url},
        },
        "ops": ["agent", "env"] * max(1, max_turns),
        "record": {"trajectories": True, "logprobs": False, "value": False, "return_trace": False},
        "on_done": "reset",
        "safety": {"max_ops": 100000, "max_time_s": 3600.0},
    }


def check_rollout_response(body: Any, *, require_cid: bool = True) -> list[str]:
    """What is missing from a RolloutResponse for RL (synth's validate_rollout_response_for_rl, plus metrics)."""
    problems: list[str] = []
    if not isinstance(body, dict):
        return [f"expected an object, got {type(body).__name__}"]
    metrics = body.get("metrics")
    if not isinstance(metrics, dict):
        problems.append("metrics missing")
    else:
        if not isinstance(metrics.get("episode_returns"), list):
            problems.append("metrics.episode_returns missing")
        if not isinstance(metrics.get("mean_return"), int | float):
            problems.append("metrics.mean_return missing")
    trajectories = body.get("trajectories")
    if not isinstance(trajectories, list):
        problems.append("trajectories missing")
        trajectories = []
    pipeline = body.get("pipeline_metadata") or {}
    if require_cid:
        url = pipeline.get("inference_url") if isinstance(pipeline, dict) else None
        if not url or "cid=" not in url:
            problems.append("pipeline_metadata.inference_url with ?cid= missing")
        for t, trajectory in enumerate(trajectories):
            if not isinstance(trajectory, dict):
                problems.append(f"trajectories[{t}] is not an object")
                continue
            if not trajectory.get("inference_url"):
                problems.append(f"trajectories[{t}].inference_url missing")
            for s, step in enumerate(trajectory.get("steps") or []):
                meta = ((step or {}).get("info") or {}).get("meta") or {}
                if not meta.get("inference_url"):
                    problems.append(f"trajectories[{t}].steps[{s}].info.meta.inference_url missing")
    return problems


@dataclass
class Check:
    name: str
    ok: bool | None  # None = skipped
    detail: str
    kind: str | None = None  # TaskAppError.kind on failure

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else ("SKIP" if self.ok is None else "FAIL")


def _fix_hint(error: TaskAppError, key_env: str) -> str:
    if error.kind == "unreachable":
        return " (is the task app running, and is the URL right?)"
    if error.kind == "unauthorised":
        return f" (the task app rejected the key: compare {key_env} here and in the task app)"
    if error.kind == "unconfigured":
        return " (set ENVIRONMENT_API_KEY in the task app's environment)"
    return ""


def verify(
    client: TaskAppClient,
    *,
    key_env: str = "ENVIRONMENT_API_KEY",
    seeds: list[int] | None = None,
    rollout: dict[str, Any] | None = None,
) -> list[Check]:
    """Health, task_info (taskset + seeds), then one rollout when `rollout` (a RolloutRequest) is given.
    A failed check makes the later ones SKIP. The operator's TaskApp verification calls this without a
    rollout."""
    checks: list[Check] = []
    seeds = list(range(10)) if seeds is None else seeds

    def failed(name: str, error: TaskAppError) -> None:
        checks.append(Check(name, False, f"{error}{_fix_hint(error, key_env)}", error.kind))

    try:
        body = client.health()
        checks.append(Check("health", True, f"healthy ({', '.join(sorted(body))})"))
    except TaskAppError as error:
        failed("health", error)
    if checks[-1].ok:
        try:
            taskset = client.task_info()["taskset"]
            infos = client.task_info(seeds) if seeds else []
            infos = infos if isinstance(infos, list) else [infos]
            rubric = (taskset.get("rubric") or {}) if isinstance(taskset, dict) else {}
            if not rubric and infos and isinstance(infos[0], dict):
                rubric = infos[0].get("rubric") or {}
            criteria = ((rubric.get("outcome") or {}).get("criteria")) or []
            name = taskset.get("name") or taskset.get("id") if isinstance(taskset, dict) else taskset
            detail = (
                f"taskset {name!r}; {len(infos)} seeds resolve; rubric with {len(criteria)} outcome criteria"
            )
            checks.append(Check("task_info", True, detail))
        except TaskAppError as error:
            failed("task_info", error)
    else:
        checks.append(Check("task_info", None, "skipped (health failed)"))
    if rollout is None:
        return checks
    if not checks[-1].ok:
        checks.append(Check("rollout", None, "skipped (an earlier check failed)"))
        return checks
    try:
        body = client.rollout(rollout)
        metrics = body["metrics"]
        checks.append(
            Check(
                "rollout",
                True,
                f"seed {rollout['env'].get('seed')}: {len(body.get('trajectories') or [])} trajectory(ies), "
                f"mean_return {metrics['mean_return']}, cid kept in pipeline_metadata",
            )
        )
    except TaskAppError as error:
        failed("rollout", error)
    return checks
