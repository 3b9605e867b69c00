"""`python -m posttrain_trainer.launch <torchrun arguments>`: torchrun, run in this process, whose exit
code keeps a worker's configuration-error code (posttrain.api.exitcodes), so the trainer Job's
podFailurePolicy can fail a job whose config is wrong at once instead of retrying it, and 75 after a SIGTERM
(the pod was deleted: the workers checkpointed first, preemption.py)."""

from __future__ import annotations

import signal
import sys

from posttrain.api.exitcodes import EXIT_OK, EXIT_PREEMPTED, launcher_exit_code


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv))
    except SignalException as err:
        # torchrun forwarded the signal to the workers and waited for them (TORCH_ELASTIC_SHUTDOWN_TIMEOUT):
        # on SIGTERM they checkpoint at the next step and stop (preemption.py); a resume starts there
        print(f"posttrain_trainer.launch: stopped by {err.sigval.name}", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED if err.sigval == signal.SIGTERM else 128 + int(err.sigval)
    except ChildFailedError as err:
        codes = [failure.exitcode for failure in err.failures.values()]
        print(
            f"posttrain_trainer.launch: workers exited with {sorted(set(codes))}", file=sys.stderr, flush=True
        )
        return launcher_exit_code(codes)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
