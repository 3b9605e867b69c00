"""`python -m posttrain_trainer {sft,rl} --config job.json` (under torchrun for several processes)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from posttrain.api import trackers
from posttrain.api.exitcodes import EXIT_CONFIG_ERROR, EXIT_PREEMPTED
from posttrain.api.jobfile import load_jobfile
from pydantic import ValidationError

from posttrain_trainer import preemption


def main(argv: list[str] | None = None) -> int:
    """Exit codes: posttrain.api.exitcodes (a job file that cannot be read is a configuration error)."""
    parser = argparse.ArgumentParser(prog="python -m posttrain_trainer")
    parser.add_argument("kind", choices=["sft", "rl"])
    parser.add_argument("--config", required=True, help="the job file (JSON) the operator wrote")
    args = parser.parse_args(argv)
    try:
        job = load_jobfile(args.config)
    except (OSError, ValueError, ValidationError) as err:
        print(f"error: job file {args.config}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return EXIT_CONFIG_ERROR
    if job.kind != args.kind:
        print(f"error: job file kind is {job.kind!r} but the command says {args.kind!r}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    problems = trackers.problems(list(job.settings.report_to or []), os.environ)
    if problems:  # [training] report_to names a tracker this image or environment cannot serve
        for message, fix in problems:
            print(f"error: {trackers.FIELD}: {message} (fix: {fix})", file=sys.stderr, flush=True)
        return EXIT_CONFIG_ERROR
    preemption.install()  # SIGTERM: checkpoint after the current step, then exit 75
    # the module that runs the job's algorithm (posttrain.api.settings: rl, restem_job or sft)
    run = importlib.import_module(f"posttrain_trainer.{job.settings.trainer}").main
    try:
        return int(run(job) or 0)
    except preemption.Preempted as stopped:
        print(f"[posttrain] {stopped}", file=sys.stderr, flush=True)
        from posttrain_trainer import distributed as D

        D.shutdown()
        return EXIT_PREEMPTED


if __name__ == "__main__":
    sys.exit(main())
