"""A run directory while a run writes it: an exclusive lock that keeps a second process out, and the metrics log.

The lock is `fcntl.flock` on RUN/.lock: the kernel drops it when its holder exits or dies, so the lock of a killed
run is taken over by the next one without any clean-up, and a second live process is refused with one line that
names the holder (its pid, host, start time and command, written into the lock file)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from lmforge.errors import LMForgeError
from lmforge.files import open_no_follow
from lmforge.train.distributed import DistInfo, broadcast_object

LOCK_FILE = ".lock"

try:
    import fcntl
except ImportError:  # not POSIX: runs are not locked
    fcntl = None  # type: ignore[assignment]


class RunLock:
    """Holds RUN/.lock from `acquire()` until `release()` (or the process's end). `what` and `option` name the dir
    in the refusal (an experiment's or a sweep's dir: "experiment dir", "--out")."""

    def __init__(self, run_dir: Path, what: str = "run dir", option: str = "--run.dir") -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.what, self.option = what, option
        self._fd: int | None = None

    def acquire(self) -> None:
        if fcntl is None or self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _describe(self.path)
            os.close(fd)
            raise LMForgeError(
                f"{self.what} {self.path.parent} is in use by {holder}: wait for it to finish, or choose another "
                f"{self.option}"
            ) from None
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(["lmforge", *sys.argv[1:]]) if sys.argv else "",
        }
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(info) + "\n").encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _describe(path: Path) -> str:
    try:
        fd = open_no_follow(path, os.O_RDONLY)
        with os.fdopen(fd, encoding="utf-8") as f:
            info = json.loads(f.read())
        return f"process {info['pid']} on {info['host']} (started {info['started']}: {info['command']})"
    except (OSError, ValueError, KeyError, TypeError, LMForgeError):
        return "another process"


def lock_run_dir(run_dir: Path, dist: DistInfo) -> RunLock:
    """Rank 0 takes the run dir's lock; every rank raises the same one line when it cannot."""
    lock = RunLock(run_dir)
    error = None
    if dist.is_main:
        try:
            lock.acquire()
        except LMForgeError as e:
            error = str(e)
    error = broadcast_object(error, dist)
    if error:
        raise LMForgeError(error)
    return lock
