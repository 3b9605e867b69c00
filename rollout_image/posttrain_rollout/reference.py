"""Reference scoring: logprobs of given completion tokens under the served (frozen) model.

POST /v1/score {sequences: [{prompt_token_ids, completion_token_ids}]} -> {logprobs: [[float, ...]]}: one
vLLM /v1/completions call per sequence with the token ids as the prompt, max_tokens=1 and prompt_logprobs=0
(vLLM then reports the logprob of the actual token at every prompt position)."""

from __future__ import annotations

from typing import Any


class ScoreError(ValueError):
    pass


def parse_sequences(body: Any) -> list[tuple[list[int], list[int]]]:
    if not isinstance(body, dict) or not isinstance(body.get("sequences"), list):
        raise ScoreError("body must be {sequences: [{prompt_token_ids, completion_token_ids}]}")
    out = []
    for i, seq in enumerate(body["sequences"]):
        try:
            prompt = [int(t) for t in seq["prompt_token_ids"]]
            completion = [int(t) for t in seq["completion_token_ids"]]
        except (KeyError, TypeError, ValueError) as err:
            raise ScoreError(
                f"sequences[{i}]: needs integer lists prompt_token_ids, completion_token_ids"
            ) from err
        if not prompt:
            raise ScoreError(f"sequences[{i}]: prompt_token_ids must not be empty")
        out.append((prompt, completion))
    return out


def score_request(model: str, prompt: list[int], completion: list[int]) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt + completion,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
    }


def completion_logprobs(response: dict[str, Any], prompt: list[int], completion: list[int]) -> list[float]:
    """The logprob of each completion token, from a vLLM completions response with prompt_logprobs."""
    choices = response.get("choices") or []
    plp = (choices[0].get("prompt_logprobs") if choices else None) or response.get("prompt_logprobs")
    if plp is None:
        raise ScoreError("vLLM returned no prompt_logprobs")
    n = len(prompt)
    if len(plp) < n + len(completion):
        raise ScoreError(f"vLLM returned {len(plp)} prompt logprobs for {n + len(completion)} tokens")
    out = []
    for pos, token in enumerate(completion, start=n):
        entry = plp[pos] or {}
        item = entry.get(str(token))
        if item is None:
            item = entry.get(token)
        if item is None:
            raise ScoreError(f"no logprob for token {token} at position {pos}")
        out.append(float(item["logprob"] if isinstance(item, dict) else item))
    return out
