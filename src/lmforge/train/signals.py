"""SIGTERM (how schedulers preempt a job) and SIGINT (Ctrl-C) as a request to stop at the next step boundary, where
the loop saves a checkpoint and exits with 143 or 130. A second signal acts at once (the default action)."""

from __future__ import annotations

import os
import signal
import stat
import threading
from types import FrameType

from lmforge.errors import LMForgeError

EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}


class Stopped(LMForgeError):
    """The run stopped on a signal after saving its state; `exit_code` is 128 + the signal number."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = EXIT_CODES.get(signum, 128 + int(signum))


class StopRequest:
    """Catches SIGTERM and SIGINT while active (a context manager); `signum` is the first one received, or None."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = self.signum or signum
        # The next one of this kind is not caught: a second Ctrl-C interrupts a slow save, a second TERM kills.
        signal.signal(signum, self._old.get(signum, signal.SIG_DFL))

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set from the main thread
            for s in EXIT_CODES:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""


LIFELINE_ENV = "LMFORGE_LIFELINE"
"""Set by a process that starts lmforge commands (the experiment runner) to the number of an inherited pipe's read
end; the starter alone holds the write end, which the kernel closes when the starter dies."""


def stop_with_starter() -> None:
    """Started with a lifeline: SIGTERM this process, once, when its starter is gone (killed with -9 included), as
    a scheduler's preemption: a run saves a checkpoint and stops. Processes this one starts do not inherit it."""
    value = os.environ.pop(LIFELINE_ENV, None)
    if value is None or os.name != "posix":
        return
    try:
        fd = int(value)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):  # not the pipe it names: never read someone else's file
            return
    except (ValueError, OSError):
        return

    def watch() -> None:
        try:
            while os.read(fd, 1):  # the starter never writes: this returns at end of file, when it is gone
                pass
        except OSError:
            return
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="lmforge-lifeline", daemon=True).start()
