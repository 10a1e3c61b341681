"""One `data prepare` at a time into an output dir: an exclusive lock on `.OUT.lock` beside it, so that a second
prepare into the same --out is refused with one line naming the first, instead of replacing its output when both
finish.

The lock file sits beside OUT, not in it: a prepare renames a finished scratch dir onto OUT, which would take a lock
file inside OUT away with the old data. It is `fcntl.flock`ed (the kernel drops the lock when its holder dies, so a
killed prepare's lock is taken over at once) and removed when the prepare ends; one a killed prepare left is
removed by the next prepare into the same parent dir (`remove_stale_locks`)."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from pathlib import Path

from lmforge.errors import LMForgeError
from lmforge.files import open_no_follow

try:
    import fcntl
except ImportError:  # not POSIX: prepares are not locked
    fcntl = None  # type: ignore[assignment]

_LOCK_RE = re.compile(r"\.(.+)\.lock")
_INFO_KEYS = {"pid", "host", "started", "command"}


class PrepareLock:
    """Held from `acquire()` to `release()` by the one prepare writing `out`; an OSError (a read-only parent) is
    the caller's to report."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.path = self.out.with_name(f".{self.out.name}.lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        if fcntl is None or self._fd is not None:
            return
        while True:
            fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT)
            if not _lock_now(fd):
                holder = _describe(fd)
                os.close(fd)
                raise LMForgeError(
                    f"{self.out} is being prepared by {holder}: wait for it to finish, or choose another --out"
                )
            if _is_at(fd, self.path):
                break
            os.close(fd)  # the holder before removed that file as it let go: lock the one at the path now
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "command": " ".join(["lmforge", *sys.argv[1:]])}  # fmt: skip
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(info) + "\n").encode())
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file, then let go of it (in this order: a process that opened it meanwhile sees it gone
        and takes a new one)."""
        if self._fd is None:
            return
        try:
            if _is_at(self._fd, self.path):
                self.path.unlink()
        except OSError:
            pass  # left in place: the next prepare locks it as it is
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> PrepareLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is the one at `path` now."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def remove_stale_locks(parent: Path) -> None:
    """Remove the lock files of killed prepares from `parent`: those a prepare wrote that nobody holds."""
    if fcntl is None:
        return
    for path in parent.iterdir():
        if not _LOCK_RE.fullmatch(path.name) or path.is_symlink() or not path.is_file():
            continue
        try:
            fd = open_no_follow(path, os.O_RDONLY)
        except (OSError, LMForgeError):
            continue
        try:
            if _info(fd) is not None and _lock_now(fd) and _is_at(fd, path):
                path.unlink()  # a prepare that opened it meanwhile finds it gone once it locks it, and starts again
        except OSError:
            pass
        finally:
            os.close(fd)


def _lock_now(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _info(fd: int) -> dict | None:
    """What a prepare wrote into its lock file, or None (another file, or not written yet)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and set(info) == _INFO_KEYS else None


def _describe(fd: int) -> str:
    """Who holds the lock, as the holder wrote it into the file."""
    info = _info(fd)
    if info is None:
        return "another process"
    return f"process {info['pid']} on {info['host']} (started {info['started']}: {info['command']})"
