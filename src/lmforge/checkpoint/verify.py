"""Whether a checkpoint is whole (every file as its manifest lists it), and which checkpoint of a run to read or
resume from: the newest that verifies, or RUN/best."""

from __future__ import annotations

import sys
from pathlib import Path

from lmforge.checkpoint.layout import (
    BEST_DIR,
    CHECKPOINTS_DIR,
    MANIFEST_FILE,
    SHARDS_METADATA,
    STEP_RE,
    WEIGHTS_FILE,
    checkpoints_in,
)
from lmforge.errors import LMForgeError
from lmforge.files import hash_file, loads_json, os_reason


def verify_checkpoint(ckpt: Path) -> str | None:
    """None when every file matches the manifest, else why the checkpoint is unusable."""
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        return "not a directory"
    try:
        manifest = loads_json((ckpt / MANIFEST_FILE).read_text(encoding="utf-8"))
        files = {rel: (int(e["size"]), str(e["sha256"])) for rel, e in manifest["files"].items()}
    except FileNotFoundError:
        return f"no {MANIFEST_FILE} (the save did not finish)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{MANIFEST_FILE} is unreadable"
    if WEIGHTS_FILE not in files and SHARDS_METADATA not in files:
        return f"{MANIFEST_FILE} lists no {WEIGHTS_FILE}"
    for rel in files:  # a forged entry must not make the check read (or report on) files outside the checkpoint
        if not _inside(ckpt, rel):
            return f"{MANIFEST_FILE} names {rel!r}, which is not a file inside the checkpoint"
    for rel, (size, _) in files.items():  # cheap checks first
        path = ckpt / rel
        if not path.is_file():
            return f"missing file {rel}"
        actual = path.stat().st_size
        if actual != size:
            return f"{rel} has {actual} bytes, the manifest says {size}"
    for rel, (_, digest) in files.items():
        try:
            if hash_file(ckpt / rel)[1] != digest:
                return f"{rel} does not match its sha256 in the manifest"
        except OSError as e:
            return f"cannot read {rel}: {os_reason(e)}"
    return None


def _inside(ckpt: Path, rel: str) -> bool:
    """`rel` is a relative path to a regular file or dir under `ckpt` with no `..` part and no symbolic link on
    the way (a link could point anywhere)."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        return False
    path = ckpt
    for part in parts:
        path = path / part
        if path.is_symlink():
            return False
    return True


def latest_checkpoint(path: Path) -> Path:
    """The checkpoint to resume from: ``path`` itself if it is a checkpoint, else the run's newest valid one.

    A newer checkpoint that fails verification is skipped with a warning on stderr.
    """
    path = Path(path)
    if not path.exists():
        raise LMForgeError(f"no checkpoint at {path}: the path does not exist")
    if (path / MANIFEST_FILE).exists() or (path / WEIGHTS_FILE).exists() or STEP_RE.fullmatch(path.name):
        reason = verify_checkpoint(path)
        if reason is not None:
            raise LMForgeError(f"checkpoint {path} is not usable: {reason}")
        return path
    root = path if path.name == CHECKPOINTS_DIR else path / CHECKPOINTS_DIR
    ckpts = checkpoints_in(root)
    if not ckpts:
        raise LMForgeError(f"no checkpoints in {root}")
    for ckpt in reversed(ckpts):
        reason = verify_checkpoint(ckpt)
        if reason is None:
            return ckpt
        print(f"warning: skipping checkpoint {ckpt}: {reason}", file=sys.stderr)
    raise LMForgeError(f"no usable checkpoint in {root}: all {len(ckpts)} failed verification")


def model_checkpoint(path: Path) -> Path:
    """The checkpoint a run's model is read from: RUN/best for runs that select by a dev metric, else what
    `latest_checkpoint` finds (``path`` itself when it is a checkpoint dir)."""
    best = Path(path) / BEST_DIR
    if best.is_dir() and verify_checkpoint(best) is None:
        return best
    return latest_checkpoint(path)
