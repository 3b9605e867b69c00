"""Start a task app as a local process (the bundled math task app by default) and wait until it answers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from posttrain.local.processes import ManagedProcess, ProcessSet, wait_http
from posttrain.localhost import free_port

REPO_ROOT = Path(__file__).resolve().parents[3]
MATH_APP = REPO_ROOT / "examples" / "taskapps" / "math" / "app.py"


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
