"""synth's v3 trace database (what a synth task app served with TASKAPP_TRACING_ENABLED=1 writes, and what
`synth-ai eval --trace-db` writes): written by `posttrain eval --sqlite`, read by `posttrain filter`.

The tables and columns are those synth-ai 0.2.19's tracing_v3 creates (learned from its schema, written
here anew): session_traces(session_id, created_at, num_timesteps, num_events, num_messages, metadata JSON,
experiment_id, embedding), session_timesteps, events (event_type cais | environment | runtime, reward,
terminated, truncated, metadata JSON, ...), messages(message_type user | assistant | system | tool_use |
tool_result, content, timestamp, metadata JSON, ...), outcome_rewards(session_id, total_reward,
achievements_count, total_steps, created_at, reward_metadata), event_rewards(event_id, session_id,
message_id, turn_number, reward_value, reward_type, key, annotation, source, created_at), experiments.

A session's metadata carries what synth's filter selects on (task_split, task_id, model, judge_scores) and
what it reports (env_name, policy_name, seed), and synth's eval fields (eval_seed, official_score, prompt,
completion). A rollout whose task app returned its v3 trace (record.return_trace) is stored from that trace
(its timesteps, events and boundary messages); otherwise from the rollout's own conversation and steps
(one environment event and, where the step has a reward, one event_rewards row per step).

Reading (`read_sessions`) yields `posttrain filter`'s row shape ({"messages", "reward", "metadata"}), with
synth's filter semantics: the reward is outcome_rewards.total_reward (a session without one fails a min
score), messages in (timestamp, id) order, a message's JSON content unwrapped (`content`, `text`,
`payload.content`), an assistant's `tool_calls` kept. A session without message rows (synth 0.2.19's
Crafter app saves none) is read from its LM call records (the cais events' call_records: each call's input
messages and its answer, one row per call), else from metadata.prompt / metadata.completion. Everything in the file is untrusted and bounded as posttrain's own
trace store is (posttrain.api.traces.bounded)."""

from __future__ import annotations

import contextlib
import datetime
import json
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from posttrain.api.traces import MAX_MESSAGES, MAX_STEPS, bounded

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS experiments (experiment_id VARCHAR PRIMARY KEY, name VARCHAR NOT NULL,"
    " description TEXT, created_at DATETIME DEFAULT CURRENT_TIMESTAMP, updated_at DATETIME DEFAULT"
    " CURRENT_TIMESTAMP, configuration TEXT, metadata TEXT)",
    "CREATE TABLE IF NOT EXISTS session_traces (session_id VARCHAR PRIMARY KEY, created_at DATETIME NOT NULL,"
    " num_timesteps INTEGER NOT NULL, num_events INTEGER NOT NULL, num_messages INTEGER NOT NULL, metadata TEXT,"
    " experiment_id VARCHAR, embedding VECTOR, FOREIGN KEY(experiment_id) REFERENCES experiments(experiment_id))",
    "CREATE TABLE IF NOT EXISTS session_timesteps (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR NOT"
    " NULL, step_id VARCHAR NOT NULL, step_index INTEGER NOT NULL, turn_number INTEGER, started_at DATETIME,"
    " completed_at DATETIME, num_events INTEGER, num_messages INTEGER, step_metadata TEXT,"
    " UNIQUE(session_id, step_id), FOREIGN KEY(session_id) REFERENCES session_traces(session_id))",
    "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR NOT NULL,"
    " timestep_id INTEGER, event_type VARCHAR NOT NULL, system_instance_id VARCHAR, event_time FLOAT,"
    " message_time INTEGER, created_at DATETIME, model_name VARCHAR, provider VARCHAR, input_tokens INTEGER,"
    " output_tokens INTEGER, total_tokens INTEGER, cost_usd INTEGER, latency_ms INTEGER, span_id VARCHAR,"
    " trace_id VARCHAR, call_records TEXT, reward FLOAT, terminated BOOLEAN, truncated BOOLEAN,"
    " system_state_before TEXT, system_state_after TEXT, metadata TEXT, event_metadata TEXT, embedding VECTOR,"
    " CHECK (event_type IN ('cais', 'environment', 'runtime')),"
    " FOREIGN KEY(session_id) REFERENCES session_traces(session_id),"
    " FOREIGN KEY(timestep_id) REFERENCES session_timesteps(id))",
    "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR NOT NULL,"
    " timestep_id INTEGER, message_type VARCHAR NOT NULL, content TEXT NOT NULL, timestamp DATETIME,"
    " event_time FLOAT, message_time INTEGER, metadata TEXT, embedding VECTOR,"
    " CHECK (message_type IN ('user', 'assistant', 'system', 'tool_use', 'tool_result')),"
    " FOREIGN KEY(session_id) REFERENCES session_traces(session_id),"
    " FOREIGN KEY(timestep_id) REFERENCES session_timesteps(id))",
    "CREATE TABLE IF NOT EXISTS outcome_rewards (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR NOT"
    " NULL, total_reward INTEGER NOT NULL, achievements_count INTEGER NOT NULL, total_steps INTEGER NOT NULL,"
    " created_at DATETIME NOT NULL, reward_metadata TEXT,"
    " FOREIGN KEY(session_id) REFERENCES session_traces(session_id))",
    "CREATE TABLE IF NOT EXISTS event_rewards (id INTEGER PRIMARY KEY AUTOINCREMENT, event_id INTEGER NOT NULL,"
    " session_id VARCHAR NOT NULL, message_id INTEGER, turn_number INTEGER, reward_value FLOAT NOT NULL,"
    ' reward_type VARCHAR, "key" VARCHAR, annotation TEXT, source VARCHAR, created_at DATETIME NOT NULL,'
    " FOREIGN KEY(event_id) REFERENCES events(id), FOREIGN KEY(session_id) REFERENCES session_traces(session_id),"
    " FOREIGN KEY(message_id) REFERENCES messages(id))",
    "CREATE INDEX IF NOT EXISTS idx_session_created ON session_traces (created_at)",
    "CREATE INDEX IF NOT EXISTS idx_event_session_step ON events (session_id, timestep_id)",
    "CREATE INDEX IF NOT EXISTS idx_message_session_step ON messages (session_id, timestep_id)",
    "CREATE INDEX IF NOT EXISTS idx_outcome_rewards_session ON outcome_rewards (session_id)",
    "CREATE INDEX IF NOT EXISTS idx_event_rewards_session ON event_rewards (session_id)",
)
MESSAGE_TYPES = ("user", "assistant", "system", "tool_use", "tool_result")
# synth's normalisation of a trace's boundary-message types into the table's five
_TYPE_ALIASES = {"observation": "system", "policy_system_prompt": "system", "action": "assistant",
                 "policy_tool_call": "assistant", "policy_user_prompt": "user", "policy_tool_result": "tool_result",
                 "tool": "tool_result"}  # fmt: skip
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "tool_use": "assistant",
          "tool_result": "tool", "policy_user_prompt": "user", "policy_system_prompt": "system",
          "policy_tool_call": "assistant", "policy_tool_result": "tool"}  # fmt: skip


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def session_payload(trace: Any) -> dict[str, Any] | None:
    """The v3 SessionTrace dict in a rollout response's `trace` (compact: {"session_trace": {...}}; full:
    the trace itself), as synth's eval reads it; None when there is none."""
    if not isinstance(trace, dict):
        return None
    inner = trace.get("session_trace")
    if isinstance(inner, dict):
        return inner
    return trace if "session_id" in trace else None


def _message_type(raw: Any) -> str:
    text = str(raw or "").lower()
    return text if text in MESSAGE_TYPES else _TYPE_ALIASES.get(text, "system")


def _event_type(event: dict[str, Any]) -> str:
    if any(k in event for k in ("model_name", "call_records", "input_tokens")):
        return "cais"
    if "actions" in event:
        return "runtime"
    return "environment"


class SynthTraceWriter:
    """Appends sessions to a synth v3 trace database (created when new; an existing one, e.g. a task app's
    synth_ai.db, is added to)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path)
        for statement in SCHEMA:
            self.db.execute(statement)
        self.db.commit()

    def _session_id(self, wanted: str | None) -> str:
        sid = bounded(wanted or f"posttrain-{uuid.uuid4().hex}", 200)
        exists = self.db.execute("SELECT 1 FROM session_traces WHERE session_id = ?", (sid,)).fetchone()
        return f"{sid}-{uuid.uuid4().hex[:8]}" if exists else sid

    def add(self, row: dict[str, Any], *, env_name: str | None = None, policy_name: str | None = None) -> str:
        """One evaluated rollout (a `posttrain eval` trace row, its task app's v3 trace under "trace")."""
        payload = session_payload(row.get("trace"))
        meta = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
        trace_meta = payload.get("metadata") if payload and isinstance(payload.get("metadata"), dict) else {}
        metadata = {**trace_meta, **{k: v for k, v in meta.items() if v is not None},
                    "env_name": env_name, "policy_name": policy_name, "seed": row.get("seed"),
                    "eval_seed": row.get("seed"), "official_score": _number(row.get("reward")),
                    "prompt": row.get("prompt"), "completion": row.get("completion")}  # fmt: skip
        if row.get("error"):
            metadata["error"] = row["error"]
        created = _created((payload or {}).get("created_at") or meta.get("created_at"))
        sid = self._session_id((payload or {}).get("session_id") or meta.get("run_id"))
        self.db.execute("INSERT INTO session_traces (session_id, created_at, num_timesteps, num_events, num_messages,"
                        " metadata) VALUES (?, ?, 0, 0, 0, ?)", (sid, created, _json(metadata)))  # fmt: skip
        steps = self._from_trace(sid, payload) if payload is not None else 0
        if payload is None or not payload.get("markov_blanket_message_history"):
            steps = max(steps, self._from_row(sid, row, with_steps=payload is None))
        reward = _number(row.get("reward"))
        if reward is not None:
            metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
            details = metrics.get("details") if isinstance(metrics.get("details"), dict) else {}
            achievements = details.get("achievements") if isinstance(details.get("achievements"), list) else []
            self.db.execute("INSERT INTO outcome_rewards (session_id, total_reward, achievements_count, total_steps,"
                            " created_at, reward_metadata) VALUES (?, ?, ?, ?, ?, ?)",
                            (sid, reward, len(achievements), steps, _now(),
                             _json({"source": "posttrain eval", "metrics": {k: metrics.get(k) for k in
                                    ("mean_return", "outcome_score", "events_score") if k in metrics}})))  # fmt: skip
        counts = [self.db.execute(f"SELECT COUNT(*) FROM {t} WHERE session_id = ?", (sid,)).fetchone()[0]
                  for t in ("session_timesteps", "events", "messages")]  # fmt: skip
        self.db.execute("UPDATE session_traces SET num_timesteps = ?, num_events = ?, num_messages = ? "
                        "WHERE session_id = ?", (*counts, sid))  # fmt: skip
        self.db.commit()
        return sid

    def _from_trace(self, sid: str, payload: dict[str, Any]) -> int:
        step_ids: dict[str, int] = {}
        steps = [s for s in payload.get("session_time_steps") or [] if isinstance(s, dict)][:MAX_STEPS]
        for index, step in enumerate(steps):
            step_id = bounded(step.get("step_id") or f"step_{index}", 200)
            if step_id in step_ids:
                continue
            cur = self.db.execute(
                "INSERT INTO session_timesteps (session_id, step_id, step_index, turn_number, started_at,"
                " completed_at, num_events, num_messages, step_metadata) VALUES (?, ?, ?, ?, ?, ?, 0, 0, ?)",
                (sid, step_id, int(_number(step.get("step_index")) or index), _number(step.get("turn_number")),
                 step.get("timestamp"), step.get("completed_at"), _json(step.get("step_metadata") or {})),
            )  # fmt: skip
            step_ids[step_id] = int(cur.lastrowid or 0)
        for event in [e for e in payload.get("event_history") or [] if isinstance(e, dict)][:MAX_STEPS * 4]:
            meta = event.get("metadata") if isinstance(event.get("metadata"), dict) else {}
            kind = _event_type(event)
            time = event.get("time_record") if isinstance(event.get("time_record"), dict) else {}
            self.db.execute(
                "INSERT INTO events (session_id, timestep_id, event_type, system_instance_id, event_time,"
                " message_time, created_at, model_name, provider, reward, terminated, truncated, metadata,"
                " system_state_before, system_state_after, call_records) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                " ?, ?, ?, ?, ?)",
                (sid, step_ids.get(str(meta.get("step_id"))), kind, bounded(event.get("system_instance_id"), 200),
                 _number(time.get("event_time")), _number(time.get("message_time")), _now(),
                 event.get("model_name"), event.get("provider"), _number(event.get("reward")),
                 event.get("terminated"), event.get("truncated"),
                 bounded(_json({**meta, **({"actions": event["actions"]} if kind == "runtime" else {})})),
                 bounded(_json(event.get("system_state_before"))) if event.get("system_state_before") else None,
                 bounded(_json(event.get("system_state_after"))) if event.get("system_state_after") else None,
                 bounded(_json(event.get("call_records"))) if event.get("call_records") else None),
            )  # fmt: skip
        messages = [m for m in payload.get("markov_blanket_message_history") or [] if isinstance(m, dict)]
        for message in messages[:MAX_MESSAGES]:
            content = message.get("content")
            meta = dict(message.get("metadata") or {}) if isinstance(message.get("metadata"), dict) else {}
            meta["original_message_type"] = message.get("message_type")
            if isinstance(content, dict) and ("json_payload" in content or "text" in content):
                content = content.get("json_payload") or content.get("text") or ""
            time = message.get("time_record") if isinstance(message.get("time_record"), dict) else {}
            self.db.execute(
                "INSERT INTO messages (session_id, timestep_id, message_type, content, timestamp, event_time,"
                " message_time, metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (sid, step_ids.get(str(meta.get("step_id"))), _message_type(message.get("message_type")),
                 bounded(content), _now(), _number(time.get("event_time")), _number(time.get("message_time")),
                 bounded(_json(meta))),
            )  # fmt: skip
        return len(steps)

    def _from_row(self, sid: str, row: dict[str, Any], *, with_steps: bool = True) -> int:
        for message in [m for m in row.get("messages") or [] if isinstance(m, dict)][:MAX_MESSAGES]:
            role = str(message.get("role") or "")
            kind = {"tool": "tool_result", "function": "tool_result", "developer": "system"}.get(role, role)
            content: Any = message.get("content")
            if role == "assistant" and message.get("tool_calls"):
                content = {"role": "assistant", "content": content, "tool_calls": message["tool_calls"]}
            self.db.execute("INSERT INTO messages (session_id, message_type, content, timestamp, metadata) VALUES"
                            " (?, ?, ?, ?, ?)", (sid, _message_type(kind), bounded(content), _now(), _json({})))  # fmt: skip
        steps = [s for s in row.get("steps") or [] if isinstance(s, dict)][:MAX_STEPS] if with_steps else []
        for index, step in enumerate(steps):
            cur = self.db.execute(
                "INSERT INTO session_timesteps (session_id, step_id, step_index, turn_number, num_events,"
                " num_messages, step_metadata) VALUES (?, ?, ?, ?, 1, 0, ?)",
                (sid, f"step_{index}", index, index, _json({})),
            )  # fmt: skip
            reward = _number(step.get("reward"))
            event = self.db.execute(
                "INSERT INTO events (session_id, timestep_id, event_type, system_instance_id, created_at, reward,"
                " terminated, truncated, metadata) VALUES (?, ?, 'environment', 'task_app', ?, ?, ?, ?, ?)",
                (sid, cur.lastrowid, _now(), reward, bool(step.get("done")), bool(step.get("truncated")),
                 bounded(_json({"step_id": f"step_{index}", "info": step.get("info")}))),
            )  # fmt: skip
            if reward is not None:
                self.db.execute("INSERT INTO event_rewards (event_id, session_id, turn_number, reward_value,"
                                ' reward_type, "key", source, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
                                (event.lastrowid, sid, index, reward, "shaped", "step_reward", "environment",
                                 _now()))  # fmt: skip
        return len(steps)

    def close(self) -> None:
        self.db.close()


# -- reading ------------------------------------------------------------------------------------------


def is_synth_store(db: sqlite3.Connection) -> bool:
    """synth's v3 schema (session_traces with num_timesteps), as opposed to posttrain's RL trace store."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(session_traces)")}
    return "num_timesteps" in columns


def _unwrap(content: Any) -> tuple[Any, list[Any] | None]:
    """(content, tool_calls) of a stored message: JSON text parsed, {"content": ...}, {"text": ...} and
    {"payload": {"content": ...}} unwrapped (synth's filter reads the same), tool_calls kept."""
    if isinstance(content, str):
        try:
            parsed = json.loads(content)
        except ValueError:
            return content, None
        if not isinstance(parsed, dict | list):
            return content, None
        content = parsed
    if isinstance(content, list) and content and all(isinstance(c, dict) and _is_call(c) for c in content):
        return None, content  # a tool-call payload (synth's task apps record the calls as the message)
    if isinstance(content, dict):
        calls = content.get("tool_calls") if isinstance(content.get("tool_calls"), list) else None
        payload = content.get("payload") if isinstance(content.get("payload"), dict) else None
        for value in (content.get("content"), content.get("text"), (payload or {}).get("content")):
            if value is not None:
                return value, calls
        return (None if calls else json.dumps(content, ensure_ascii=False)), calls
    return content, None


def _part_text(parts: Any) -> Any:
    """An LLMMessage's parts as chat content: the text when all parts are text, else OpenAI content parts."""
    parts = [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []
    if all(p.get("type") in ("text", None) for p in parts):
        return "".join(str(p.get("text") or "") for p in parts)
    out = []
    for part in parts:
        if part.get("type") == "text":
            out.append({"type": "text", "text": str(part.get("text") or "")})
        elif part.get("uri"):
            out.append({"type": "image_url", "image_url": {"url": str(part["uri"])}})
    return out


def call_conversations(records: Any) -> list[list[dict[str, Any]]]:
    """Each LM call of a cais event's call_records (synth's LLMCallRecord) as a conversation: its input
    messages, then its answer (tool calls in OpenAI's shape, else the output text)."""
    out = []
    for record in records if isinstance(records, list) else []:
        if not isinstance(record, dict):
            continue
        messages = [{"role": str(m.get("role") or "user"), "content": _part_text(m.get("parts"))}
                    for m in record.get("input_messages") or [] if isinstance(m, dict)]  # fmt: skip
        if not messages:
            continue
        calls = [{"id": str(c.get("call_id") or f"call_{i}"), "type": "function",
                  "function": {"name": str(c.get("name") or ""), "arguments": str(c.get("arguments_json") or "{}")}}
                 for i, c in enumerate(record.get("output_tool_calls") or []) if isinstance(c, dict)]  # fmt: skip
        text = record.get("output_text") or "".join(
            _part_text(m.get("parts")) for m in record.get("output_messages") or [] if isinstance(m, dict)
            and isinstance(_part_text(m.get("parts")), str)
        )  # fmt: skip
        answer: dict[str, Any] = {"role": "assistant", "content": text or ""}
        if calls:
            answer["tool_calls"] = calls
        out.append(messages + [answer])
    return out


def _is_call(item: dict[str, Any]) -> bool:
    return any(k in item for k in ("tool_name", "function")) or ("name" in item and "arguments" in item)


def _created(value: Any) -> str:
    """An ISO time (a trace's created_at as the task app sent it), else now."""
    try:
        return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")).isoformat()
    except ValueError:
        return _now()


def read_sessions(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(session number, rollout row) of a synth v3 trace database, in created_at order. Read-only."""
    path = Path(path)
    db = sqlite3.connect(f"file:{path.resolve().as_posix()}?mode=ro", uri=True)
    try:
        has_outcomes = bool(db.execute("SELECT 1 FROM sqlite_master WHERE name = 'outcome_rewards'").fetchone())
        sessions = db.execute("SELECT session_id, created_at, metadata FROM session_traces ORDER BY created_at").fetchall()
        for number, (sid, created, metadata_raw) in enumerate(sessions, start=1):
            metadata: Any = {}
            with contextlib.suppress(ValueError, TypeError):
                metadata = json.loads(metadata_raw) if metadata_raw else {}
            metadata = metadata if isinstance(metadata, dict) else {}
            reward = achievements = None
            if has_outcomes:
                found = db.execute("SELECT total_reward, achievements_count FROM outcome_rewards WHERE session_id = ?"
                                   " ORDER BY id LIMIT 1", (sid,)).fetchone()  # fmt: skip
                if found:
                    reward, achievements = found
            messages = []
            for kind, content in db.execute("SELECT message_type, content FROM messages WHERE session_id = ? "
                                            "ORDER BY timestamp, id LIMIT ?", (sid, MAX_MESSAGES)):  # fmt: skip
                value, calls = _unwrap(content)
                message: dict[str, Any] = {"role": _ROLES.get(str(kind), "system"),
                                           "content": value if isinstance(value, str | list) else bounded(value)}  # fmt: skip
                if calls and message["role"] == "assistant":
                    message["tool_calls"] = calls
                messages.append(message)
            row: dict[str, Any] = {"reward": _number(reward),
                                   "metadata": {**metadata, "session_id": sid, "created_at": created,
                                                "total_reward": _number(reward), "achievements_count": achievements}}  # fmt: skip
            if messages and any(m["role"] == "user" for m in messages):
                yield number, {**row, "messages": messages}
                continue
            # No message rows: synth 0.2.19's task apps save none when the session's events were written first
            # (its Crafter app's FILTER_COMMAND_STATUS.md); its LM calls are in the cais events' call_records.
            calls = []
            for (raw,) in db.execute("SELECT call_records FROM events WHERE session_id = ? AND event_type = 'cais'"
                                     " AND call_records IS NOT NULL ORDER BY id LIMIT ?", (sid, MAX_MESSAGES)):  # fmt: skip
                with contextlib.suppress(ValueError, TypeError):
                    calls += call_conversations(json.loads(raw))
            for conversation in calls:
                yield number, {**row, "messages": conversation}
            if not calls and metadata.get("prompt") and metadata.get("completion"):
                yield number, {**row, "prompt": str(metadata["prompt"]), "completion": str(metadata["completion"])}
    finally:
        db.close()
