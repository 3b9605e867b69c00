"""ReST-EM filtering (Singh et al. 2023): keep the rollouts whose reward meets a threshold and turn them into
SFT JSONL. Pure functions; `posttrain filter` is the command around them.

Input rows (one JSON object per line), any of:
  {"messages": [...], "reward": 1.0, "metadata": {...}}                 (a conversation with its reward)
  {"prompt": "..." | [messages], "completion": "...", "reward": 1.0}    (single turn)
The reward is the first of: reward, total_reward, return, metadata.total_reward, metadata.reward,
metrics.outcome_score, metrics.mean_return. Filter fields read metadata.task_split / task_id / model /
judge_scores / created_at (also accepted at the top level).

Synth `synth-ai filter` semantics kept: min/max official score on the total reward (a row without a reward
fails a min threshold), splits / task_ids / models lists, min/max judge scores by name, created_at window,
limit; one output record per user turn {"messages": [system?, ...the conversation before it..., user,
assistant], "metadata": {...}} (synth writes [system?, user, assistant] and so drops the earlier turns; the
history is kept here so that a later answer is trained in the context it was given in); the
assistant content is the tool-call payload when there is one, else its text, else "[no response recorded]";
multimodal user content is kept; no match is an error and no file is written."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NO_RESPONSE = "[no response recorded]"
VARIETY = "restem"  # [algorithm] variety of a ReST-EM job (synth has no spelling for it)
METADATA_KEYS = (
    "session_id",
    "run_id",
    "env_name",
    "policy_name",
    "seed",
    "total_reward",
    "achievements_count",
    "model",
    "created_at",
    "task_id",
    "task_split",
)


class FilterError(ValueError):
    """A problem with the input (the message names the line) or the filter itself."""

    def __init__(self, message: str, line: int | None = None, field: str | None = None):
        super().__init__(message)
        self.line = line
        self.field = field


@dataclass
class FilterSpec:
    min_reward: float | None = 1.0
    max_reward: float | None = None
    splits: list[str] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    min_judge_scores: dict[str, float] = field(default_factory=dict)
    max_judge_scores: dict[str, float] = field(default_factory=dict)
    min_created_at: str | None = None
    max_created_at: str | None = None
    limit: int | None = None
    per_turn: bool = True  # synth: one record per user turn; False keeps the whole conversation

    def check(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise FilterError("limit must be at least 1", field="limit")
        if self.min_reward is not None and self.max_reward is not None and self.min_reward > self.max_reward:
            raise FilterError("min reward is above max reward", field="min_reward")
        for name in ("min_created_at", "max_created_at"):
            value = getattr(self, name)
            if value is not None:
                _parse_time(value, name)


def is_restem(config: dict[str, Any]) -> bool:
    """Whether a normalised job config asks for ReST-EM (`[algorithm] variety = "restem"`); the job itself
    runs in restem_job.py."""
    algorithm = config.get("algorithm") if isinstance(config.get("algorithm"), dict) else {}
    return str(algorithm.get("variety") or "").lower() == VARIETY


def _parse_time(value: Any, name: str = "created_at") -> datetime.datetime:
    if isinstance(value, (int, float)):
        return datetime.datetime.fromtimestamp(float(value), datetime.UTC)
    try:
        parsed = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise FilterError(f"{name} {value!r} is not an ISO time", field=name) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def _get(row: dict[str, Any], key: str) -> Any:
    metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    return metadata.get(key, row.get(key))


def row_reward(row: dict[str, Any]) -> float | None:
    metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
    for value in (
        row.get("reward"),
        row.get("total_reward"),
        row.get("return"),
        metadata.get("total_reward"),
        metadata.get("reward"),
        metrics.get("outcome_score"),
        metrics.get("mean_return"),
    ):
        if isinstance(value, bool):
            return float(value)
        if isinstance(value, (int, float)):
            return float(value)
    return None


def matches(row: dict[str, Any], spec: FilterSpec) -> bool:
    reward = row_reward(row)
    if spec.min_reward is not None and (reward is None or reward < spec.min_reward):
        return False
    if spec.max_reward is not None and (reward is None or reward > spec.max_reward):
        return False
    for values, key in ((spec.splits, "task_split"), (spec.task_ids, "task_id"), (spec.models, "model")):
        if values and str(_get(row, key)) not in {str(v) for v in values}:
            return False
    judges = _get(row, "judge_scores") or {}
    for name, low in spec.min_judge_scores.items():
        score = judges.get(name) if isinstance(judges, dict) else None
        if not isinstance(score, (int, float)) or score < low:
            return False
    for name, high in spec.max_judge_scores.items():
        score = judges.get(name) if isinstance(judges, dict) else None
        if not isinstance(score, (int, float)) or score > high:
            return False
    if spec.min_created_at or spec.max_created_at:
        created = _get(row, "created_at")
        if created is None:
            return False
        when = _parse_time(created)
        if spec.min_created_at and when < _parse_time(spec.min_created_at):
            return False
        if spec.max_created_at and when > _parse_time(spec.max_created_at):
            return False
    return True


def _assistant_message(message: dict[str, Any] | None) -> dict[str, Any]:
    if message is None:
        return {"role": "assistant", "content": NO_RESPONSE}
    tool_calls = message.get("tool_calls")
    if tool_calls:
        return {"role": "assistant", "content": json.dumps(tool_calls, ensure_ascii=False)}
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return {"role": "assistant", "content": content if content else NO_RESPONSE}


def _conversation(row: dict[str, Any], line: int) -> list[dict[str, Any]]:
    messages = row.get("messages")
    if messages is None:
        prompt, completion = (
            row.get("prompt", _get(row, "prompt")),
            row.get("completion", _get(row, "completion")),
        )
        if prompt is None:
            raise FilterError("row has neither messages nor prompt/completion", line=line)
        messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        messages.append({"role": "assistant", "content": completion})
    if not isinstance(messages, list) or not all(isinstance(m, dict) and m.get("role") for m in messages):
        raise FilterError("messages must be a list of objects with a role", line=line)
    return messages


def _metadata(row: dict[str, Any]) -> dict[str, Any]:
    out = {key: _get(row, key) for key in METADATA_KEYS if _get(row, key) is not None}
    reward = row_reward(row)
    if reward is not None:
        out["total_reward"] = reward
    return out


def to_sft_records(row: dict[str, Any], line: int, *, per_turn: bool = True) -> list[dict[str, Any]]:
    """One record per user turn (the conversation up to it, then its answer), or the whole conversation."""
    messages = _conversation(row, line)
    metadata = _metadata(row)
    system = next((m for m in messages if m["role"] == "system"), None)
    if not per_turn:
        convo = [m if m["role"] != "assistant" else _assistant_message(m) for m in messages]
        if not any(m["role"] == "assistant" for m in convo):
            convo.append(_assistant_message(None))
        return [{"messages": convo, "metadata": metadata}]
    records = []
    for index, message in enumerate(messages):
        if message["role"] != "user":
            continue
        reply_at = None
        for later in range(index + 1, len(messages)):
            if messages[later]["role"] == "user":
                break
            if messages[later]["role"] == "assistant":
                reply_at = later
                break
        # The turn with everything said before it: earlier user turns, earlier answers (as the model gave
        # them) and tool results, so a multi-turn episode trains each answer in its real context.
        history = [dict(m) if m["role"] != "assistant" else _assistant_message(m) for m in messages[:index]]
        if system is not None and not any(m["role"] == "system" for m in history):
            history.insert(0, dict(system))
        reply = messages[reply_at] if reply_at is not None else None
        tools = [dict(m) for m in messages[index + 1 : reply_at] if m["role"] not in ("user", "assistant")]
        convo = history + [dict(message), *tools, _assistant_message(reply)]
        records.append({"messages": convo, "metadata": {**metadata, "turn": len(records)}})
    return records


def parse_rows(lines: Iterable[tuple[int, str]]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, text) -> (line number, row object); FilterError naming the line otherwise."""
    for number, raw in lines:
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as err:
            raise FilterError(f"not valid JSON ({err.msg})", line=number) from None
        if not isinstance(row, dict):
            raise FilterError("each line must be a JSON object", line=number)
        yield number, row


def read_rows(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    path = Path(path)
    if not path.exists():
        raise FilterError(f"{path} does not exist", field="input")
    with path.open(encoding="utf-8") as handle:
        yield from parse_rows(enumerate(handle, start=1))


@dataclass
class FilterStats:
    rows: int = 0
    kept_rows: int = 0
    records: int = 0


def filter_rollouts(
    rows: Iterable[tuple[int, dict[str, Any]]], spec: FilterSpec
) -> tuple[list[dict[str, Any]], FilterStats]:
    spec.check()
    stats = FilterStats()
    records: list[dict[str, Any]] = []
    for line, row in rows:
        stats.rows += 1
        if not matches(row, spec):
            continue
        new = to_sft_records(row, line, per_turn=spec.per_turn)
        if not new:
            continue
        stats.kept_rows += 1
        records.extend(new)
        if spec.limit is not None and len(records) >= spec.limit:
            records = records[: spec.limit]
            break
    stats.records = len(records)
    return records, stats


def write_jsonl(records: list[dict[str, Any]], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path
