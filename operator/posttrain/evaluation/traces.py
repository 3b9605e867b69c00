"""Evaluation traces: one row per episode, from a task app's rollout response (pure), written as JSONL and,
optionally, a synth v3 trace database (posttrain.api.synth_traces).

A row is what `posttrain filter` reads (ReST-EM's offline loop: eval -> filter -> SFT): `messages` (the
prompt's messages and the model's answer as an assistant turn), `reward`, `metadata` {seed, task_split,
task_id, model, run_id, sample, created_at}; plus `prompt` and `completion` as text, `steps` (each step's
reward, done flag and info, observation and tool calls), the task app's `metrics`, and `error` for a failed
rollout (reward null). Prompt and completion are read from the synth contract's fields: the first step's
`obs.messages` / `obs.prompt` / `obs.question`, the last step's `info.response`, its tool calls' arguments, or
the trajectory's `final`."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

MAX_TEXT = 100_000  # characters kept of a prompt or completion (bounded: a task app's text is untrusted)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if isinstance(value, list):  # OpenAI content parts
        parts = [p.get("text", "") for p in value if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "".join(parts)[:MAX_TEXT] if parts else json.dumps(value)[:MAX_TEXT]
    return json.dumps(value, default=str)[:MAX_TEXT]


def prompt_messages(step: dict[str, Any]) -> list[dict[str, Any]]:
    obs = step.get("obs") if isinstance(step.get("obs"), dict) else {}
    messages = obs.get("messages")
    if isinstance(messages, list) and all(isinstance(m, dict) and m.get("role") for m in messages):
        return [{"role": m["role"], "content": _text(m.get("content")) or ""} for m in messages]
    for key in ("prompt", "question", "text", "observation"):
        if obs.get(key) is not None:
            return [{"role": "user", "content": _text(obs[key]) or ""}]
    return []


def completion_text(trajectory: dict[str, Any]) -> str | None:
    steps = [s for s in trajectory.get("steps") or [] if isinstance(s, dict)]
    last = steps[-1] if steps else {}
    info = last.get("info") if isinstance(last.get("info"), dict) else {}
    for key in ("response", "completion", "answer", "text"):
        if isinstance(info.get(key), str):
            return info[key][:MAX_TEXT]
    calls = last.get("tool_calls")
    if isinstance(calls, list) and calls:
        return _text(calls if len(calls) > 1 else calls[0].get("args", calls[0]))
    final = trajectory.get("final")
    return _text(final) if final is not None else None


def _steps(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for step in trajectory.get("steps") or []:
        if isinstance(step, dict):
            out.append({k: step.get(k) for k in ("reward", "done", "truncated", "info", "obs", "tool_calls")
                        if k in step})  # fmt: skip
    return out


def rows_from_response(
    response: dict[str, Any], *, seed: int, split: str | None, model: str, sample: int = 0,
    task_id: str | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """One trace row per trajectory of a rollout response (a response with n choices has n)."""
    metrics = response.get("metrics") if isinstance(response.get("metrics"), dict) else {}
    returns = metrics.get("episode_returns") if isinstance(metrics.get("episode_returns"), list) else []
    trajectories = [t for t in response.get("trajectories") or [] if isinstance(t, dict)] or [{}]
    created = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = []
    for index, trajectory in enumerate(trajectories):
        reward = returns[index] if index < len(returns) else metrics.get("mean_return")
        steps = _steps(trajectory)
        messages = prompt_messages(steps[0]) if steps else []
        completion = completion_text(trajectory)
        if completion is not None:
            messages = messages + [{"role": "assistant", "content": completion}]
        rows.append({
            "seed": seed,
            "sample": sample * len(trajectories) + index,
            "reward": float(reward) if isinstance(reward, int | float) else None,
            "prompt": next((m["content"] for m in reversed(messages[:-1] if completion is not None else messages)
                            if m["role"] == "user"), None),
            "completion": completion,
            "messages": messages,
            "steps": steps,
            "metrics": metrics,
            "metadata": {"seed": seed, "task_split": split, "task_id": task_id, "model": model,
                         "run_id": response.get("run_id"), "sample": sample * len(trajectories) + index,
                         "created_at": created},
        })  # fmt: skip
    return rows


def error_row(*, seed: int, split: str | None, model: str, sample: int, error: str) -> dict[str, Any]:
    return {"seed": seed, "sample": sample, "reward": None, "error": error[:2000],
            "metadata": {"seed": seed, "task_split": split, "model": model, "sample": sample}}  # fmt: skip


class TraceWriter:
    """Appends rows to a JSONL file as they come and, with sqlite_path, to a synth v3 trace database
    (posttrain.api.synth_traces: the tables synth's task apps and `synth-ai eval --trace-db` write, which
    `posttrain filter` and `synth-ai filter` read). A row's task app trace (row["trace"]) goes only there."""

    def __init__(self, jsonl_path: Path, sqlite_path: Path | None = None, *, env_name: str | None = None,
                 policy_name: str | None = None):  # fmt: skip
        from posttrain.api.synth_traces import SynthTraceWriter

        jsonl_path.parent.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = jsonl_path
        self._jsonl = jsonl_path.open("w", encoding="utf-8")
        self._db = SynthTraceWriter(sqlite_path) if sqlite_path is not None else None
        self._names = {"env_name": env_name, "policy_name": policy_name}

    def write(self, row: dict[str, Any]) -> None:
        self._jsonl.write(json.dumps({k: v for k, v in row.items() if k != "trace"}, ensure_ascii=False,
                                     default=str) + "\n")  # fmt: skip
        self._jsonl.flush()
        if self._db is not None:
            self._db.add(row, **self._names)

    def close(self) -> None:
        self._jsonl.close()
        if self._db is not None:
            self._db.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
