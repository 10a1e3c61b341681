"""The lmforge CLI with pauses at named points of the training loop, so a test can kill the run there:

    python tests/pausing_cli.py POINT[@STEP]:SECONDS[,...] ARGS...

Points are the loop's callback points (`lmforge.train.callbacks`): step, eval, checkpoint; with @STEP only at that
step. Before pausing, one line "pausing S s at POINT (step N)" goes to stderr (flushed), so the test can wait for
it and then send a signal."""

from __future__ import annotations

import sys
import time

from lmforge.cli import main
from lmforge.train.callbacks import install


def pause_at(point: str, seconds: float, only: int | None = None) -> None:
    def pause(step: int) -> None:
        if only is not None and step != only:
            return
        print(f"pausing {seconds:g} s at {point} (step {step})", file=sys.stderr, flush=True)
        time.sleep(seconds)

    install(point, pause)  # type: ignore[arg-type]


if __name__ == "__main__":
    for part in sys.argv[1].split(","):
        where, _, seconds = part.partition(":")
        point, _, step = where.partition("@")
        pause_at(point, float(seconds), int(step) if step else None)
    sys.exit(main(sys.argv[2:]))
