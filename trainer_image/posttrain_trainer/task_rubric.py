"""The rubrics a judge scores against: [judge.options.rubric_overrides.outcome|event] where given, else the
task app's own, from GET /task_info (synth's behaviour: TaskInfo.rubric = {outcome?: {name, criteria: [{id,
description, weight?}]}, events?: {...}}; the taskset's rubric, else the first training seed's).

A task app's reply is untrusted. At most MAX_BODY_BYTES of it are read; its rubric must fit TaskRubric's
shape (pydantic); every text is cut to MAX_TEXT characters, ids to MAX_ID, criteria to MAX_CRITERIA. A reply
that does not fit gives no rubric: the judge then scores with its generic prompt, and the reason (the HTTP
status or the failing field's location, never the reply's text) is printed and recorded.

JudgeRubrics.record() is what the job keeps of it: the rubric of each judged score and where it came from
(overrides | task_info | none), in the artifacts manifest (metrics.judge_rubric) and the trace store
(traces.JOB_METADATA row "judge_rubric", and each rollout's metadata.judge_rubric_source)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from posttrain.api.judge_settings import JudgedKind, JudgeSettings, RubricSource
from posttrain.api.sections import RubricCriterion, RubricOverride
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

MAX_BODY_BYTES = 1 << 20
MAX_TEXT = 2_000
MAX_ID = 128
MAX_CRITERIA = 64
TIMEOUT_S = 30.0


def _cut(limit: int) -> BeforeValidator:
    return BeforeValidator(lambda v: v[:limit] if isinstance(v, str) else v)


def _first(limit: int) -> BeforeValidator:
    return BeforeValidator(lambda v: v[:limit] if isinstance(v, list) else v)


class TaskCriterion(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: Annotated[str, _cut(MAX_ID), Field(min_length=1)]
    description: Annotated[str, _cut(MAX_TEXT)] = ""
    weight: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = 1.0
    scale: Literal["binary", "bounded"] = "bounded"


class TaskRubricSection(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: Annotated[str | None, _cut(MAX_ID)] = None
    goal_text: Annotated[str | None, _cut(MAX_TEXT)] = None
    aggregation: Literal["weighted_sum", "sum", "mean"] = "weighted_sum"
    criteria: Annotated[list[TaskCriterion], _first(MAX_CRITERIA)] = Field(default_factory=list)

    def override(self) -> RubricOverride:
        """As the judge client reads a rubric (the TOML's rubric_overrides shape); the name is its goal."""
        return RubricOverride(
            goal_text=self.goal_text or self.name,
            aggregation="weighted_sum" if self.aggregation == "sum" else self.aggregation,
            criteria=[RubricCriterion(**c.model_dump()) for c in self.criteria],
        )


class TaskRubric(BaseModel):
    model_config = ConfigDict(extra="ignore")

    outcome: TaskRubricSection | None = None
    events: TaskRubricSection | None = None
    event: TaskRubricSection | None = None  # a task app that spells it as the TOML does

    def section(self, kind: JudgedKind) -> TaskRubricSection | None:
        return self.outcome if kind == "outcome" else (self.events or self.event)


@dataclass
class JudgeRubrics:
    """The rubric of each judged score (None: the generic prompt) and its source."""

    rubrics: dict[str, RubricOverride | None] = field(default_factory=dict)
    sources: dict[str, RubricSource] = field(default_factory=dict)
    note: str | None = None  # why the task app's rubric could not be used

    def for_client(self) -> dict[str, dict[str, Any] | None]:
        return {
            k: (r.model_dump(exclude_none=True) if r is not None else None) for k, r in self.rubrics.items()
        }

    @property
    def source(self) -> RubricSource:
        """One word for the job: task_info where any judged score uses the task app's, else overrides, else none."""
        values = set(self.sources.values())
        return "task_info" if "task_info" in values else "overrides" if "overrides" in values else "none"

    def record(self) -> dict[str, Any]:
        return {
            "source": self.source,
            **{
                kind: {
                    "source": self.sources[kind],
                    "rubric": r.model_dump(exclude_none=True) if r is not None else None,
                }
                for kind, r in self.rubrics.items()
            },
            **({"note": self.note} if self.note else {}),
        }


def parse_rubric(body: Any) -> TaskRubric | None:
    """/task_info's rubric: {"taskset": {..., "rubric": R}}, a TaskInfo {..., "rubric": R} or a list of them
    (the first). None when the reply carries none; ValidationError when R does not fit the shape."""
    if isinstance(body, list):
        body = body[0] if body else None
    if not isinstance(body, dict):
        return None
    holder = body.get("taskset") if isinstance(body.get("taskset"), dict) else body
    rubric = holder.get("rubric")
    if rubric is None:
        return None
    parsed = TaskRubric.model_validate(rubric)
    return parsed if (parsed.outcome or parsed.events or parsed.event) else None


def _where(err: ValidationError) -> str:
    first = err.errors()[0] if err.errors() else {}
    return ".".join(str(p) for p in first.get("loc", ())) + f" ({first.get('type', 'invalid')})"


def _get_json(http: Any, url: str, params: dict[str, Any] | None = None) -> Any:
    """A bounded GET: at most MAX_BODY_BYTES read; ValueError with the status (never the body) otherwise."""
    with http.stream("GET", url, params=params) as response:
        if response.status_code >= 400:
            raise ValueError(f"GET /task_info -> HTTP {response.status_code}")
        data = b""
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) > MAX_BODY_BYTES:
                raise ValueError(f"GET /task_info replied with more than {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(data)
    except ValueError:
        raise ValueError("GET /task_info did not reply with JSON") from None


def fetch_task_rubric(
    task_url: str, headers: dict[str, str], seed: int, *, transport: Any = None
) -> tuple[TaskRubric | None, str | None]:
    """(the task app's rubric or None, why there is none when it could not be read)."""
    import httpx
    from posttrain.api.urls import join_url

    url = join_url(task_url, "/task_info")
    try:
        with httpx.Client(timeout=TIMEOUT_S, headers=headers, transport=transport) as http:
            rubric = parse_rubric(_get_json(http, url))
            if rubric is None:  # no taskset-wide rubric: the first training seed's
                rubric = parse_rubric(_get_json(http, url, params={"seed": seed}))
    except ValidationError as err:
        return None, f"the task app's rubric does not fit the rubric shape at {_where(err)}"
    except (ValueError, httpx.HTTPError) as err:
        reason = str(err) if isinstance(err, ValueError) else f"GET /task_info failed ({type(err).__name__})"
        return None, reason
    return rubric, None


def judge_rubrics(
    settings: JudgeSettings,
    *,
    task_url: str | None,
    headers: dict[str, str],
    seed: int,
    transport: Any = None,
) -> JudgeRubrics:
    """Each judged score's rubric: its override, else the task app's (fetched once, only when needed)."""
    out = JudgeRubrics()
    wanted = [kind for kind in settings.judged() if settings.override(kind) is None]
    task: TaskRubric | None = None
    if wanted:
        if task_url:
            task, out.note = fetch_task_rubric(task_url, headers, seed, transport=transport)
        else:
            out.note = "no task app URL to ask /task_info"
    for kind in settings.judged():
        override = settings.override(kind)
        if override is not None:
            out.rubrics[kind], out.sources[kind] = override, "overrides"
            continue
        section = task.section(kind) if task is not None else None
        out.rubrics[kind] = section.override() if section is not None else None
        out.sources[kind] = "task_info" if section is not None else "none"
    return out
