"""File helpers shared by checkpoints, prepared data, model conversion and downloads: the cache root, weights-only
`torch.load` with one-line errors, `json.loads` for user files (too deep a document is malformed JSON), the
durability primitives of atomic writes (content hashes, directory fsync, OS error reasons, the one line for a failed
write, whether a scratch dir's writer is alive), and the writers of a run dir's files, which never follow a symbolic
link."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from lmforge.errors import LMForgeError


def cache_root() -> Path:
    """Root of lmforge's download and data cache: ``$LMFORGE_CACHE`` or ``~/.cache/lmforge``."""
    env = os.environ.get("LMFORGE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lmforge"


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # a string whole (brackets in it do not count), or a bracket


def loads_json(text: str | bytes) -> Any:
    """`json.loads`, but a document nested deeper than the parser's recursion limit (`[[[[...]]]]` 200,000 levels
    deep) raises `json.JSONDecodeError` ("nested too deeply: N levels", at its deepest bracket) like
    any other malformed document, where json.loads raises RecursionError. Readers of user files use it, so the
    `file:line: malformed JSON (...)` line they give for a syntax error covers this too."""
    try:
        return json.loads(text)
    except RecursionError:
        doc = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        depth = deepest = at = 0
        for m in _JSON_TOKENS.finditer(doc):
            c = m.group()
            if c in "[{":
                depth += 1
                if depth > deepest:
                    deepest, at = depth, m.start()
            elif c in "]}":
                depth -= 1
        raise json.JSONDecodeError(f"nested too deeply: {deepest} levels", doc, at) from None


def load_torch_file(path: Path, holds: str = "tensors and plain data") -> Any:
    """`torch.load(path, weights_only=True)` on CPU: a pickle can run code, so only tensors and plain containers
    are accepted. A damaged file or one holding other objects is one LMForgeError (`holds` names what is allowed)."""
    # torch.save writes a zip archive, or before torch 1.6 (and with _use_new_zipfile_serialization=False) a
    # protocol-2 pickle stream, which weights_only reads as safely; anything else is damaged (torch would report
    # it as unsafe pickle).
    if not zipfile.is_zipfile(path) and not _legacy_torch_file(path):
        raise LMForgeError(f"could not read {path}: not a torch.save file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise LMForgeError(f"refusing to load {path}: it holds objects other than {holds}") from e
    except (OSError, RuntimeError, EOFError) as e:
        raise LMForgeError(f"could not read {path}: {str(e).splitlines()[0] if str(e) else e!r}") from e


def sort_safetensors_metadata(path: Path) -> None:
    """Rewrite a safetensors header in place with its metadata keys sorted: the writer emits them in hash-map order,
    which changes from call to call, so identical tensors would give files of different bytes (and sha256). The
    header keeps its length, so the data offsets stay valid; any other layout is left as it is."""
    with open(path, "r+b") as f:
        size = int.from_bytes(f.read(8), "little")
        raw = f.read(size)
        header = json.loads(raw)  # dicts keep the file's order of the tensors
        meta = header.get("__metadata__")
        if not isinstance(meta, dict) or len(meta) < 2:
            return
        header["__metadata__"] = dict(sorted(meta.items()))
        new = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(new) != len(raw.rstrip(b" ")):  # not the compact JSON expected: leave the file as written
            return
        f.seek(8)
        f.write(new + b" " * (size - len(new)))


def _legacy_torch_file(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"\x80\x02"  # pickle protocol 2: the legacy format's magic number comes first
    except OSError:
        return False


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
        self.error: OSError | None = None
        """The OSError a write raised: a caller such as torch.save turns it into its own RuntimeError."""

    def write(self, data) -> int:
        self.sha256.update(data)
        self.size += memoryview(data).nbytes
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

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


def os_error_of(e: BaseException) -> OSError | None:
    """The OSError behind `e`: itself, or one a Rust library (tokenizers, safetensors) reports in its message as
    "... (os error N)"; None for any other error."""
    if isinstance(e, OSError):
        return e
    found = re.search(r"\(os error (\d+)\)", str(e))
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code))


def os_reason(e: BaseException) -> str:
    """A short reason for an error: the OS's words for an errno, else the message."""
    if isinstance(e, OSError) and e.errno is not None:
        return os.strerror(e.errno)
    return str(e) or type(e).__name__


# --- Files of a run dir --------------------------------------------------------------------------------------------
# A run writes only files it made itself: a symbolic link planted at RUN/.lock or RUN/metrics.jsonl would otherwise
# have the run truncate and overwrite whatever file the link points to. Files opened in place are opened with
# O_NOFOLLOW; files replaced atomically are written to a fresh scratch file (O_EXCL) and a link at their name is
# refused too, so every run-dir writer fails the same way: one line naming the link.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # absent on Windows, where creating links needs privileges anyway
_NONCE = os.urandom(4).hex()


def require_utf8_name(path: Path, what: str, option: str) -> None:
    """One line when `path` is not valid UTF-8 (Linux allows any bytes in a name): a run records its paths in UTF-8
    files (config, manifests, the tokenizer's files), so such a dir would fail at its first save, work lost."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise LMForgeError(
            f"{what} '{shown}' has a name that is not valid UTF-8: the run records its paths in UTF-8 files "
            f"(config, checkpoint manifests, tokenizer), so rename it or choose another {option}"
        ) from None


def link_error(path: Path) -> LMForgeError:
    """The one line for a run-dir file that is a symbolic link."""
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    why = f"it is a symbolic link{target}; a run writes only its own files, so remove the link"
    return LMForgeError(f"refusing to write {path}: {why}")


def refuse_link(path: Path) -> None:
    """Raise `link_error` when `path` is a symbolic link (a missing path is fine)."""
    if os.path.islink(path):
        raise link_error(Path(path))


def open_no_follow(path: Path, flags: int, mode: int = 0o644) -> int:
    """`os.open` that refuses a symbolic link at `path` with one line instead of following it."""
    try:
        return os.open(path, flags | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError:
        if os.path.islink(path):  # O_NOFOLLOW's ELOOP (some systems say EMLINK or EFTYPE)
            raise link_error(Path(path)) from None
        raise


def append_text(path: Path):
    """A text file opened for appending (created if missing), never through a symbolic link."""
    fd = open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding="utf-8")


def write_atomic(path: Path, data: bytes | str, fsync: bool = True) -> None:
    """Replace `path` with `data` through a scratch file renamed into place: a reader never sees half a file, and
    neither the scratch file nor `path` may be a symbolic link (a link at `path` is refused, not replaced)."""
    path = Path(path)
    refuse_link(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{_NONCE}")
    tmp.unlink(missing_ok=True)  # a dead writer's (or a planted link: unlink removes the link, not its target)
    fd = open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_reason(e: OSError) -> str:
    """Why a write failed, in the OS's words, and for a full disk or quota what to do."""
    reason = os_reason(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        reason += " (the disk is full: free space there or write elsewhere)"
    return reason


def write_error(path: Path | str, e: OSError) -> LMForgeError:
    """The one line for a failed write of `path`."""
    return LMForgeError(f"could not write {path}: {write_reason(e)}")


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (POSIX; elsewhere always True, so nothing is taken for dead)."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    return True
