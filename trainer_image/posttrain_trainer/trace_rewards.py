"""Event rewards a task app reports through its v3 trace (synth's tracer: `record_event_reward`), as the
per-decision blocks step_rewards.decision_rewards turns into credit, exactly as it turns
`info.meta.decision_rewards` (pure functions, no I/O).

Where the rewards are in a RolloutResponse's `trace` (asked with record.return_trace):
- synth's compact trace (trace_format "compact"): `decision_rewards`, one entry per decision
  {turn, ach_delta, unique_delta, achievements, unique_achievements} (synth's Crafter app writes it);
- an `event_rewards` list, in the trace or its `session_trace`: rows shaped as synth's event_rewards table
  {turn_number, reward_value, reward_type, key, annotation {achievements}}. reward_type
  "unique_achievement_delta" counts achievements new to the episode, "achievement_delta" every achievement
  event; any other type counts reward_value events of its key (both kinds).
A decision is a turn (turn or turn_number; from 0, or from 1 when the last turn equals the number of
decisions); a decision the trace names no reward for gets no block (reward 0)."""

from __future__ import annotations

import math
from typing import Any

ALL, UNIQUE = "achievement_delta", "unique_achievement_delta"


def session_payload(trace: Any) -> dict[str, Any] | None:
    if not isinstance(trace, dict):
        return None
    inner = trace.get("session_trace")
    return inner if isinstance(inner, dict) else trace


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0
    return max(0, int(value))


def _names(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _turn(row: dict[str, Any]) -> int | None:
    for key in ("turn", "turn_number"):
        value = row.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _from_decisions(rows: list[Any]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for index, row in enumerate(r for r in rows if isinstance(r, dict)):
        turn = _turn(row)
        out[index if turn is None else turn] = {
            "ach_delta": _count(row.get("ach_delta")), "unique_delta": _count(row.get("unique_delta")),
            "all": _names(row.get("achievements", row.get("all"))),
            "unique": _names(row.get("unique_achievements", row.get("unique"))),
        }  # fmt: skip
    return out


def _from_event_rewards(rows: list[Any]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for row in rows:
        turn = _turn(row) if isinstance(row, dict) else None
        if turn is None:
            continue
        block = out.setdefault(turn, {"ach_delta": 0, "unique_delta": 0, "all": [], "unique": []})
        annotation = row.get("annotation") if isinstance(row.get("annotation"), dict) else {}
        count, kind = _count(row.get("reward_value")), row.get("reward_type")
        names = _names(annotation.get("achievements"))
        if kind not in (ALL, UNIQUE) and not names and row.get("key"):
            names = [str(row["key"])] * count
        if kind != UNIQUE:
            block["ach_delta"] += count
            block["all"] += names
        if kind != ALL:
            block["unique_delta"] += count
            block["unique"] += names
    return out


def trace_blocks(response: dict[str, Any], decisions: int) -> list[dict[str, Any] | None]:
    """One block per decision (None where the trace has no reward for it), `decisions` long at least;
    [] when the response's trace carries no event rewards."""
    trace = response.get("trace") if isinstance(response.get("trace"), dict) else None
    session = session_payload(trace)
    by_turn: dict[int, dict[str, Any]] = {}
    for source in (trace, session):
        if not isinstance(source, dict):
            continue
        if isinstance(source.get("decision_rewards"), list) and not by_turn:
            by_turn = _from_decisions(source["decision_rewards"])
        if isinstance(source.get("event_rewards"), list) and not by_turn:
            by_turn = _from_event_rewards(source["event_rewards"])
    if not by_turn:
        return []
    # turns count from 0, or from 1 when the last one is the number of decisions
    offset = 1 if min(by_turn) >= 1 and max(by_turn) >= decisions else 0
    length = max(decisions, max(by_turn) - offset + 1)
    out: list[dict[str, Any] | None] = [None] * length
    for turn, block in by_turn.items():
        out[turn - offset] = {"turn": turn, **block}
    return out
