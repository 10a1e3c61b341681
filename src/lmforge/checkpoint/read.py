"""Reading a checkpoint back: its config (upgraded to the fields added since it was written) and its weights, into
a state dict or into a model (wrapped, tied or sharded). Which checkpoint to read is verify.py's."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml
from safetensors import SafetensorError, safe_open
from torch import nn

from lmforge.checkpoint.layout import CONFIG_FILE, MANIFEST_FILE, TIED_META, WEIGHTS_FILE, is_sharded, list_checkpoints
from lmforge.checkpoint.sharded import read_full_weights
from lmforge.checkpoint.tensors import normalize_keys, shard_like, view_key
from lmforge.errors import LMForgeError
from lmforge.files import hash_file, loads_json

EXPORT_MODULES = {"electra": "discriminator", "mae-lm": "encoder", "spanbert": "backbone"}
"""The network config.yaml's model section describes, of the pretraining objectives that train several (ELECTRA's
generator and discriminator): the one `lmforge.load(run)` returns; the others' weights stay in the checkpoint."""


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


def load_weights(ckpt: Path, model: nn.Module, strict: bool = True) -> tuple[list[str], list[str]]:
    """Copy checkpoint weights into ``model``, keeping its tied weights. The model may be compiled or DDP-wrapped
    (its keys are matched without the wrappers' prefixes) or sharded (each rank keeps its shard of the full
    tensors).

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
    saved = shard_like(own_by_name, {n: t for n, t in saved.items() if n in own_by_name})
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
