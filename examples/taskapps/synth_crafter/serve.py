"""Serve synth's own Crafter task app, unchanged, from the synth-ai wheel (examples/task_apps/crafter/task_app
in synth-ai 0.2.19) on this machine: `<synth venv>/bin/python serve.py --host 127.0.0.1 --port 8001`.

The venv is made by hack/synth-crafter.sh (synth-ai 0.2.19 and crafter from PyPI, outside our own venv: its
dependencies are not ours). ENVIRONMENT_API_KEY must be set, as for any synth task app.

One thing outside the app is worked around here, not in it: synth-ai 0.2.19 registers two task apps under
the alias "crafter" (synth_ai.demos' "crafter-demo" and the example's "grpo-crafter-task-app"), and its
registry raises on the second, so importing the example fails once synth_ai.demos has been imported. The
registry is told to keep the first alias and go on; the app itself is synth's, byte for byte.

The app answers /rollout only with its tracer on (else HTTP 500 "trace_payload_missing"): tracing is on by
default here (TASKAPP_TRACING_ENABLED=1), into a local SQLite file in the working folder (SYNTH_TRACES_DB),
not the sqld server synth's default expects; either variable set in the environment wins."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def _tolerate_alias_clash() -> None:
    from synth_ai.task import apps

    register = apps.registry.register

    def lenient(entry):  # the entry is stored before its aliases are checked: only the alias is lost
        try:
            register(entry)
        except ValueError as err:
            if "Alias already registered" not in str(err):
                raise
            print(f"[posttrain] synth-ai registry: {err} (kept the first)", flush=True)

    apps.registry.register = lenient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    os.environ.setdefault("TASKAPP_TRACING_ENABLED", "1")
    os.environ.setdefault("SYNTH_TRACES_DB", f"sqlite+aiosqlite:///{Path.cwd() / 'synth_traces.db'}")
    _tolerate_alias_clash()
    import uvicorn
    from examples.task_apps.crafter.task_app.grpo_crafter_task_app import fastapi_app

    print(f"[posttrain] synth's Crafter task app on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(fastapi_app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
