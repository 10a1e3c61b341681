"""Writing a checkpoint's files (the layout is in train/checkpoint.py's docstring): the weights with each shared
tensor stored once, config.yaml, the tokenizer files and, last, the manifest, every file fsynced. Publishing a
run's checkpoints (scratch dirs, the run-dir lock, rotation) is train/checkpoint.py; `save_pretrained` writes a
standalone one (`write_model_files`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import save_file

from lmforge.checkpoints import (
    CONFIG_FILE,
    MANIFEST_FILE,
    TIED_META,
    TRAIN_STATE_FILE,
    WEIGHTS_FILE,
    normalize_keys,
    view_key,
)
from lmforge.dcp_read import SHARDS_DIR
from lmforge.errors import LMForgeError
from lmforge.files import fsync_dir, hash_file, os_error_of, sort_safetensors_metadata, write_reason

_RESERVED = {WEIGHTS_FILE, CONFIG_FILE, TRAIN_STATE_FILE, MANIFEST_FILE, SHARDS_DIR}


class Tokenizer(Protocol):
    def save(self, directory: Path) -> Any: ...


def write_model_files(
    directory: Path, state: Mapping[str, torch.Tensor], config: dict, tokenizer: Tokenizer | None = None
) -> None:
    """A standalone checkpoint (no training state, step 0) of the weights `state` in the existing, empty
    `directory`."""
    write_side_files(directory, config, tokenizer)
    write_weights(directory, state)
    write_manifest(directory, 0)


def write_weights(tmp: Path, state: Mapping[str, torch.Tensor]) -> None:
    """model.safetensors of a state dict (wrapper prefixes dropped, each shared tensor stored once), its metadata
    in one order so that the same weights give the same bytes in every process."""
    tensors, aliases = _tensors_to_save(state)
    save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", TIED_META: json.dumps(aliases)})
    sort_safetensors_metadata(tmp / WEIGHTS_FILE)


def _tensors_to_save(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Wrapper-free CPU tensors to write, each shared tensor once, plus {alias: stored name}."""
    names = normalize_keys(list(state))
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen_views: dict[tuple, str] = {}
    seen_storages: set[tuple] = set()
    for key, t in state.items():
        name = names[key]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state dict entry '{name}' is not a tensor; safetensors cannot store it")
        view = view_key(t)
        if view in seen_views:
            aliases[name] = seen_views[view]
            continue
        seen_views[view] = name
        storage = (t.device, t.untyped_storage().data_ptr())
        # safetensors refuses overlapping tensors; a view that only partly shares memory is copied.
        if storage in seen_storages or not t.is_contiguous():
            t = t.contiguous().clone()
        seen_storages.add(storage)
        tensors[name] = t.detach().cpu()
    return tensors, aliases


def write_side_files(tmp: Path, config: dict, tokenizer: Tokenizer | None) -> None:
    """The tokenizer files and config.yaml of a checkpoint being written in `tmp`."""
    if tokenizer is not None:
        tokenizer.save(tmp)
        clash = sorted(_RESERVED & {p.name for p in tmp.iterdir()})
        if clash:
            raise ValueError(f"tokenizer.save wrote {clash[0]}, a name the checkpoint itself uses")
    _write_yaml(tmp / CONFIG_FILE, config)


def write_manifest(tmp: Path, step: int, known: dict[str, dict] | None = None) -> None:
    """Hash every file under `tmp` (except those in `known`: relative path → {size, sha256}, hashed already),
    fsync them, then write manifest.json and fsync the directories: the checkpoint is complete."""
    files = dict(known or {})
    for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
        rel = path.relative_to(tmp).as_posix()
        if rel not in files:
            size, digest = hash_file(path, fsync=True)
            files[rel] = {"size": size, "sha256": digest}
    manifest = json.dumps({"format": 1, "step": step, "files": dict(sorted(files.items()))}, indent=1)
    with open(tmp / MANIFEST_FILE, "w", encoding="utf-8") as f:
        f.write(manifest)
        f.flush()
        os.fsync(f.fileno())
    for d in sorted((p for p in tmp.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(d)
    fsync_dir(tmp)


def write_failure(what: str, e: BaseException) -> LMForgeError | None:
    """One line ("could not <what>: <reason>") for a failed write, or None for an error that is not one. A full
    disk comes as an OSError, or inside another library's error (torch.save's RuntimeError, the tokenizers' and
    safetensors' "(os error 28)"): each gets the same line."""
    cause = os_error_of(e) if isinstance(e, Exception) else None
    if cause is not None:
        return LMForgeError(f"could not {what}: {write_reason(cause)}")
    if isinstance(e, SafetensorError):
        return LMForgeError(f"could not {what}: {e}")
    return None


def _write_yaml(path: Path, config: dict) -> None:
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
