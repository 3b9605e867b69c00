"""[eval.judge] / [[eval.judges]]: synth's Python judges. Each is a function `judge(payload, **kwargs)` from a
.py file (`path`) or a module; the payload is synth's (seed, prompt_index, prompt, completion, metrics, the
task app's response and its v3 trace); a number back is the judge's score for that rollout, anything else
(or an exception) is no score, printed as synth prints it (seed=N judge[NAME]_error=...). A judge is the
user's own code, run in this process on their machine, as synth runs it."""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.api.eval_config import EvalJudge
from posttrain.errors import Problem, UserError


@dataclass
class Judge:
    name: str
    fn: Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)


def _find(path: str, config: Path | None) -> Path | None:
    """synth reads a judge's path from the working directory; a config's relative path is also tried from
    the config's folder and each folder above it (the wheel's examples name paths from its root)."""
    given = Path(path).expanduser()
    if given.is_absolute():
        return given if given.is_file() else None
    bases = [Path.cwd()] + ([config.resolve().parent, *config.resolve().parent.parents] if config else [])
    return next((base / given for base in bases if (base / given).is_file()), None)


def load_judges(specs: list[EvalJudge], *, config: Path | None, file: str | None) -> list[Judge]:
    out = []
    for spec in specs:
        field_name = f"eval.judge.{spec.name}" if spec.name else "eval.judge"
        try:
            if spec.module:
                module = importlib.import_module(spec.module)
            else:
                found = _find(str(spec.path), config)
                if found is None:
                    raise UserError(Problem(f"judge file {spec.path!r} not found", file=file, field=f"{field_name}.path",
                                            fix="give a path from the working directory or the config's folder"))  # fmt: skip
                loaded = importlib.util.spec_from_file_location(f"posttrain_eval_judge_{found.stem}", found)
                assert loaded is not None and loaded.loader is not None
                module = importlib.util.module_from_spec(loaded)
                loaded.loader.exec_module(module)
        except UserError:
            raise
        except Exception as err:  # the user's module failed to import: say which and why, in one line
            raise UserError(Problem(f"cannot load the judge: {type(err).__name__}: {err}"[:300], file=file,
                                    field=field_name, fix="fix the judge module")) from None  # fmt: skip
        fn = getattr(module, spec.function_name(), None)
        if not callable(fn):
            raise UserError(Problem(f"the judge module has no function {spec.function_name()!r}", file=file,
                                    field=field_name, fix="define judge(payload, **kwargs) or set callable"))  # fmt: skip
        out.append(Judge(str(spec.name), fn, spec.kwargs()))
    return out


def check_judges(specs: list[EvalJudge], *, config: Path | None, file: str | None) -> list[Problem]:
    """What `validate` checks without running the user's code: each judge's file exists or its module is
    importable."""
    problems = []
    for spec in specs:
        field_name = f"eval.judge.{spec.name}" if spec.name else "eval.judge"
        if spec.path and _find(spec.path, config) is None:
            problems.append(Problem(f"judge file {spec.path!r} not found", file=file, field=f"{field_name}.path",
                                    fix="give a path from the working directory or the config's folder"))  # fmt: skip
        if spec.module:
            try:
                found = importlib.util.find_spec(spec.module)
            except (ImportError, ValueError):
                found = None
            if found is None:
                problems.append(Problem(f"judge module {spec.module!r} is not importable", file=file,
                                        field=f"{field_name}.module", fix="install it or use path = FILE"))  # fmt: skip
    return problems


def payload(seed: int, response: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """synth's judge payload for one rollout."""
    trajectories = response.get("trajectories") if isinstance(response.get("trajectories"), list) else []
    obs = {}
    if trajectories and isinstance(trajectories[0], dict):
        steps = trajectories[0].get("steps") or []
        if steps and isinstance(steps[0], dict) and isinstance(steps[0].get("obs"), dict):
            obs = steps[0]["obs"]
    index = obs.get("prompt_index")
    return {
        "seed": seed,
        "prompt_index": index if isinstance(index, int) else None,
        "prompt": row.get("prompt"),
        "completion": row.get("completion"),
        "metrics": response.get("metrics"),
        "response": response,
        "trace": response.get("trace") if isinstance(response.get("trace"), dict) else None,
    }


def score(judges: list[Judge], seed: int, response: dict[str, Any], row: dict[str, Any]) -> tuple[dict[str, float | None], list[str]]:
    """({judge name: score or None}, error lines as synth prints them)."""
    scores: dict[str, float | None] = {}
    errors: list[str] = []
    for judge in judges:
        value: float | None = None
        try:
            result = judge.fn(payload(seed, response, row), **judge.kwargs)
            if isinstance(result, int | float) and not isinstance(result, bool) and math.isfinite(result):
                value = float(result)
        except Exception as err:  # a judge's failure is that rollout's missing score, as in synth
            errors.append(f"seed={seed} judge[{judge.name}]_error={type(err).__name__}: {err}"[:500])
        scores[judge.name] = value
    return scores, errors
