"""Env files for `posttrain train` and `posttrain eval`, as synth-ai's CLI loads them: `--env-file FILE`
(repeatable; a later file wins over an earlier one), else `.env` in the working folder when there is one.

Values go into this process's environment only, where the commands already look (ENVIRONMENT_API_KEY,
TASK_APP_URL, S3_*, judge provider keys...): the cluster path turns ENVIRONMENT_API_KEY into a Secret, never
into the custom resource, and nothing here prints a value. Precedence: a file named with --env-file wins
over the environment (the user asked for it); the default `.env` only fills what the environment lacks
(synth preloads it the same way)."""

from __future__ import annotations

import io
import os
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_NAME = ".env"


@dataclass
class LoadedEnv:
    files: list[Path] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)  # names set in the environment (never values)

    def summary(self) -> str:
        """What was loaded, for a log line: file names and variable names, no value."""
        if not self.files:
            return "no env file"
        names = ", ".join(sorted(self.applied)) or "nothing new"
        return f"env file(s) {', '.join(str(f) for f in self.files)}: {names}"


def read_env_file(path: Path, *, field_name: str = "--env-file") -> dict[str, str]:
    """KEY=VALUE lines in python-dotenv's format (comments, quotes, `export`); keys without a value dropped."""
    from dotenv import dotenv_values

    from posttrain.inputs import read_text_input

    text = read_text_input(path, what="env file", field=field_name)
    return {k: v for k, v in dotenv_values(stream=io.StringIO(text)).items() if v is not None}


def load_env_files(
    explicit: Sequence[Path] | None,
    *,
    cwd: Path | None = None,
    environ: MutableMapping[str, str] | None = None,
) -> LoadedEnv:
    """Read the env files (explicit ones, else ./.env) and put their values into `environ` (os.environ)."""
    environ = os.environ if environ is None else environ
    loaded = LoadedEnv()
    if explicit:
        files, override = [Path(p) for p in explicit], True
    else:
        default = (cwd or Path.cwd()) / DEFAULT_NAME
        files, override = ([default] if default.is_file() else []), False
    for path in files:
        loaded.values.update(read_env_file(path, field_name="--env-file" if override else DEFAULT_NAME))
        loaded.files.append(path)
    for key, value in loaded.values.items():
        if override or key not in environ:
            environ[key] = value
            loaded.applied.append(key)
    return loaded
