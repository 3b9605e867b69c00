"""Seed lists as people write them ("0-99", "1,2,5") and back: pure, shared by the [eval] model and the
evaluation commands."""

from __future__ import annotations


def parse_seeds(text: str, *, limit: int = 1_000_000) -> list[int]:
    """ "0-99", "1,2,5", "1000000-1000063,7": seeds in order, duplicates removed; ValueError on bad text."""
    seeds: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ValueError(f"{part!r} is not a seed or a range like 0-99") from None
        if first < 0 or last < first:
            raise ValueError(f"{part!r}: seeds are >= 0 and a range goes up (e.g. 0-99)")
        if last - first + 1 + len(seeds) > limit:
            raise ValueError(f"more than {limit} seeds")
        seeds.extend(range(first, last + 1))
    if not seeds:
        raise ValueError("no seeds")
    return list(dict.fromkeys(seeds))


def format_seeds(seeds: list[int]) -> str:
    """The inverse of parse_seeds: runs of consecutive seeds as ranges ("0-99,200")."""
    parts: list[str] = []
    start = prev = None
    for seed in seeds:
        if prev is not None and seed == prev + 1:
            prev = seed
            continue
        if start is not None:
            parts.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = seed
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(parts)
