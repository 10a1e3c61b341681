"""File helpers shared by checkpoints, model conversion and downloads: the cache root, weights-only `torch.load`
with one-line errors, and the durability primitives of atomic writes (content hashes, directory fsync, OS error
reasons)."""

from __future__ import annotations

import hashlib
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from lmforge.errors import LMForgeError


def cache_root() -> Path:
    """Root of lmforge's download and data cache: ``$LMFORGE_CACHE`` or ``~/.cache/lmforge``."""
    env = os.environ.get("LMFORGE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lmforge"


def load_torch_file(path: Path, holds: str = "tensors and plain data") -> Any:
    """`torch.load(path, weights_only=True)` on CPU: a pickle can run code, so only tensors and plain containers
    are accepted. A damaged file or one holding other objects is one LMForgeError (`holds` names what is allowed)."""
    # torch.save writes a zip archive; anything else is damaged (torch would report it as unsafe pickle).
    if not zipfile.is_zipfile(path):
        raise LMForgeError(f"could not read {path}: not a torch.save archive")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise LMForgeError(f"refusing to load {path}: it holds objects other than {holds}") from e
    except (OSError, RuntimeError, EOFError) as e:
        raise LMForgeError(f"could not read {path}: {str(e).splitlines()[0] if str(e) else e!r}") from e


def hash_file(path: Path, fsync: bool = False) -> tuple[int, str]:
    """(size, sha256 hex) of a file; with ``fsync`` its data is also forced to disk."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
        if fsync:
            os.fsync(f.fileno())
    return size, h.hexdigest()


class HashingWriter:
    """A binary file that hashes what passes through it: `size` and `sha256` of everything written, with no second
    read of the file."""

    def __init__(self, f) -> None:
        self.f, self.sha256, self.size = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha256.update(data)
        self.size += memoryview(data).nbytes
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def fsync_dir(path: Path) -> None:
    """Persist a directory's entries (renames, new files); not possible on Windows."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def os_reason(e: BaseException) -> str:
    """A short reason for an error: the OS's words for an errno, else the message."""
    if isinstance(e, OSError) and e.errno is not None:
        return os.strerror(e.errno)
    return str(e) or type(e).__name__
