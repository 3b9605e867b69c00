"""`python -m posttrain_trainer.launch <torchrun arguments>`: torchrun, run in this process, whose exit
code keeps a worker's configuration-error code (posttrain.api.exitcodes), so the trainer Job's
podFailurePolicy can fail a job whose config is wrong at once instead of retrying it."""

from __future__ import annotations

import sys

from posttrain.api.exitcodes import EXIT_OK, launcher_exit_code


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv))
    except ChildFailedError as err:
        codes = [failure.exitcode for failure in err.failures.values()]
        print(
            f"posttrain_trainer.launch: workers exited with {sorted(set(codes))}", file=sys.stderr, flush=True
        )
        return launcher_exit_code(codes)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
