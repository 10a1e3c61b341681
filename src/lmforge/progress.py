"""Progress feedback for long phases (tokenizer training, data preparation, fetches, evaluation, fine-tuning):
`tqdm` bars with rate and ETA on stderr, and status lines, all silenced by `--quiet` (or LMFORGE_QUIET=1, which
torchrun workers and subprocesses inherit)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm

ENV_VAR = "LMFORGE_QUIET"


def set_quiet(value: bool) -> None:
    """Silence (or restore) every bar and status line of this process and of the processes it starts."""
    if value:
        os.environ[ENV_VAR] = "1"
    else:
        os.environ.pop(ENV_VAR, None)


def is_quiet() -> bool:
    return os.environ.get(ENV_VAR, "") not in ("", "0")


def progress(
    iterable: Iterable | None = None, *, total: float | None = None, desc: str = "", unit: str = "it", **kw: Any
) -> tqdm:
    """A progress bar over `iterable` (or one advanced with `.update(n)`), with rate and ETA.

    On a terminal it refreshes in place and clears itself at the end; in a log file it writes a line at most every
    30 s, in ASCII, and ends with its final count and rate on a line of its own, so logs stay short and readable."""
    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
    kw.setdefault("mininterval", 0.2 if tty else 30.0)
    return tqdm(
        iterable, total=total, desc=desc, unit=unit, file=sys.stderr, disable=is_quiet(), leave=not tty,
        ascii=not tty, dynamic_ncols=True, **kw,
    )  # fmt: skip


def status(message: str) -> None:
    """One status line on stderr (what is happening now), unless quiet."""
    if not is_quiet():
        print(message, file=sys.stderr, flush=True)


def terminal_progress() -> bool:
    """Whether a library's own progress bar (e.g. tokenizer training's) should show: stderr is a terminal, not quiet."""
    return bool(getattr(sys.stderr, "isatty", lambda: False)()) and not is_quiet()
