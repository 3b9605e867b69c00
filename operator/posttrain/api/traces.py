"""The job's trace store: every rollout of an RL job (training and evaluation) as rows of one SQLite file,
`traces.sqlite`, beside the job's other artifacts (S3 `<job prefix>traces.sqlite`, uploaded after every
iteration, or the local run folder). `posttrain filter` turns it into SFT JSONL by score.

Tables (synth's v3 trace tables by name, so synth's filter semantics read it unchanged, plus ours):
  session_traces(session_id, created_at, metadata JSON, job, kind "train"|"eval", iteration, seed, grp,
                 sample, policy_version, reward, episode_return, outcome_score, events_score, turns,
                 sampled_tokens, episode_tokens, error)
  outcome_rewards(session_id, total_reward, achievements_count)   total_reward = the reward the trainer used
  messages(id, session_id, turn, message_type, role, content, tool_calls JSON, timestamp)
      message_type as synth's: policy_system_prompt, policy_user_prompt, policy_tool_result, assistant,
      policy_tool_call; `turn` = the policy call (decision) it belongs to
  steps(session_id, step, reward, decision_reward, done, tool_calls JSON, info JSON)
  job_metadata(key, value JSON)   what holds for the whole job, e.g. "judge_rubric": the rubric each judged
      score was scored against and its source (overrides | task_info | none); each training rollout's
      metadata also names that source (judge_rubric_source). A store without the table reads as no rows.

Messages come from the rollout server's captures (the exact request each policy call was given and its
reply, kept by posttrain_rollout.captures as bounded text); steps from the task app's trajectory. Everything
a task app wrote is untrusted and bounded here again: MAX_FIELD_CHARS per text field (cut text ends with
TRUNCATION_MARK), MAX_STEPS steps and MAX_MESSAGES messages per episode."""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

FILE_NAME = "traces.sqlite"
# The store is uploaded whole (one queryable file); a long job's store grows, so between checkpoints it goes
# up at most this often instead of after every iteration (the final upload and a checkpoint's always run).
UPLOAD_INTERVAL_S = 120.0
MAX_FIELD_CHARS = 8_000
MAX_STEPS = 1_000
MAX_MESSAGES = 2_000
TRUNCATION_MARK = "…[truncated]"

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS session_traces (session_id TEXT PRIMARY KEY, created_at TEXT, metadata TEXT,"
    " job TEXT, kind TEXT, iteration INTEGER, seed INTEGER, grp INTEGER, sample INTEGER, policy_version TEXT,"
    " reward REAL, episode_return REAL, outcome_score REAL, events_score REAL, turns INTEGER,"
    " sampled_tokens INTEGER, episode_tokens INTEGER, error TEXT)",
    "CREATE TABLE IF NOT EXISTS outcome_rewards (session_id TEXT PRIMARY KEY, total_reward REAL,"
    " achievements_count INTEGER)",
    "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, session_id TEXT, turn INTEGER,"
    " message_type TEXT, role TEXT, content TEXT, tool_calls TEXT, timestamp REAL)",
    "CREATE TABLE IF NOT EXISTS steps (session_id TEXT, step INTEGER, reward REAL, decision_reward REAL,"
    " done INTEGER, tool_calls TEXT, info TEXT)",
    "CREATE TABLE IF NOT EXISTS job_metadata (key TEXT PRIMARY KEY, value TEXT)",
    "CREATE INDEX IF NOT EXISTS messages_session ON messages (session_id, id)",
    "CREATE INDEX IF NOT EXISTS steps_session ON steps (session_id, step)",
)

_MESSAGE_TYPES = {
    "system": "policy_system_prompt",
    "user": "policy_user_prompt",
    "tool": "policy_tool_result",
    "assistant": "assistant",
}


def bounded(value: Any, limit: int = MAX_FIELD_CHARS) -> str:
    """Text of any value (JSON for non-strings), cut to `limit` characters."""
    if not isinstance(value, str):
        value = "" if value is None else json.dumps(value, ensure_ascii=False, default=str)
    return value if len(value) <= limit else value[:limit] + TRUNCATION_MARK


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _tool_calls(value: Any) -> list[dict[str, str]]:
    out = []
    for call in (value if isinstance(value, list) else [])[:16]:
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else call
        arguments = function.get("arguments", function.get("args"))
        out.append(
            {
                "name": bounded(function.get("name") or function.get("tool"), 200),
                "arguments": bounded(arguments),
            }
        )
    return out


def conversation(captures: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One episode's messages in order, each with the policy call (`turn`) it came in: the first call's whole
    request, then for each later call the messages that are new since the previous call's request and reply
    (its whole request when it does not extend the previous one: a rewritten or cut history), then the
    call's reply."""
    out: list[dict[str, Any]] = []
    previous: list[dict[str, Any]] = []
    for turn, entry in enumerate(captures):
        request = [_message(m) for m in entry.get("messages") or [] if isinstance(m, dict)]
        reply = entry.get("reply")
        extends = turn > 0 and len(request) > len(previous) and request[: len(previous)] == previous
        new = request[len(previous) + 1 :] if extends else request  # +1: the previous reply, sent back
        out += [{**message, "turn": turn} for message in new]
        if isinstance(reply, dict):
            out.append({**_message({**reply, "role": "assistant"}), "turn": turn})
        previous = request
        if len(out) >= MAX_MESSAGES:
            return out[:MAX_MESSAGES]
    return out


def _message(message: dict[str, Any]) -> dict[str, Any]:
    role = bounded(message.get("role"), 32)
    item: dict[str, Any] = {"role": role, "content": bounded(message.get("content"))}
    calls = _tool_calls(message.get("tool_calls"))
    if calls:
        item["tool_calls"] = calls
    return item


def trajectory_steps(response: dict[str, Any], decision_rewards: list[float]) -> list[dict[str, Any]]:
    """The first trajectory's steps, bounded: reward, the decision reward the trainer credited, done, tool
    calls, info (JSON, cut)."""
    trajectories = response.get("trajectories") if isinstance(response.get("trajectories"), list) else []
    first = trajectories[0] if trajectories and isinstance(trajectories[0], dict) else {}
    steps = first.get("steps") if isinstance(first.get("steps"), list) else []
    out = []
    for index, step in enumerate(steps[:MAX_STEPS]):
        step = step if isinstance(step, dict) else {}
        out.append(
            {
                "step": index,
                "reward": _number(step.get("reward")),
                "decision_reward": decision_rewards[index] if index < len(decision_rewards) else None,
                "done": bool(step.get("done")),
                "tool_calls": _tool_calls(step.get("tool_calls")),
                "info": bounded(step.get("info")) if step.get("info") is not None else None,
            }
        )
    return out


def achievements_count(response: dict[str, Any]) -> int | None:
    """The number of achievements the episode unlocked, where the task app reports them (synth's Crafter
    and craftworld: metrics.details.achievements or the last step's info.achievements)."""
    metrics = response.get("metrics") if isinstance(response.get("metrics"), dict) else {}
    details = metrics.get("details") if isinstance(metrics.get("details"), dict) else {}
    for value in (details.get("achievements"), metrics.get("achievements"), details.get("num_achievements")):
        if isinstance(value, list):
            return len(value)
        if isinstance(value, dict):
            return sum(1 for v in value.values() if v)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


class TraceStore:
    """Appends episodes to a SQLite file; one transaction per batch (an iteration's rollouts)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path)
        for statement in SCHEMA:
            self._db.execute(statement)
        self._db.commit()

    def add(self, episodes: Iterable[dict[str, Any]]) -> int:
        """Write episodes (episode_row's shape); returns how many. An episode already stored (same
        session_id, e.g. a resumed job redoing an iteration) is replaced."""
        count = 0
        with self._db:
            for episode in episodes:
                self._write(episode)
                count += 1
        return count

    def _write(self, e: dict[str, Any]) -> None:
        sid = e["session_id"]
        for table in ("session_traces", "outcome_rewards", "messages", "steps"):
            self._db.execute(f"DELETE FROM {table} WHERE session_id = ?", (sid,))
        self._db.execute(
            "INSERT INTO session_traces VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (sid, e["created_at"], json.dumps(e["metadata"], default=str), e.get("job"), e.get("kind"),
             e.get("iteration"), e.get("seed"), e.get("group"), e.get("sample"),
             None if e.get("policy_version") is None else str(e["policy_version"]), e.get("reward"),
             e.get("episode_return"), e.get("outcome_score"), e.get("events_score"), e.get("turns"),
             e.get("sampled_tokens"), e.get("episode_tokens"), e.get("error")),
        )  # fmt: skip
        if e.get("error") is None:
            self._db.execute(
                "INSERT INTO outcome_rewards VALUES (?, ?, ?)",
                (sid, e.get("reward"), e.get("achievements_count")),
            )
        stamp = e.get("timestamp", 0.0)
        for n, message in enumerate(e.get("messages") or []):
            self._db.execute(
                "INSERT INTO messages (session_id, turn, message_type, role, content, tool_calls, timestamp)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sid, message.get("turn"),
                 "policy_tool_call" if message.get("tool_calls") and message["role"] == "assistant"
                 else _MESSAGE_TYPES.get(message["role"], message["role"]),
                 message["role"], message.get("content"),
                 json.dumps(message["tool_calls"]) if message.get("tool_calls") else None, stamp + n * 1e-6),
            )  # fmt: skip
        for step in e.get("steps") or []:
            self._db.execute(
                "INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sid, step["step"], step.get("reward"), step.get("decision_reward"), int(bool(step.get("done"))),
                 json.dumps(step.get("tool_calls") or []), step.get("info")),
            )  # fmt: skip

    def set_metadata(self, values: dict[str, Any]) -> None:
        """job_metadata rows (JSON values), replacing those of the same keys."""
        with self._db:
            for key, value in values.items():
                self._db.execute(
                    "INSERT OR REPLACE INTO job_metadata VALUES (?, ?)", (key, json.dumps(value, default=str))
                )

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> TraceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- reading ------------------------------------------------------------------------------------------


class TraceStoreError(ValueError):
    """The file is not a trace store (the message says why)."""


def read_sessions(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number, rollout row) in `posttrain filter`'s row shape ({"messages", "reward", "metadata"}), in
    the order the episodes were stored; failed rollouts are skipped (they have no reward). Read-only."""
    path = Path(path)
    uri = f"file:{path.resolve().as_posix()}?mode=ro"
    try:
        db = sqlite3.connect(uri, uri=True)
        db.execute("SELECT session_id FROM session_traces LIMIT 1")
    except sqlite3.Error as err:
        raise TraceStoreError(f"{path} is not a posttrain trace store ({err})") from None
    try:
        sessions = db.execute(
            "SELECT s.session_id, s.created_at, s.metadata, o.total_reward, o.achievements_count "
            "FROM session_traces s JOIN outcome_rewards o ON o.session_id = s.session_id "
            "WHERE s.error IS NULL ORDER BY s.rowid"
        )
        for number, (sid, created, metadata_raw, reward, achievements) in enumerate(sessions, start=1):
            try:
                metadata = json.loads(metadata_raw) if metadata_raw else {}
            except ValueError:
                metadata = {}
            metadata = metadata if isinstance(metadata, dict) else {}
            messages = []
            for role, content, calls in db.execute(
                "SELECT role, content, tool_calls FROM messages WHERE session_id = ? ORDER BY timestamp, id",
                (sid,),
            ):
                message: dict[str, Any] = {"role": role, "content": content}
                if calls:
                    with contextlib.suppress(ValueError):
                        message["tool_calls"] = json.loads(calls)
                messages.append(message)
            yield (
                number,
                {
                    "messages": messages,
                    "reward": reward,
                    "metadata": {
                        **metadata,
                        "session_id": sid,
                        "created_at": created,
                        "total_reward": reward,
                        "achievements_count": achievements,
                    },
                },
            )
    finally:
        db.close()


def read_job_metadata(path: str | Path) -> dict[str, Any]:
    """The job_metadata rows by key ({} for a store written before the table existed). Read-only."""
    uri = f"file:{Path(path).resolve().as_posix()}?mode=ro"
    try:
        db = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as err:
        raise TraceStoreError(f"{path} is not a posttrain trace store ({err})") from None
    out: dict[str, Any] = {}
    try:
        for key, value in db.execute("SELECT key, value FROM job_metadata"):
            with contextlib.suppress(ValueError):
                out[key] = json.loads(value)
    except sqlite3.Error:
        return {}
    finally:
        db.close()
    return out


def is_trace_store(path: str | Path) -> bool:
    """A SQLite file (by its header), whatever its name."""
    try:
        with Path(path).open("rb") as handle:
            return handle.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def episode_row(
    result: Any, *, job: str, kind: str, iteration: int, model: str, created_at: str | None = None
) -> dict[str, Any]:
    """A rollouts.RolloutResult as the store keeps it. The policy version is the weight version that served
    the episode's first call (rollout server's captures), else the iteration's."""
    spec, trace = result.spec, result.trace or {}
    versions = [v for v in trace.get("weight_versions") or [] if v is not None]
    return {
        "session_id": spec.cid,
        "created_at": created_at or now(),
        "job": job,
        "kind": kind,
        "iteration": iteration,
        "seed": spec.seed,
        "group": spec.group,
        "sample": spec.index,
        "policy_version": versions[0] if versions else iteration,
        "reward": _number(result.reward) if result.ok else None,
        "episode_return": _number(result.env_return) if result.ok else None,
        "outcome_score": _number(result.outcome_score),
        "events_score": _number(result.events_score),
        "turns": result.turns,
        "sampled_tokens": sum(s.policy_tokens for s in result.sequences),
        "episode_tokens": trace.get("episode_tokens"),
        "error": None if result.ok else bounded(result.error or "failed", 2_000),
        "achievements_count": trace.get("achievements_count"),
        "messages": trace.get("messages") or [],
        "steps": trace.get("steps") or [],
        "metadata": {
            "seed": spec.seed,
            "model": model,
            "task_split": "train" if kind == "train" else "eval",
            "run_id": spec.cid,
            "iteration": iteration,
            "judge_scores": {
                k: v
                for k, v in (
                    ("outcome", _number(result.outcome_score)),
                    ("events", _number(result.events_score)),
                )
                if v is not None
            },
            "decision_rewards": [d for d in result.decision_rewards[:MAX_STEPS]],
        },
    }


class JobTraces:
    """An RL job's trace store, kept by its trainer (rank 0): `<workdir>/traces.sqlite`, uploaded to
    `<storage prefix>traces.sqlite` by upload() (the job's namespace folder, jobs/<ns>/<name>-<uid8>/). Opened
    on the first add(); a restarted trainer continues the store the job uploaded before."""

    def __init__(self, job: Any, client: Any = None, *, min_interval_s: float = UPLOAD_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.job = job
        self.path = Path(job.workdir) / FILE_NAME
        self.client = client
        self.store: TraceStore | None = None
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.pending = False  # rows added since the last upload
        self.uploaded_at: float | None = None
        self.metadata: dict[str, Any] = {}  # job_metadata rows, written with every batch

    @property
    def key(self) -> str:
        return self.job.storage.prefix + FILE_NAME

    def _client(self) -> Any:
        from posttrain import storage as s3

        if self.client is None:
            self.client = s3.client_from_env(self.job.storage)
        return self.client

    def add(self, results: Iterable[Any], *, kind: str, iteration: int) -> int:
        if self.store is None:
            if self.job.storage is not None and not self.path.exists():
                from posttrain import storage as s3

                if s3.exists(self._client(), self.job.storage.bucket, self.key):
                    s3.download_file(self._client(), s3.s3_uri(self.job.storage.bucket, self.key), self.path)
            self.store = TraceStore(self.path)
        name = f"{self.job.job.namespace}/{self.job.job.name}"
        stamp = now()
        rubric = self.metadata.get("judge_rubric")
        rows = [
            episode_row(r, job=name, kind=kind, iteration=iteration, model=self.job.base_model, created_at=stamp)
            for r in results
        ]
        if isinstance(rubric, dict) and kind == "train":  # training rollouts are the judged ones
            for row in rows:
                row["metadata"]["judge_rubric_source"] = rubric.get("source")
        if self.metadata:
            self.store.set_metadata(self.metadata)
        added = self.store.add(rows)
        self.pending = self.pending or added > 0
        return added

    def upload(self, *, force: bool = True) -> str | None:
        """The store to the job's folder in S3; its URI, or None when nothing went up: no storage, nothing
        added since the last upload, or (force=False) the last upload is under min_interval_s old."""
        if self.store is None or self.job.storage is None or not self.pending:
            return None
        recent = self.uploaded_at is not None and self.clock() - self.uploaded_at < self.min_interval_s
        if recent and not force:
            return None
        from posttrain import storage as s3

        uri = s3.upload_file(self._client(), self.path, self.job.storage.bucket, self.key)
        self.pending, self.uploaded_at = False, self.clock()
        return uri
