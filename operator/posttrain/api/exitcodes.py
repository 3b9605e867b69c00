"""The trainer's exit codes, a contract between the trainer (posttrain_trainer) and the operator, whose
trainer Job fails at once (podFailurePolicy FailJob, no retry) on the configuration-error codes: running
the same job file again cannot succeed. Every other non-zero exit is a failure worth retrying (a lost
node, an out-of-memory kill, a flaky network), and a replacement pod resumes from the last checkpoint.

| code | meaning |
|---|---|
| 0 | trained (or a restarted pod found the job already finished) |
| 1 | a failure worth retrying (rollout error budget exceeded, a crash, a lost peer) |
| 2 | usage: the command line is wrong (argparse) |
| 65 | EX_DATAERR: the dataset is malformed (the message names file:line) |
| 78 | EX_CONFIG: the job file or the training config is invalid |

`python -m posttrain_trainer.launch` (torchrun in process) exits with a worker's configuration-error code
when any worker exited with one; torchrun alone would exit 1 for every worker failure."""

from __future__ import annotations

from collections.abc import Iterable

EXIT_OK = 0
EXIT_RETRYABLE = 1
EXIT_USAGE = 2
EXIT_DATA_ERROR = 65
EXIT_CONFIG_ERROR = 78
CONFIG_ERROR_EXIT_CODES = (EXIT_USAGE, EXIT_DATA_ERROR, EXIT_CONFIG_ERROR)


def launcher_exit_code(worker_codes: Iterable[int]) -> int:
    """The exit code of a launcher whose workers exited with `worker_codes` (at least one failed): the
    first configuration-error code among them (the job cannot succeed), else 1 (worth retrying)."""
    codes = list(worker_codes)
    for code in CONFIG_ERROR_EXIT_CODES:
        if code in codes:
            return code
    return EXIT_RETRYABLE
