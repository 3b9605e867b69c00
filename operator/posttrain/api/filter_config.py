"""synth's filter TOML (`synth-ai filter --config filter.toml`, a `[filter]` table) as a typed model, read by
`posttrain filter --config` and checked by `posttrain validate`.

Keys (synth-ai 0.2.19's task/config.FilterConfig and cli/commands/filter): db (a trace database: a path,
sqlite:///path or sqlite+aiosqlite:///path; synth's v3 database or posttrain's RL trace store; `input` is
posttrain's spelling, which also takes rollouts JSONL or an s3:// job folder), output (.jsonl or .json),
splits, task_ids, models, min_official_score / max_official_score, min_judge_scores / max_judge_scores,
min_created_at / max_created_at, limit; per_turn (posttrain: false keeps whole conversations).
Accepted and without effect (validate says so), as in synth 0.2.19, whose exporter validates them but does
not apply them: offset, shuffle, shuffle_seed. Relative paths are read from the config's folder."""

from __future__ import annotations

import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

INERT = {
    "offset": "synth 0.2.19 validates it but its exporter does not apply it; neither does posttrain",
    "shuffle": "synth 0.2.19 validates it but its exporter does not apply it; neither does posttrain",
    "shuffle_seed": "synth 0.2.19 validates it but its exporter does not apply it; neither does posttrain",
}
SERVERS = ("libsql", "http", "https", "postgres", "sqlite+libsql")


class FilterTable(BaseModel):
    """`[filter]`."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    db: str | None = None
    input: str | None = None
    output: str | None = None
    splits: list[str] = Field(default_factory=list)
    task_ids: list[str] = Field(default_factory=list)
    models: list[str] = Field(default_factory=list)
    min_official_score: float | None = None
    max_official_score: float | None = None
    min_judge_scores: dict[str, float] = Field(default_factory=dict)
    max_judge_scores: dict[str, float] = Field(default_factory=dict)
    min_created_at: str | datetime.datetime | None = None
    max_created_at: str | datetime.datetime | None = None
    limit: int | None = Field(None, ge=1)
    offset: int | None = Field(None, ge=0)
    shuffle: bool | None = None
    shuffle_seed: int | None = None
    per_turn: bool = True

    @field_validator("db")
    @classmethod
    def _db(cls, value: str | None) -> str | None:
        if value is not None and str(value).split(":", 1)[0].lower() in SERVERS:
            raise ValueError("a database server is not read here, only a local or s3:// trace database -- fix: "
                             "point db at the SQLite file (e.g. traces/v3/synth_ai.db or sqlite:///path)")  # fmt: skip
        return value

    @field_validator("output")
    @classmethod
    def _output(cls, value: str | None) -> str | None:
        if value is not None and not value.endswith((".jsonl", ".json")):
            raise ValueError("output must end in .jsonl or .json -- fix: name it e.g. sft.jsonl")
        return value

    @field_validator("min_created_at", "max_created_at", mode="before")
    @classmethod
    def _time(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"{value!r} is not an ISO time -- fix: write e.g. 2025-11-01T00:00:00Z") from None
        return value.isoformat() if isinstance(value, datetime.datetime | datetime.date) else value

    @model_validator(mode="after")
    def _rules(self) -> FilterTable:
        if self.shuffle_seed is not None and not self.shuffle:
            raise ValueError("shuffle_seed needs shuffle = true -- fix: set shuffle = true or drop shuffle_seed")
        low, high = self.min_official_score, self.max_official_score
        if low is not None and high is not None and low > high:
            raise ValueError("min_official_score is above max_official_score -- fix: swap them")
        return self

    def source(self) -> str | None:
        return self.input or self.db


def load_filter_config(text: str, file: str | None = None) -> tuple[FilterTable, list[str]]:
    """synth filter TOML text -> ([filter] model, warnings); UserError with file:line per problem."""
    from posttrain.api.convert import parse_toml
    from posttrain.api.table_check import check_table

    raw = parse_toml(text, file)
    table, warnings = check_table(FilterTable, raw, "filter", text=text, file=file, inert=INERT)
    others = sorted(k for k in raw if k != "filter")
    warnings += [f"{file + ': ' if file else ''}[{k}]: a filter config reads only [filter]; ignored" for k in others]
    return table, warnings
