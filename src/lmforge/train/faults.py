"""Fault injection for reliability tests: pause a run at a named point so a test can kill it there.

``LMFORGE_FAULT_SLEEP="POINT:SECONDS[,POINT:SECONDS...]"`` is read once, when a trainer starts. Points:

- ``eval``: at the start of every evaluation;
- ``checkpoint``: in the middle of every checkpoint write, after the first files are in the checkpoint's
  ``.tmp-step_<N>-<pid>`` scratch dir and before its weights and manifest (a kill there leaves an unfinished
  checkpoint, which resuming skips and the next save removes).

Before pausing, one line ``fault injection: pausing S s at POINT (step N)`` goes to stderr (flushed), so a test
can wait for it and then send SIGKILL. Unset (the normal case), every hook is a no-op dict lookup; no hook sits in
the per-step path.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Literal

from lmforge.errors import LMForgeError

ENV_VAR = "LMFORGE_FAULT_SLEEP"
Point = Literal["eval", "checkpoint"]
POINTS: tuple[str, ...] = ("eval", "checkpoint")


def parse_fault_sleep(spec: str | None) -> dict[str, float]:
    """``"eval:5,checkpoint:30"`` → ``{"eval": 5.0, "checkpoint": 30.0}``; empty or None → {}."""
    out: dict[str, float] = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        point, sep, seconds = part.strip().partition(":")
        try:
            value = float(seconds)
        except ValueError:
            value = -1.0
        if not sep or point not in POINTS or value < 0:
            raise LMForgeError(
                f"{ENV_VAR}: expected POINT:SECONDS with POINT one of {', '.join(POINTS)}, got {part.strip()!r}"
            )
        out[point] = value
    return out


class Faults:
    """The pauses configured for this process (from ``LMFORGE_FAULT_SLEEP`` unless given)."""

    def __init__(self, pauses: dict[str, float] | None = None) -> None:
        self.pauses = parse_fault_sleep(os.environ.get(ENV_VAR)) if pauses is None else pauses

    def pause(self, point: Point, step: int) -> None:
        """Sleep at ``point`` when configured, announcing it on stderr first."""
        seconds = self.pauses.get(point)
        if seconds is None:
            return
        print(f"fault injection: pausing {seconds:g} s at {point} (step {step})", file=sys.stderr, flush=True)
        time.sleep(seconds)

    def checkpoint_tokenizer(self, tokenizer: Any, step: int) -> Any:
        """The tokenizer to pass to ``save_checkpoint``: unchanged, or one whose ``save`` pauses once it has
        written its files into the scratch dir (the first thing a checkpoint write does)."""
        if "checkpoint" not in self.pauses or tokenizer is None:
            return tokenizer
        return _PausingTokenizer(tokenizer, lambda: self.pause("checkpoint", step))


class _PausingTokenizer:
    def __init__(self, inner: Any, then: Any) -> None:
        self.inner, self.then = inner, then

    def save(self, directory: Path) -> Any:
        out = self.inner.save(directory)
        self.then()
        return out
