"""Env files for `posttrain train` and `posttrain eval`, as synth-ai's CLI loads them: `--env-file FILE`
(repeatable; a later file wins over an earlier one), else `.env` in the working folder when there is one.

Values go into this process's environment only, where the commands already look (ENVIRONMENT_API_KEY,
TASK_APP_URL, S3_*, judge provider keys...): the cluster path turns ENVIRONMENT_API_KEY into a Secret, never
into the custom resource, and nothing here prints a value. Precedence: a file named with --env-file wins
over the environment (the user asked for it); the default `.env` only fills what the environment lacks
(synth preloads it the same way).

A value that says where something is sent never changes it silently: every URL the commands take from the
environment is printed with its origin before anything is sent (url_notices), e.g.
`task app URL http://x from ./.env (TASK_APP_URL), not the TOML's http://y`. The precedence is synth's
(--task-url, then TASK_APP_URL, then [services].task_url); the notice says when it applied."""

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
    sources: dict[str, Path] = field(default_factory=dict)  # name -> the file its value came from (last wins)

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
        values = read_env_file(path, field_name="--env-file" if override else DEFAULT_NAME)
        loaded.values.update(values)
        loaded.sources.update({key: path for key in values})
        loaded.files.append(path)
    for key, value in loaded.values.items():
        if override or key not in environ:
            environ[key] = value
            loaded.applied.append(key)
    return loaded


# Variables naming a place the commands send something to (a key, a dataset, a model): printed with their
# origin whenever they come from the environment or an env file. TASK_APP_URL beats the TOML's
# [services].task_url (synth's order) and gets ENVIRONMENT_API_KEY.
URL_SUFFIXES = ("_URL", "_ENDPOINT", "_BASE_URL", "_HOST")
TOML_URLS = {"TASK_APP_URL": ("services", "task_url")}
PLACEHOLDERS = {"", "http://localhost:8000", "<task-app-url>"}


def _shown(url: str) -> str:
    """A URL for a message: without user info (a password in a URL is still a password)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "<not a URL>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def origin(name: str, loaded: LoadedEnv, environ: MutableMapping[str, str]) -> str:
    """Where the environment's value of `name` came from: an env file (named) or the environment itself."""
    path = loaded.sources.get(name)
    if path is not None and name in loaded.applied:
        try:  # ./.env rather than the whole path, for a file in the working folder
            shown = f"./{path.resolve().relative_to(Path.cwd().resolve())}"
        except ValueError:
            shown = str(path)
        return f"{shown} ({name})"
    return f"the environment ({name})"


def url_notices(
    loaded: LoadedEnv,
    environ: MutableMapping[str, str],
    toml: dict[str, object],
    *,
    given: dict[str, str | None] | None = None,
    unused: frozenset[str] = frozenset(),
) -> list[str]:
    """One line per URL-like variable the command will use from the environment, with its origin; for one
    that beats a TOML value (TASK_APP_URL over [services].task_url), the value it beats. `given` maps a
    variable to the command-line value that overrides it (e.g. {"TASK_APP_URL": args.task_url}): then the
    environment's value is not used and not announced; nor is one in `unused` (TASK_APP_URL for SFT)."""
    lines = []
    given = given or {}
    names = {n for n in environ if n in TOML_URLS} | {
        n for n in loaded.applied if n.upper().endswith(URL_SUFFIXES)
    }
    for name in sorted(names):
        value = environ.get(name, "")
        if not value.strip() or given.get(name) or name in unused:
            continue
        where = origin(name, loaded, environ)
        if name in TOML_URLS:
            section, key = TOML_URLS[name]
            table = toml.get(section)
            theirs = str(table.get(key) or "") if isinstance(table, dict) else ""
            line = f"task app URL {_shown(value)} from {where}"
            if theirs.strip() and theirs.strip() not in PLACEHOLDERS and theirs != value:
                line += f", not the TOML's {_shown(theirs)}"
            line += " (ENVIRONMENT_API_KEY is sent there; --task-url or unsetting TASK_APP_URL chooses another)"
        else:
            line = f"{name} {_shown(value)} from {where}"
        lines.append(line)
    return lines
