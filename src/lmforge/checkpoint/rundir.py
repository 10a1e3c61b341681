"""A run directory while a run writes it: an exclusive lock that keeps a second process out, which every checkpoint
checks before it is published (write.py's `publish`).

The lock is `fcntl.flock` on RUN/.lock: the kernel drops it when its holder exits or dies, so the lock of a killed
run is taken over by the next one without any clean-up, and a second live process is refused with one line that
names the holder (its pid, host, start time and command, written into the lock file)."""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path

from lmforge.errors import LMForgeError
from lmforge.files import open_no_follow, os_reason, require_utf8_name, write_error

LOCK_FILE = ".lock"
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)  # chmod, a read-only mount

try:
    import fcntl
except ImportError:  # not POSIX: runs are not locked
    fcntl = None  # type: ignore[assignment]


class RunLock:
    """Holds RUN/.lock from `acquire()` until `release()` (or the process's end). `what` and `option` name the dir
    in the refusal (an experiment's or a sweep's dir: "experiment dir", "--out").

    A lock file deleted while the run holds it would let a second process in (its lock is on a new file), so
    `check()` runs before each checkpoint is published: a deleted lock file is made and taken again; one that
    another file replaced stops this run instead, before it writes over what the other process writes."""

    def __init__(self, run_dir: Path, what: str = "run dir", option: str = "--run.dir") -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.what, self.option = what, option
        self._fd: int | None = None

    def acquire(self) -> None:
        require_utf8_name(self.path.parent, self.what, self.option)
        if fcntl is None or self._fd is not None:
            return
        fd = self._open()
        if not _lock(fd):
            holder = _describe(self.path)
            os.close(fd)
            raise LMForgeError(
                f"{self.what} {self.path.parent} is in use by {holder}: wait for it to finish, or choose another "
                f"{self.option}"
            )
        self._take(fd)

    def _open(self) -> int:
        """The lock file opened for writing, in a run dir made if missing and shown writable first (a file made
        and removed), so that a dir the run could not write is one line before any work, not an error at its
        first save."""
        run_dir = self.path.parent
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if e.errno not in _NOT_WRITABLE:
                raise write_error(run_dir, e) from None
            where = Path(e.filename).parent if e.filename else run_dir.parent
            raise LMForgeError(
                f"cannot create {self.what} {run_dir}: {where} is not writable ({os_reason(e)}): choose another "
                f"{self.option}"
            ) from None
        probe = run_dir / f"{LOCK_FILE}.probe-{os.getpid()}"
        try:
            probe.unlink(missing_ok=True)  # a killed process's (a link planted there: the link, not its target)
            os.close(open_no_follow(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            probe.unlink()
            return open_no_follow(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as e:
            if e.errno not in _NOT_WRITABLE:
                raise write_error(Path(e.filename or self.path), e) from None
            raise LMForgeError(
                f"{self.what} {run_dir} is not writable ({os_reason(e)}): make it writable, or choose another "
                f"{self.option}"
            ) from None

    def _take(self, fd: int) -> None:
        """Record this process in the locked file `fd` (for the refusal of the next one) and hold it."""
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(["lmforge", *sys.argv[1:]]) if sys.argv else "",
        }
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(info) + "\n").encode())
        self._fd = fd
        _HELD.append(self)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
            _HELD.remove(self)

    def check(self, action: str) -> None:
        """Raise one line unless RUN/.lock is still the file this process locked; `action` is what is refused
        then ("checkpoint step_6 was not saved"). A deleted lock file is made again and taken (a warning)."""
        if self._fd is None:
            return
        held = os.fstat(self._fd)
        try:
            now = os.lstat(self.path)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return
        if now is None and self._retake():
            print(f"warning: {self.path} was deleted while this run held it: locked again", file=sys.stderr)
            return
        holder = lock_holder(self.path.parent)
        raise LMForgeError(
            f"{self.what} {self.path.parent} is no longer this process's: {self.path} was deleted or replaced while "
            f"the run held it" + (f", and {holder} holds it now" if holder else "") + f"; {action}, so that two "
            "processes never write one run dir"
        )

    def _retake(self) -> bool:
        """Make and lock a new lock file in place of a deleted one; False when another process got there first."""
        try:
            fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        except (OSError, LMForgeError):
            return False
        if not _lock(fd):
            os.close(fd)
            return False
        old, self._fd = self._fd, None
        _HELD.remove(self)
        os.close(old)  # its flock is on the deleted file
        self._take(fd)
        return True


_HELD: list[RunLock] = []
"""The locks this process holds, which `check_lock` finds by path."""


def _lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def check_lock(path: Path, action: str) -> None:
    """Before `path` (a checkpoint) is published: the lock this process holds on a dir above it must still be its
    own (`RunLock.check`). Paths under no lock of this process (another rank's, a test's) are not checked."""
    where = Path(os.path.abspath(path))
    for lock in list(_HELD):
        if Path(os.path.abspath(lock.path.parent)) in where.parents:
            lock.check(action)


def lock_holder(run_dir: Path) -> str | None:
    """Who holds `run_dir`'s lock ("process N on HOST (started ...)"), or None when no live process does."""
    if fcntl is None:
        return None
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = open_no_follow(path, os.O_RDWR)
    except (OSError, LMForgeError):
        return None
    try:
        if not _lock(fd):
            return _describe(path)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _describe(path: Path) -> str:
    try:
        fd = open_no_follow(path, os.O_RDONLY)
        with os.fdopen(fd, encoding="utf-8") as f:
            info = json.loads(f.read())
        return f"process {info['pid']} on {info['host']} (started {info['started']}: {info['command']})"
    except (OSError, ValueError, KeyError, TypeError, LMForgeError):
        return "another process"
