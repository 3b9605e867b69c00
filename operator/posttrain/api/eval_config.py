"""synth's eval TOML (`synth-ai eval --config eval.toml`, an `[eval]` table) as a typed model, read by
`posttrain eval --config` and checked by `posttrain validate`.

What each key does here (synth-ai 0.2.19's cli/commands/eval and task/config.EvalConfig):
  task_app_url    the task app (--task-url and TASK_APP_URL win, as for train)
  model           the model to evaluate (--model wins)
  seeds           a list, or "0-9,12" text (--seeds wins)
  split           env.config.split (synth's default "train")
  max_turns       the rollout's ops: [agent, env] x max_turns
  max_llm_calls   the same when max_turns is unset (policy_config.max_llm_calls first; synth's default 10)
  ops             the rollout's ops verbatim (wins over both)
  concurrency     rollouts at a time (synth's default 1)
  env_name, policy_name, env_config, policy_config   env.* and policy.* of each /rollout request;
                  policy_config.inference_url names a server already serving the model (as --inference-url;
                  --inference-url, or --model-path to serve weights here, win over it)
  return_trace, trace_format   record.return_trace / record.trace_format of each request (the v3 trace a
                  task app returns is written by --sqlite)
  env_file        KEY=VALUE file(s) loaded before the task app key is read (--env-file wins)
  judge / judges  Python judges: path (a .py file) or module, callable (default `judge`), name, and every
                  other key passed to it as a keyword; called per rollout with synth's payload (seed, prompt,
                  completion, metrics, response, trace); its score is printed per seed and as a mean, and
                  stored as metadata.judge_scores (what `filter`'s min_judge_scores reads)
Accepted and without effect (validate says so): app_id (no app registry here: the task app is a URL),
metadata and metadata_sql (synth's seed selection by /task_info metadata)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from posttrain.api.seeds import parse_seeds

INERT = {
    "app_id": "there is no task app registry: the task app is task_app_url, --task-url or TASK_APP_URL",
    "metadata": "seeds are not selected by /task_info metadata here: list them in seeds",
    "metadata_sql": "seeds are not selected by /task_info metadata here: list them in seeds",
}
DEFAULT_LLM_CALLS = 10  # synth's ops when neither max_turns, max_llm_calls nor ops is set
MAX_OPS = 2_000


class EvalJudge(BaseModel):
    """One Python judge: `judge(payload, **kwargs) -> float | None`."""

    model_config = ConfigDict(extra="allow")

    path: str | None = Field(None, description="a .py file defining the judge (relative to the config)")
    module: str | None = Field(None, description="an importable module defining the judge")
    callable: str | None = Field(None, description="the function's name (default judge)")
    function: str | None = Field(None, description="alias of callable")
    name: str | None = Field(None, description="the judge's name in the output")

    @model_validator(mode="after")
    def _one_source(self) -> EvalJudge:
        if bool(self.path) == bool(self.module):
            raise ValueError("a judge needs exactly one of path and module -- fix: "
                             'set path = "judges/my_judge.py" (a file defining judge(payload, **kwargs))')  # fmt: skip
        return self

    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def function_name(self) -> str:
        return self.callable or self.function or "judge"


class EvalTable(BaseModel):
    """`[eval]`."""

    model_config = ConfigDict(extra="allow")

    app_id: str | None = None
    task_app_url: str | None = None
    model: str | None = None
    seeds: list[int] | None = None
    split: str | None = None
    max_turns: int | None = Field(None, ge=1, le=MAX_OPS // 2)
    max_llm_calls: int | None = Field(None, ge=1, le=MAX_OPS // 2)
    ops: list[str] | None = Field(None, min_length=1, max_length=MAX_OPS)
    concurrency: int | None = Field(None, ge=1, le=1024)
    env_name: str | None = None
    policy_name: str | None = None
    env_config: dict[str, Any] = Field(default_factory=dict)
    policy_config: dict[str, Any] = Field(default_factory=dict)
    return_trace: bool | None = None
    trace_format: Literal["compact", "full", "structured"] | None = None
    env_file: list[str] | None = None
    judge: dict[str, Any] | None = None
    judges: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] | list[str] | str | None = None
    metadata_sql: str | dict[str, Any] | None = None

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return [value]
        if isinstance(value, str):
            try:
                return parse_seeds(value)
            except ValueError as err:
                raise ValueError(f"{err} -- fix: write seeds = [0, 1, 2] or \"0-99\"") from None
        if isinstance(value, list) and any(isinstance(v, int) and not isinstance(v, bool) and v < 0 for v in value):
            raise ValueError("seeds are >= 0 -- fix: write seeds = [0, 1, 2]")
        return value

    @field_validator("env_file", mode="before")
    @classmethod
    def _env_file(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("task_app_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        from posttrain.api.sections import ServicesConfig

        if value is not None:
            ServicesConfig.model_validate({"task_url": value})  # the rule of [services].task_url
        return value

    def judge_specs(self) -> list[EvalJudge]:
        """synth's reading: [eval.judge] with path/module/... is one judge; otherwise each sub-table of
        [eval.judge] is a judge named by its key; [[eval.judges]] adds more."""
        out: list[EvalJudge] = []
        direct = {"module", "path", "callable", "function", "name"}
        judge = self.judge or {}
        nested = {k: v for k, v in judge.items() if isinstance(v, dict)}
        if judge and any(k in judge for k in direct) and not nested:
            out.append(EvalJudge.model_validate(judge))
        else:
            for name, table in nested.items():
                out.append(EvalJudge.model_validate({"name": name, **table}))
        for index, table in enumerate(self.judges or [], start=1):
            out.append(EvalJudge.model_validate({"name": table.get("name") or f"judge{index}", **table}))
        for index, spec in enumerate(out, start=1):
            spec.name = spec.name or f"judge{index}"
        return out

    @model_validator(mode="after")
    def _judges_parse(self) -> EvalTable:
        self.judge_specs()  # a bad judge table is refused with the rest
        return self

    def turns(self) -> int:
        """[agent, env] pairs when ops is unset: max_turns, else policy_config.max_llm_calls, else
        max_llm_calls, else synth's 10."""
        calls = self.policy_config.get("max_llm_calls")
        if self.max_turns is not None:
            return self.max_turns
        if isinstance(calls, int) and not isinstance(calls, bool) and calls >= 1:
            return min(calls, MAX_OPS // 2)
        return self.max_llm_calls or DEFAULT_LLM_CALLS


def load_eval_config(text: str, file: str | None = None) -> tuple[EvalTable, list[str]]:
    """synth eval TOML text -> ([eval] model, warnings); UserError with file:line per problem."""
    from posttrain.api.convert import parse_toml
    from posttrain.api.table_check import check_table

    raw = parse_toml(text, file)
    if "eval" not in raw:  # synth's eval reads a file without [eval] as the table itself (older configs)
        raw = {"eval": raw}
        text = None  # keys are at the top level, not under [eval]: no line to point at
    table, warnings = check_table(EvalTable, raw, "eval", text=text, file=file, inert=INERT)
    others = sorted(k for k in raw if k != "eval")
    warnings += [f"{file + ': ' if file else ''}[{k}]: an eval config reads only [eval]; ignored" for k in others]
    return table, warnings
