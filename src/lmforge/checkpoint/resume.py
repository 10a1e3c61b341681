"""Which checkpoint a run resumes from, and what may not change across a resume."""

from __future__ import annotations

import sys
from pathlib import Path

from lmforge.checkpoint.layout import CHECKPOINTS_DIR, NONFINITE_DIR, checkpoints_in, list_checkpoints, step_of
from lmforge.checkpoint.read import read_config
from lmforge.checkpoint.rotate import remove_stale_scratch
from lmforge.checkpoint.verify import latest_checkpoint
from lmforge.errors import LMForgeError

FROZEN_ON_RESUME = ("model", "data", "objective")
"""Config sections that must not change when a run resumes (train.* may: e.g. a longer max_steps)."""


def resume_checkpoint(
    run_dir: Path, config: dict, resume: bool, is_main: bool = True, frozen: tuple[str, ...] = FROZEN_ON_RESUME,
    saved_as: str | None = None,
) -> Path | None:  # fmt: skip
    """The checkpoint to resume from (the newest that verifies), or None to start at step 0.

    Without `resume`, a run dir that already has checkpoints is refused. With it, a run dir without any checkpoint
    yet starts at step 0 (so a job can always be launched with `--resume`), and a checkpoint whose frozen config
    sections differ from `config` is refused (`saved_as`: the key a checkpoint's config.yaml holds the run's config
    under, when not at the top). Unfinished saves (`.tmp-step_*` dirs of dead processes) are removed.
    """
    run_dir = Path(run_dir)
    root = run_dir / CHECKPOINTS_DIR
    if is_main and root.is_dir():
        remove_stale_scratch(root)
    found = list_checkpoints(run_dir)
    if not resume:
        if found:
            raise LMForgeError(
                f"run dir {run_dir} already has checkpoints: pass --resume to continue it, or choose another --run.dir"
            )
        return None
    if not found:
        if is_main:
            print(f"warning: --resume: no checkpoint in {run_dir} yet, starting at step 0", file=sys.stderr)
            _note_set_aside(root, None)
        return None
    chosen = latest_checkpoint(run_dir)
    if is_main:
        _note_set_aside(root, chosen)
    saved = read_config(chosen)
    check_frozen(saved.get(saved_as) or {} if saved_as else saved, config, frozen)
    return chosen


def check_frozen(old: dict, new: dict, frozen: tuple[str, ...] = FROZEN_ON_RESUME) -> None:
    """Raise when a frozen section's key differs between a checkpoint's config `old` and the run's `new`."""
    for section in frozen:
        if not isinstance(new.get(section), dict):
            if old.get(section) != new.get(section):
                raise LMForgeError(f"cannot resume: {section} changed since the checkpoint")
            continue
        for key, value in new[section].items():
            if section == "model" and key == "vocab_size":
                continue  # set from the run's tokenizer
            was = (old.get(section) or {}).get(key)
            if was != value:
                raise LMForgeError(f"cannot resume: {section}.{key} changed since the checkpoint ({was!r} → {value!r})")


def _note_set_aside(root: Path, chosen: Path | None) -> None:
    """Say so when a non-finite streak set checkpoints newer than the one resumed from aside (train/loop.py)."""
    aside = checkpoints_in(root / NONFINITE_DIR)
    step = step_of(chosen) if chosen is not None else -1
    later = [c.name for c in aside if step_of(c) > step]
    if later:
        start = f"{chosen.name}, the last good checkpoint" if chosen is not None else "step 0: no checkpoint was good"
        print(
            f"note: resuming from {start} before the non-finite streak that stopped the run; the checkpoints saved "
            f"after it ({', '.join(later)}) are set aside in {root / NONFINITE_DIR}",
            file=sys.stderr,
        )
