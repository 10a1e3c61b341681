"""The names a checkpoint is made of on disk: the files of a checkpoint dir, the dirs of a run, the step dirs in
order, and the scratch dirs a save writes into before it publishes one (the whole layout is in write.py's
docstring)."""

from __future__ import annotations

import os
import re
from pathlib import Path

CHECKPOINTS_DIR = "checkpoints"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "manifest.json"
TRAIN_STATE_FILE = "train_state.pt"
TIED_META = "lmforge.tied"
"""model.safetensors metadata: JSON {alias name: stored name} of the tensors stored once for several names."""
BEST_DIR = "best"
"""RUN/best: the checkpoint with the best dev metric of a run that selects one (fine-tuning, alignment)."""
NONFINITE_DIR = "nonfinite"
"""RUN/checkpoints/nonfinite: the checkpoints a run saved after its last good one, set aside when a non-finite streak
stopped it."""
SHARDS_DIR = "dcp"
"""The torch.distributed.checkpoint directory of a sharded checkpoint (sharded.py)."""
SHARDS_METADATA = f"{SHARDS_DIR}/.metadata"

STEP_RE = re.compile(r"step_(\d+)")
SCRATCH_RE = re.compile(r"\.(tmp|old)-step_(\d+)-(\d+)(?:-([0-9a-f]+))?")
"""A scratch dir of a save (.tmp-) or of the checkpoint it replaces (.old-): step, writer's pid, writer's nonce."""
NONCE = os.urandom(4).hex()
"""Scratch dirs carry the writer's pid and this nonce: a container's trainer is PID 1 in every run, so the pid alone
cannot tell this process's scratch dirs from those a killed predecessor with the same pid left."""


def scratch_dir(final: Path, kind: str = "tmp") -> Path:
    """The scratch dir beside checkpoint dir `final` that this process writes (`kind` "tmp") or moves a replaced
    checkpoint to ("old") before deleting it."""
    return final.with_name(f".{kind}-{final.name}-{os.getpid()}-{NONCE}")


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint directories of a run, oldest step first (not verified)."""
    return checkpoints_in(Path(run_dir) / CHECKPOINTS_DIR)


def checkpoints_in(root: Path) -> list[Path]:
    """The step_<N> dirs in `root` (RUN/checkpoints, or the set-aside ones), oldest step first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and STEP_RE.fullmatch(p.name)]
    return sorted(found, key=step_of)


def step_of(ckpt: Path) -> int:
    return int(ckpt.name.split("_", 1)[1])


def is_sharded(path: Path) -> bool:
    """Whether checkpoint dir `path` holds sharded (DCP) weights (written by sharded.py)."""
    return (Path(path) / SHARDS_METADATA).is_file()
