"""Bounded in-memory store of token captures keyed by correlation id (the `cid` query parameter).

Pure (no I/O): the proxy appends one entry per choice of each captured call, in call order; the trainer
fetches the list with GET /v1/captures/{cid} and deletes it. Bounded by the number of cids (oldest evicted
first), by entries per cid, and by a TTL counted from the cid's last write."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class CaptureStore:
    def __init__(
        self,
        max_cids: int = 10_000,
        ttl_s: float = 3600.0,
        max_entries_per_cid: int = 1_000,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_cids < 1 or max_entries_per_cid < 1 or ttl_s <= 0:
            raise ValueError("max_cids, max_entries_per_cid and ttl_s must be positive")
        self.max_cids = max_cids
        self.ttl_s = ttl_s
        self.max_entries_per_cid = max_entries_per_cid
        self._clock = clock
        self._data: OrderedDict[str, tuple[float, list[dict[str, Any]]]] = OrderedDict()
        # cid -> the last refused call's {status, reason, refused}: why a cid may have no capture
        self._refusals: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.evicted = 0
        self.dropped_entries = 0

    def __len__(self) -> int:
        self.expire()
        return len(self._data)

    def __contains__(self, cid: str) -> bool:
        return self.get(cid) is not None

    def expire(self) -> int:
        """Drop cids whose last write is older than the TTL; returns how many were dropped."""
        now = self._clock()
        dropped = 0
        # ordered by last write (move_to_end on every add): stop at the first fresh one
        while self._data:
            cid, (stamp, _) = next(iter(self._data.items()))
            if now - stamp < self.ttl_s:
                break
            del self._data[cid]
            dropped += 1
        self.evicted += dropped
        return dropped

    def add(self, cid: str, entries: list[dict[str, Any]]) -> None:
        self.expire()
        _, existing = self._data.pop(cid, (0.0, []))
        existing.extend(entries)
        if len(existing) > self.max_entries_per_cid:
            self.dropped_entries += len(existing) - self.max_entries_per_cid
            del existing[: len(existing) - self.max_entries_per_cid]  # keep the most recent
        self._data[cid] = (self._clock(), existing)
        while len(self._data) > self.max_cids:
            self._data.popitem(last=False)
            self.evicted += 1

    def get(self, cid: str) -> list[dict[str, Any]] | None:
        self.expire()
        item = self._data.get(cid)
        return None if item is None else list(item[1])

    def pop(self, cid: str) -> list[dict[str, Any]] | None:
        self.expire()
        item = self._data.pop(cid, None)
        return None if item is None else item[1]

    def refuse(self, cid: str, status: int, upstream_body: bytes | str) -> None:
        """A call under `cid` vLLM refused (no capture made): kept, bounded like the captures, so GET
        /v1/captures/{cid} can say why it has none. Only refusal_reason's own words are kept."""
        previous = self._refusals.pop(cid, {})
        self._refusals[cid] = {
            "status": int(status),
            "reason": refusal_reason(status, upstream_body),
            "refused": int(previous.get("refused", 0)) + 1,
        }
        while len(self._refusals) > self.max_cids:
            self._refusals.popitem(last=False)

    def refusal(self, cid: str, *, pop: bool = False) -> dict[str, Any] | None:
        return self._refusals.pop(cid, None) if pop else self._refusals.get(cid)

    def stats(self) -> dict[str, int]:
        self.expire()
        return {
            "cids": len(self._data),
            "entries": sum(len(v) for _, v in self._data.values()),
            "evicted_cids": self.evicted,
            "dropped_entries": self.dropped_entries,
        }


# vLLM's answers to a refused request, as the trainer's error says them (ours, not vLLM's text: the request
# is the task app's, and what vLLM echoes of it is untrusted)
_TOO_LONG = "the conversation is longer than the model's context: raise [vllm].max_model_len or shorten the episode"
_REFUSALS = (
    ("tool-call-parser", "vLLM serves tool_choice \"required\" or a named function only with a tool-call "
     "parser, and posttrain knows none for this model's family: set [vllm].tool_call_parser (e.g. \"hermes\")"),
    ("maximum context length", _TOO_LONG),
    ("max_model_len", _TOO_LONG),
)  # fmt: skip


def body_text(body: bytes | str, limit: int) -> str:
    """At most `limit` characters of an HTTP body."""
    return body[:limit].decode("utf-8", "replace") if isinstance(body, bytes) else str(body)[:limit]


def refusal_reason(status: int, upstream_body: bytes | str) -> str:
    """Why vLLM refused a call, in posttrain's words (the rollout server's log has vLLM's own)."""
    text = body_text(upstream_body, 4_000).lower()
    for needle, reason in _REFUSALS:
        if needle in text:
            return reason
    return f"vLLM answered HTTP {int(status)} (the rollout server's log has its message)"


def _float_or_none(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if f == f else None  # NaN -> None


def chat_choice_logprobs(choice: dict[str, Any]) -> list[float | None]:
    content = ((choice.get("logprobs") or {}).get("content")) or []
    return [_float_or_none(item.get("logprob")) for item in content]


def completion_choice_logprobs(choice: dict[str, Any]) -> list[float | None]:
    return [_float_or_none(x) for x in ((choice.get("logprobs") or {}).get("token_logprobs") or [])]


# Bounds of the text a capture keeps for the job's trace store (the task app writes the messages: untrusted).
MAX_TRACE_CHARS = 8_000  # per message content or tool-call arguments; longer text is cut and marked
MAX_TRACE_MESSAGES = 64  # per call: the system prompt and the last messages
TRUNCATION_MARK = "…[truncated]"


def bounded_text(value: Any, limit: int = MAX_TRACE_CHARS) -> str:
    """Text of a message content (a string, or OpenAI content parts with images named, not kept), cut to
    `limit` characters."""
    if isinstance(value, list):
        value = "".join(
            str(p.get("text", "")) if p.get("type") == "text" else f"[{p.get('type', 'part')}]"
            for p in value
            if isinstance(p, dict)
        )
    elif not isinstance(value, str):
        value = "" if value is None else str(value)
    return value if len(value) <= limit else value[:limit] + TRUNCATION_MARK


def _bounded_tool_calls(calls: Any) -> list[dict[str, str]]:
    out = []
    for call in (calls if isinstance(calls, list) else [])[:16]:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            out.append(
                {
                    "name": bounded_text(function.get("name"), 200),
                    "arguments": bounded_text(function.get("arguments")),
                }
            )
    return out


def trace_messages(messages: Any) -> list[dict[str, Any]]:
    """A request's messages as the trace keeps them: role, bounded text content, tool calls; the system
    prompt and the last MAX_TRACE_MESSAGES - 1 messages."""
    if not isinstance(messages, list):
        return []
    kept = [m for m in messages if isinstance(m, dict)]
    if len(kept) > MAX_TRACE_MESSAGES:
        head = [m for m in kept[:1] if m.get("role") == "system"]
        kept = head + kept[-(MAX_TRACE_MESSAGES - len(head)) :]
    out = []
    for message in kept:
        item: dict[str, Any] = {
            "role": bounded_text(message.get("role"), 32),
            "content": bounded_text(message.get("content")),
        }
        calls = _bounded_tool_calls(message.get("tool_calls"))
        if calls:
            item["tool_calls"] = calls
        out.append(item)
    return out


def entries_from_response(
    body: dict[str, Any],
    *,
    chat: bool,
    weight_version: Any,
    images: list[str] | None = None,
    request_messages: Any = None,
) -> list[dict[str, Any]]:
    """One capture entry per choice of a vLLM response made with return_token_ids and logprobs. `images`: the
    image URLs the request gave vLLM, in prompt order (their placeholders are in prompt_token_ids); the trainer
    rebuilds the same pixel values from them. `request_messages` (chat) and each choice's reply are kept as
    bounded text (trace_messages) for the job's trace store."""
    top_prompt = body.get("prompt_token_ids")
    messages = trace_messages(request_messages) if chat else []
    out = []
    for choice in sorted(body.get("choices") or [], key=lambda c: c.get("index", 0)):
        prompt = choice.get("prompt_token_ids") or top_prompt or []
        completion = choice.get("token_ids") or []
        logprobs = chat_choice_logprobs(choice) if chat else completion_choice_logprobs(choice)
        out.append(
            {
                "prompt_token_ids": [int(t) for t in prompt],
                "completion_token_ids": [int(t) for t in completion],
                "logprobs": logprobs,
                "weight_version": weight_version,
                "finish_reason": choice.get("finish_reason"),
                **({"images": list(images)} if images else {}),
                **({"messages": messages} if messages else {}),
                **({"reply": _reply(choice)} if messages else {}),
            }
        )
    return out


def _reply(choice: dict[str, Any]) -> dict[str, Any]:
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    out: dict[str, Any] = {"role": "assistant", "content": bounded_text(message.get("content"))}
    calls = _bounded_tool_calls(message.get("tool_calls"))
    if calls:
        out["tool_calls"] = calls
    return out


# Signed capture ids. A captured call (`?cid=`) writes into the job's capture store; with a token, only a
# cid the job's trainer made is written: `trace_<run>-m<mac>-<it|ev><k>-s<seed>-r<i>`, where mac is an HMAC
# of the cid without it under the job's rollout token (posttrain_trainer.rollouts.make_cid). Another pod
# that reaches the port can neither guess a job's cids nor write under one it made up (its calls are
# served, not captured). The run-independent tail stays last (posttrain_rollout.seeding reads it).
CID_MAC_HEX = 20
_SIGNED_CID = re.compile(r"^(?P<head>.+)-m(?P<mac>[0-9a-f]{20})-(?P<tail>(?:it|ev)\d+-s\d+-r\d+)$")


def cid_mac(token: str, unsigned_cid: str) -> str:
    return hmac.new(token.encode(), unsigned_cid.encode(), hashlib.sha256).hexdigest()[:CID_MAC_HEX]


def signed_cid(token: str, cid: str) -> bool:
    """Whether `cid` carries a valid mac under `token`."""
    match = _SIGNED_CID.match(cid)
    if match is None:
        return False
    unsigned = f"{match['head']}-{match['tail']}"
    return hmac.compare_digest(match["mac"], cid_mac(token, unsigned))
