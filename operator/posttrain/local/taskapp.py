"""The task app of a local run: which one (`choose_task_app`: a URL, or a script to start) and starting a
task app script as a local process that answers before the job goes on."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from posttrain.errors import Problem, UserError
from posttrain.local.processes import ManagedProcess, ProcessSet, wait_http
from posttrain.localhost import free_port

REPO_ROOT = Path(__file__).resolve().parents[3]
MATH_APP = REPO_ROOT / "examples" / "taskapps" / "math" / "app.py"
CRAFTWORLD_APP = REPO_ROOT / "examples" / "taskapps" / "craftworld" / "app.py"
SHAPES_APP = REPO_ROOT / "examples" / "taskapps" / "shapes" / "app.py"  # vision: coloured shapes


def start_taskapp(
    procs: ProcessSet,
    *,
    api_key: str,
    log_dir: Path,
    app_path: Path | None = None,
    port: int | None = None,
    timeout: float = 60.0,
) -> tuple[str, ManagedProcess]:
    """Returns (base URL, process). The app gets ENVIRONMENT_API_KEY=api_key and binds 127.0.0.1."""
    app_path = Path(app_path or os.environ.get("POSTTRAIN_TASKAPP", MATH_APP))
    port = port or free_port()
    env = {**os.environ, "ENVIRONMENT_API_KEY": api_key}
    env.pop("ENVIRONMENT_API_KEY_ALIASES", None)
    proc = procs.start(
        "task-app",
        [sys.executable, str(app_path), "--host", "127.0.0.1", "--port", str(port)],
        log_dir / "taskapp.log",
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/", timeout=timeout, proc=proc)
    return url, proc


# The environments the bundled task apps serve (env_name -> script); other environments need their own app.
BUNDLED = {"math": MATH_APP, "craftworld": CRAFTWORLD_APP, "shapes": SHAPES_APP}
PLACEHOLDER_URLS = ("", "placeholder")


def choose_task_app(
    config: dict[str, Any], *, cli_url: str | None, env: dict[str, str], script: Path | None
) -> tuple[str, str | Path]:
    """("url", URL) of a running task app or ("start", script) to start one, as synth resolves the task
    URL: --task-url, then $TASK_APP_URL, then [services].task_url; with none of them, --task-app-script, or
    the bundled app of the config's environment (math, craftworld or shapes: starting one for another environment
    would train on the wrong task). A UserError when nothing serves the environment."""
    services = config.get("services") if isinstance(config.get("services"), dict) else {}
    rollout = config.get("rollout") if isinstance(config.get("rollout"), dict) else {}
    for url in (cli_url, env.get("TASK_APP_URL"), services.get("task_url")):
        if url and str(url).strip() not in PLACEHOLDER_URLS:
            return "url", str(url)
    if script is not None:
        return "start", Path(script)
    env_name = str(rollout.get("env_name") or "")
    if env_name in BUNDLED:
        return "start", Path(env.get("POSTTRAIN_TASKAPP") or BUNDLED[env_name])
    raise UserError(
        Problem(
            f"no task app for environment {env_name!r}: the bundled app serves only {', '.join(BUNDLED)}",
            field="services.task_url",
            fix="start the environment's task app and pass --task-url URL (or set TASK_APP_URL or "
            "[services].task_url), or pass --task-app-script SCRIPT",
        )
    )
