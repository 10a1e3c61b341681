"""Finding, verifying and reading a run's checkpoints: their config and their weights (the file format is written by
checkpoint_write.py; a run's checkpoints by train/checkpoint.py). This floor sits under config's resume rules, which
fall back to a checkpoint's own config when RUN/config.yaml is lost."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import yaml
from safetensors import SafetensorError, safe_open
from torch import nn

from lmforge.dcp_read import SHARDS_METADATA, read_full_weights
from lmforge.errors import LMForgeError
from lmforge.files import hash_file, loads_json, os_reason

CHECKPOINTS_DIR = "checkpoints"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "manifest.json"
TRAIN_STATE_FILE = "train_state.pt"
TIED_META = "lmforge.tied"
"""model.safetensors metadata: JSON {alias name: stored name} of the tensors stored once for several names."""
BEST_DIR = "best"
"""RUN/best: the checkpoint with the best dev metric of a run that selects one (fine-tuning, alignment)."""
_STEP_RE = re.compile(r"step_(\d+)")
EXPORT_MODULES = {"electra": "discriminator", "mae-lm": "encoder", "spanbert": "backbone"}
"""The network config.yaml's model section describes, of the pretraining objectives that train several (ELECTRA's
generator and discriminator): the one `lmforge.load(run)` returns; the others' weights stay in the checkpoint."""


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
    except RecursionError:
        raise LMForgeError(f"could not read {path}: nested too deeply") from None
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
            manifest = loads_json((ckpt / MANIFEST_FILE).read_text(encoding="utf-8"))
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


def is_finetuned(config: dict) -> bool:
    """Whether a checkpoint's config is a fine-tuned run's (its pretrained model under backbone, and a task)."""
    return "backbone" in config and "task" in config


def export_module(config: dict) -> str:
    """The name under which a checkpoint holds the network its config's model section describes ("" for a run
    that trains one network): config.yaml's `export_module` (alignment's policy), else its objective's."""
    name = (config.get("objective") or {}).get("name")
    return config.get("export_module") or EXPORT_MODULES.get(name, "")


def is_sharded(path: Path) -> bool:
    """Whether checkpoint dir `path` holds sharded (DCP) weights (written by train/dcp.py)."""
    return (Path(path) / SHARDS_METADATA).is_file()


def is_dtensor(t: object) -> bool:
    """Whether `t` is a DTensor (a sharded model's tensor), without importing torch.distributed.tensor: no DTensor
    can exist before it is imported."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (a sharded model's tensor); a plain tensor itself."""
    return t.to_local() if is_dtensor(t) else t


def normalize_keys(keys: list[str]) -> dict[str, str]:
    """Map each state-dict key to its wrapper-free name.

    ``_orig_mod`` segments (compiled submodules) are dropped anywhere; ``module.`` only when every key starts
    with it, since a model may legitimately have a child called ``module``.
    """
    names = {k: ".".join(p for p in k.split(".") if p != "_orig_mod") for k in keys}
    while names and all(n.startswith("module.") for n in names.values()):
        names = {k: n[len("module.") :] for k, n in names.items()}
    if len(set(names.values())) != len(names):
        raise ValueError("state dict keys collide once wrapper prefixes are removed")
    return names


def view_key(t: torch.Tensor) -> tuple:
    """Identifies one exact view of one storage: equal keys mean the same (tied) tensor."""
    t = local(t)
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def read_weights(ckpt: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """All weights of a checkpoint by name; tied names map to the same tensor. A sharded checkpoint's weights are
    consolidated here, in this process."""
    path = Path(ckpt) / WEIGHTS_FILE
    if not path.is_file() and is_sharded(ckpt):
        return {k: v.to(device) for k, v in read_full_weights(Path(ckpt)).items()}
    if not path.is_file():
        raise LMForgeError(f"no {WEIGHTS_FILE} in {ckpt}")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        aliases = loads_json(meta.get(TIED_META, "{}"))
        for alias, source in aliases.items():
            tensors[alias] = tensors[source]
    except (SafetensorError, OSError, RuntimeError, ValueError, KeyError, AttributeError) as e:
        # RuntimeError: safetensors maps the file through torch, which reports a missing or unreadable file so
        raise LMForgeError(f"could not read {path}: {e}") from e
    return tensors


def load_weights(
    ckpt: Path, model: nn.Module, strict: bool = True, shard: Callable[[dict, dict], dict] | None = None
) -> tuple[list[str], list[str]]:
    """Copy checkpoint weights into ``model`` (not wrapped: train/checkpoint.py's `load_weights` unwraps a compiled
    or DDP model), keeping its tied weights. ``shard(own, saved)`` gives a sharded model the shards it holds of
    the full tensors (train/parallel.py's `shard_like`).

    Returns the (missing, unexpected) key names, which can be non-empty only when ``strict`` is False.
    """
    own = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    names = normalize_keys(list(own))
    own_by_name = {names[k]: v for k, v in own.items()}
    saved_raw = read_weights(ckpt)
    saved = {n: saved_raw[k] for k, n in normalize_keys(list(saved_raw)).items()}
    missing, unexpected = _check_match(own_by_name, saved, strict)
    _check_ties(own_by_name, saved)
    actual_key = {n: k for k, n in names.items()}
    saved = {n: t for n, t in saved.items() if n in own_by_name}
    if shard is not None:
        saved = shard(own_by_name, saved)
    model.load_state_dict({actual_key[n]: t for n, t in saved.items()}, strict=False)
    return missing, unexpected


def _check_match(
    own: dict[str, torch.Tensor], saved: dict[str, torch.Tensor], strict: bool
) -> tuple[list[str], list[str]]:
    """Raise on the first shape mismatch (or, when strict, missing/unexpected key) in model order."""
    prefix = "checkpoint does not match the model"
    missing = []
    for name, t in own.items():
        if name not in saved:
            if strict:
                raise LMForgeError(f"{prefix}: key '{name}' is missing from the checkpoint")
            missing.append(name)
        elif saved[name].shape != t.shape:
            got, want = tuple(saved[name].shape), tuple(t.shape)
            raise LMForgeError(f"{prefix}: key '{name}' has shape {got}, the model expects {want}")
    unexpected = [n for n in saved if n not in own]
    if strict and unexpected:
        raise LMForgeError(f"{prefix}: unexpected key '{unexpected[0]}' (not in the model)")
    return missing, unexpected


def _check_ties(own: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> None:
    """A tensor the model ties under two names must get one value, or loading would silently pick one."""
    first_name: dict[tuple, str] = {}
    for name, t in own.items():
        view = view_key(t)
        other = first_name.setdefault(view, name)
        if other == name or name not in saved or other not in saved:
            continue
        if saved[name] is not saved[other] and not torch.equal(saved[name], saved[other]):
            raise LMForgeError(
                f"checkpoint does not match the model: '{other}' and '{name}' are tied in the model "
                "but differ in the checkpoint"
            )
