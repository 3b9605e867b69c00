"""Reference scoring: logprobs of given completion tokens under the served (frozen) model.

POST /v1/score {sequences: [{prompt_token_ids, completion_token_ids}], temperature?} -> {logprobs: [[float,
...]]}: one vLLM /v1/completions call per sequence with the token ids as the prompt, max_tokens=1 and
prompt_logprobs (vLLM then reports the logprob of the actual token at every prompt position).

vLLM's prompt logprobs are the raw model's (temperature 1) whatever the request's temperature. The trainer
divides its logits by the sampling temperature T, so for T != 1 the server asks for the top TOP_K logprobs of
each position as well and rescales: log softmax(z / T)_y = lp_y / T - log sum_j exp(lp_j / T), the sum over the
top-K and the target exactly, plus an estimate of the rest: the mass r the top-K leave is spread over the
remaining ranks K+1..V (V: the request's vocab_size) as a power law p_k ~ k^-a fitted to the top-K's
log-probability against log-rank (Zipf-like next-token distributions), and sum_k p_k^(1/T) is taken in closed
form. T = 1 is exact. An approximation otherwise: on synthetic Zipf distributions (exponents 0.8-2, 50k
tokens) the error of the target's tempered logprob was 0.0003-0.24 nats, the larger where the top 20 hold
less than half the mass (tests/unit/test_rollout_units.py); a local reference (no server) is exact."""

from __future__ import annotations

import math
from typing import Any

TOP_K = 20  # vLLM's default --max-logprobs


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


DEFAULT_VOCAB = 151_936  # Qwen2.5's, when the request does not say


def parse_vocab_size(body: Any) -> int:
    value = body.get("vocab_size") if isinstance(body, dict) else None
    try:
        vocab = int(DEFAULT_VOCAB if value is None else value)
    except (TypeError, ValueError) as err:
        raise ScoreError("vocab_size must be an integer > 0") from err
    if vocab < 1:
        raise ScoreError("vocab_size must be an integer > 0")
    return vocab


def parse_temperature(body: Any) -> float:
    value = body.get("temperature", 1.0) if isinstance(body, dict) else 1.0
    try:
        temperature = float(1.0 if value is None else value)
    except (TypeError, ValueError) as err:
        raise ScoreError("temperature must be a number > 0") from err
    if not math.isfinite(temperature) or temperature <= 0:
        raise ScoreError("temperature must be a number > 0")
    return temperature


def score_request(
    model: str, prompt: list[int], completion: list[int], temperature: float = 1.0
) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt + completion,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0 if temperature == 1.0 else TOP_K,
    }


def _value(item: Any) -> float:
    return float(item["logprob"] if isinstance(item, dict) else item)


def _power_sum(b: float, lo: int, hi: int) -> float:
    """sum_{k=lo}^{hi} k^-b, as the integral from lo - 1/2 to hi + 1/2."""
    a, z = lo - 0.5, hi + 0.5
    if abs(b - 1.0) < 1e-9:
        return math.log(z / a)
    return (z ** (1.0 - b) - a ** (1.0 - b)) / (1.0 - b)


def _tail_term(kept: list[float], temperature: float, vocab: int) -> float:
    """sum over the ranks after the top-K of p_k^(1/T), p_k a power law in the rank holding the mass left."""
    ranked = sorted(kept, reverse=True)
    k = len(ranked)
    tail = 1.0 - sum(math.exp(v) for v in ranked)
    if tail <= 0 or k < 2 or vocab <= k:
        return 0.0
    xs = [math.log(i + 1) for i in range(k)]
    mx, my = sum(xs) / k, sum(ranked) / k
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ranked, strict=True)) / sum((x - mx) ** 2 for x in xs)
    a = max(-slope, 1e-3)
    scale = tail / _power_sum(a, k + 1, vocab)
    return scale ** (1.0 / temperature) * _power_sum(a / temperature, k + 1, vocab)


def tempered_logprob(
    entry: dict[Any, Any], token: int, temperature: float, vocab: int = DEFAULT_VOCAB
) -> float:
    """The target's logprob at temperature T from one position's raw (T = 1) logprobs: the target's and the
    top-K's (see the module docstring for the estimate of the rest)."""
    values = {str(k): _value(v) for k, v in entry.items() if v is not None}
    target = values[str(token)]
    if temperature == 1.0:
        return target
    kept = list(values.values())
    top = max(v / temperature for v in kept)
    head = sum(math.exp(v / temperature - top) for v in kept)
    rest = _tail_term(kept, temperature, vocab) * math.exp(-top)
    return target / temperature - top - math.log(head + rest)


def completion_logprobs(
    response: dict[str, Any],
    prompt: list[int],
    completion: list[int],
    temperature: float = 1.0,
    vocab: int = DEFAULT_VOCAB,
) -> list[float]:
    """The logprob of each completion token at `temperature`, from a vLLM completions response with
    prompt_logprobs."""
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
        out.append(_value(item) if temperature == 1.0 else tempered_logprob(entry, token, temperature, vocab))
    return out
