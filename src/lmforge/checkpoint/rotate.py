"""Which of a run's checkpoints stay: older ones pruned beyond `keep_last` once a new one is safe, those saved after
a non-finite streak set aside, and the scratch dirs of saves that crashed removed."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from lmforge.checkpoint.layout import (
    CHECKPOINTS_DIR,
    NONCE,
    NONFINITE_DIR,
    SCRATCH_RE,
    checkpoints_in,
    scratch_dir,
    step_of,
)
from lmforge.files import fsync_dir, os_reason, pid_alive


def prune(root: Path, step: int, keep_last: int, protect: tuple[int, ...] = ()) -> None:
    """Delete older checkpoints beyond ``keep_last`` (never those in ``protect``); failures only warn, the new
    checkpoint is safe."""
    older = [c for c in checkpoints_in(root) if step_of(c) < step]
    for ckpt in older[: max(0, len(older) - (keep_last - 1))]:
        if step_of(ckpt) in protect:
            continue
        # Renamed out of the way first: a reader of the run (lmforge.load, generate) sees a whole checkpoint or
        # none, never one half deleted.
        doomed = scratch_dir(ckpt)
        try:
            ckpt.rename(doomed)
            shutil.rmtree(doomed)
        except OSError as e:
            print(f"warning: could not delete old checkpoint {ckpt}: {os_reason(e)}", file=sys.stderr)


def set_aside(run_dir: Path, good: int | None) -> list[str]:
    """Move a run's checkpoints newer than step `good` (all, for None) into RUN/checkpoints/nonfinite/, where
    neither `--resume` nor `lmforge.load` looks → their names. Kept, not deleted: they show what went wrong."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    aside = root / NONFINITE_DIR
    moved = []
    for c in checkpoints_in(root):
        if good is not None and step_of(c) <= good:
            continue
        aside.mkdir(exist_ok=True)
        if (aside / c.name).exists():  # left by an earlier streak: the newer one replaces it
            shutil.rmtree(aside / c.name)
        c.rename(aside / c.name)
        moved.append(c.name)
    if moved:
        fsync_dir(root)
    return moved


def remove_stale_scratch(root: Path) -> None:
    """Remove scratch dirs left by crashed saves (their process is gone)."""
    if os.name != "posix":  # os.kill(pid, 0) only probes on POSIX
        return
    for p in root.iterdir():
        m = SCRATCH_RE.fullmatch(p.name)
        if not m or m[4] == NONCE or (int(m[3]) != os.getpid() and pid_alive(int(m[3]))):
            continue
        # An .old- dir whose step_<N> is missing is the only copy left: keep it for the user.
        if m[1] == "tmp" or (root / f"step_{m[2]}").exists():
            shutil.rmtree(p, ignore_errors=True)
