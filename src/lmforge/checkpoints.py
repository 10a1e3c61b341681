"""Finding, verifying and reading a run's checkpoints (writing them is train/checkpoint.py). This floor sits under
config's resume rules, which fall back to a checkpoint's own config when RUN/config.yaml is lost."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

from lmforge.errors import LMForgeError
from lmforge.files import hash_file, os_reason

CHECKPOINTS_DIR = "checkpoints"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "manifest.json"
SHARDS_DIR = "dcp"
"""The torch.distributed.checkpoint directory of a sharded checkpoint (train/dcp.py)."""
SHARDS_METADATA = f"{SHARDS_DIR}/.metadata"
BEST_DIR = "best"
"""RUN/best: the checkpoint with the best dev metric of a run that selects one (fine-tuning, alignment)."""
_STEP_RE = re.compile(r"step_(\d+)")


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint directories of a run, oldest step first (not verified)."""
    return _checkpoints_in(Path(run_dir) / CHECKPOINTS_DIR)


def _checkpoints_in(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_RE.fullmatch(p.name)]
    return sorted(found, key=_step_of)


def _step_of(ckpt: Path) -> int:
    return int(ckpt.name.split("_", 1)[1])


def verify_checkpoint(ckpt: Path) -> str | None:
    """None when every file matches the manifest, else why the checkpoint is unusable."""
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        return "not a directory"
    try:
        manifest = json.loads((ckpt / MANIFEST_FILE).read_text(encoding="utf-8"))
        files = {rel: (int(e["size"]), str(e["sha256"])) for rel, e in manifest["files"].items()}
    except FileNotFoundError:
        return f"no {MANIFEST_FILE} (the save did not finish)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{MANIFEST_FILE} is unreadable"
    if WEIGHTS_FILE not in files and SHARDS_METADATA not in files:
        return f"{MANIFEST_FILE} lists no {WEIGHTS_FILE}"
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


def latest_checkpoint(path: Path) -> Path:
    """The checkpoint to resume from: ``path`` itself if it is a checkpoint, else the run's newest valid one.

    A newer checkpoint that fails verification is skipped with a warning on stderr.
    """
    path = Path(path)
    if not path.exists():
        raise LMForgeError(f"no checkpoint at {path}: the path does not exist")
    if (path / MANIFEST_FILE).exists() or (path / WEIGHTS_FILE).exists() or _STEP_RE.fullmatch(path.name):
        reason = verify_checkpoint(path)
        if reason is not None:
            raise LMForgeError(f"checkpoint {path} is not usable: {reason}")
        return path
    root = path if path.name == CHECKPOINTS_DIR else path / CHECKPOINTS_DIR
    ckpts = _checkpoints_in(root)
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


def read_config(ckpt: Path) -> dict:
    """The resolved config stored with a checkpoint (or a run dir)."""
    path = Path(ckpt) / CONFIG_FILE
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise LMForgeError(f"no {CONFIG_FILE} in {ckpt}") from e
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise LMForgeError(f"could not read {path}: {str(e).splitlines()[0]}") from e
    if not isinstance(config, dict):
        raise LMForgeError(f"{path} does not hold a mapping")
    for section in ("model", "backbone"):  # fine-tuned runs keep their pretrained model under backbone
        if isinstance(config.get(section), dict):
            config[section] = upgrade_saved_model(config[section])
    return config


def newest_config(run_dir: Path) -> tuple[Path, dict] | None:
    """(checkpoint, its config) of the newest checkpoint whose config.yaml is intact (its size and sha256 match the
    manifest), or None. Only that file is hashed: the weights are verified when the run resumes from it."""
    for ckpt in reversed(list_checkpoints(run_dir)):
        try:
            manifest = json.loads((ckpt / MANIFEST_FILE).read_text(encoding="utf-8"))
            entry = manifest["files"][CONFIG_FILE]
            if hash_file(ckpt / CONFIG_FILE) != (int(entry["size"]), str(entry["sha256"])):
                continue
            return ckpt, read_config(ckpt)
        except (OSError, ValueError, KeyError, TypeError, LMForgeError):
            continue  # an unfinished save, or a damaged one: an older checkpoint may hold an intact config
    return None


def upgrade_saved_model(section: dict) -> dict:
    """A model section read from a saved run, with fields added after it was written set to what the saved model
    computes where their defaults would not: a Shaw model saved before `shaw_values` existed has no value term.
    (`init_scheme` and `zero_pad_embedding` need nothing: their defaults are the init every model had before them.)"""
    if section.get("position") == "shaw" and "shaw_values" not in section:
        return {**section, "shaw_values": False}
    return section
