"""Exit codes: the `posttrain` command's (CLI_EXIT_CODES) and the trainer's (TRAINER_EXIT_CODES), one table
each; docs/reference/exit-codes.md is generated from them (hack/gen_docs.py).

The trainer's exit codes are a contract between the trainer (posttrain_trainer) and the operator, whose
trainer Job fails at once (podFailurePolicy FailJob, no retry) on the configuration-error codes: running
the same job file again cannot succeed. Every other non-zero exit is a failure worth retrying (a lost
node, an out-of-memory kill, a flaky network), and a replacement pod resumes from the last checkpoint.

| code | meaning |
|---|---|
| 0 | trained (or a restarted pod found the job already finished) |
| 1 | a failure worth retrying (rollout error budget exceeded, a crash, a lost peer) |
| 2 | usage: the command line is wrong (argparse) |
| 65 | EX_DATAERR: the dataset is malformed (the message names file:line) |
| 75 | EX_TEMPFAIL: stopped by SIGTERM (Kueue preempted the job, a node drained): checkpointed first |
| 78 | EX_CONFIG: the job file or the training config is invalid |

`python -m posttrain_trainer.launch` (torchrun in process) exits with a worker's configuration-error code
when any worker exited with one; torchrun alone would exit 1 for every worker failure. A launcher that got
SIGTERM (it forwards it to the workers, which checkpoint at the next step: posttrain_trainer/preemption.py)
exits 75."""

from __future__ import annotations

from collections.abc import Iterable

TRAINER_EXIT_CODES: dict[int, str] = {
    0: "trained (or a restarted pod found the job already finished)",
    1: "a failure worth retrying (rollout error budget exceeded, a crash, a lost peer); the pod is replaced",
    2: "usage: the command line is wrong (argparse); the Job fails at once",
    65: "EX_DATAERR: the dataset is malformed (the message names file:line); the Job fails at once",
    75: "EX_TEMPFAIL: stopped by SIGTERM (Kueue preempted the job, its pod was deleted, a node drained) after "
    "saving a checkpoint at the next step; the next pod resumes from it, and the pod does not count as a failure",
    78: "EX_CONFIG: the job file or the training config is invalid; the Job fails at once",
}

# The `posttrain` command. Every subcommand keeps to these meanings.
CLI_OK = 0
CLI_FAILED = 1
CLI_USER_ERROR = 2
CLI_NOT_FOUND = 3
CLI_TIMEOUT = 4
CLI_INTERRUPTED = 130
CLI_CLOSED_PIPE = 141
CLI_EXIT_CODES: dict[int, str] = {
    CLI_OK: "success: the file was written, the check passed, the job Succeeded",
    CLI_FAILED: "the job Failed (`train`, `status NAME`), a task-app check failed (`verify-task-app`), "
    "`crds --check` found stale files, some rollouts failed (`eval`)",
    CLI_USER_ERROR: "a usage or input mistake, or an unreachable API server: one `error: file:line: field: "
    "message (fix: ...)` line per problem; with `--strict`, warnings too",
    CLI_NOT_FOUND: "no such job (`status NAME`)",
    CLI_TIMEOUT: "gave up waiting (`train --poll-timeout`, `status --watch --timeout`, `eval --cluster`)",
    CLI_INTERRUPTED: "interrupted (Ctrl-C)",
    CLI_CLOSED_PIPE: "the reader of stdout went away (`posttrain status | head -1`): the rest of the output is "
    "dropped without a traceback (128 + SIGPIPE, as a shell reports it)",
}

EXIT_OK = 0
EXIT_RETRYABLE = 1
EXIT_USAGE = 2
EXIT_DATA_ERROR = 65
EXIT_PREEMPTED = 75
EXIT_CONFIG_ERROR = 78
CONFIG_ERROR_EXIT_CODES = (EXIT_USAGE, EXIT_DATA_ERROR, EXIT_CONFIG_ERROR)


def launcher_exit_code(worker_codes: Iterable[int]) -> int:
    """The exit code of a launcher whose workers exited with `worker_codes` (at least one failed): the
    first configuration-error code among them (the job cannot succeed), 75 when the others stopped for a
    SIGTERM (checkpointed, resumable), else 1 (worth retrying)."""
    codes = list(worker_codes)
    for code in CONFIG_ERROR_EXIT_CODES:
        if code in codes:
            return code
    if EXIT_PREEMPTED in codes and all(code in (EXIT_OK, EXIT_PREEMPTED) for code in codes):
        return EXIT_PREEMPTED
    return EXIT_RETRYABLE
