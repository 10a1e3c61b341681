"""Writing checkpoints, crash-safe: a run's step dirs, standalone checkpoint dirs and the run's config.

A checkpoint is a directory ``RUN/checkpoints/step_<N>/`` holding:

- ``model.safetensors``: weights; a tensor shared by several names (tied embeddings) is stored once and the
  other names are recorded in the file's metadata;
- ``config.yaml``: the resolved run config;
- ``train_state.pt``: optimizer/scheduler/RNG/data-loader state, read with ``torch.load(weights_only=True)``;
- the tokenizer files (whatever ``tokenizer.save(directory)`` writes);
- ``manifest.json``: size and sha256 of every other file. It is written last, so a checkpoint without it is
  an interrupted save.

Keys are stored without the ``_orig_mod.`` (torch.compile) and ``module.`` (DDP) wrapper prefixes, so
compiled, eager and DDP checkpoints are interchangeable.

A run with ``train.parallel=fsdp`` writes sharded checkpoints instead (``sharded.py``): the same directory
and files, except that ``model.safetensors`` is replaced by

- ``dcp/``: a torch.distributed.checkpoint directory: ``.metadata`` (every tensor's global shape, dtype and
  where its chunks lie) and one ``__<rank>_<i>.distcp`` file per writing rank holding that rank's shards. Its
  tensors are ``model.<name>`` (the weights, wrapper-free names as above) and ``optim.state.<name>.<key>``
  (AdamW's moments and step, Muon's momentum), each stored as the shards the ranks held;
- ``train_state.pt`` also holds ``optim_rest``: the optimizer's param groups and its non-tensor state (plain
  data, so the checkpoint never holds pickled objects beside DCP's own metadata, which is read with an allowlist).

Every file is written into a scratch dir and fsynced, the manifest last; the dir is then published with one rename
(after `rundir.check_lock`: the run-dir lock must still be this process's), and older checkpoints are pruned
(rotate.py). `save_pretrained` writes a standalone checkpoint through `write_model_files`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import nn

from lmforge.checkpoint.layout import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    MANIFEST_FILE,
    SHARDS_DIR,
    TIED_META,
    TRAIN_STATE_FILE,
    WEIGHTS_FILE,
    scratch_dir,
)
from lmforge.checkpoint.rotate import prune, remove_stale_scratch
from lmforge.checkpoint.rundir import check_lock
from lmforge.checkpoint.tensors import normalize_keys, view_key
from lmforge.checkpoint.train_state import check_plain_data, write_train_state
from lmforge.errors import LMForgeError
from lmforge.files import (
    fsync_dir,
    hash_file,
    os_error_of,
    os_reason,
    refuse_link,
    sort_safetensors_metadata,
    write_atomic,
    write_reason,
)

_RESERVED = {WEIGHTS_FILE, CONFIG_FILE, TRAIN_STATE_FILE, MANIFEST_FILE, SHARDS_DIR}


class Tokenizer(Protocol):
    def save(self, directory: Path) -> Any: ...


# --- a run's checkpoints --------------------------------------------------------------------------------------------


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: nn.Module,
    *,
    config: dict,
    tokenizer: Tokenizer | None = None,
    train_state: dict | None = None,
    keep_last: int | None = 3,
    protect: tuple[int, ...] = (),
    on_partial: Callable[[], None] | None = None,
) -> Path:
    """Atomically write ``run_dir/checkpoints/step_<step>`` and keep only the newest ``keep_last``.

    Checkpoints with a higher step (left by a run resumed from an earlier step) and those of the steps in
    ``protect`` (e.g. the last one before a run started to diverge) are not pruned. ``on_partial`` runs once the
    first files are in the scratch dir (a test's kill point).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
    if train_state is not None:
        check_plain_data(train_state, "train_state")
    root = Path(run_dir) / CHECKPOINTS_DIR
    final = root / f"step_{step}"
    contents = (step, model, config, tokenizer, train_state, on_partial)
    _write_dir(scratch_dir(final), final, f"save checkpoint step_{step}", contents)
    if keep_last is not None:
        prune(root, step, keep_last, protect)
    return final


def write_checkpoint_dir(
    directory: Path,
    model: nn.Module,
    *,
    config: dict,
    tokenizer: Tokenizer | None = None,
    step: int = 0,
) -> Path:
    """Atomically write one standalone checkpoint at ``directory`` (the layout of a ``step_<N>`` dir, no
    training state), replacing a checkpoint already there. ``lmforge.load(directory)`` reads it back."""
    final = Path(directory)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    _write_dir(tmp, final, f"write checkpoint {final}", (step, model, config, tokenizer, None, None))
    return final


def _write_dir(tmp: Path, final: Path, what: str, contents: tuple) -> None:
    """Write a checkpoint into scratch dir `tmp` and publish it atomically as `final`; on failure remove the
    scratch dir and raise one line ("could not <what>: <reason>")."""
    refuse_links(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.parent.name == CHECKPOINTS_DIR:
            remove_stale_scratch(final.parent)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        _write_contents(tmp, *contents)
        publish(tmp, final)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        failure = write_failure(what, e)
        if failure is not None:
            raise failure from e
        raise


def refuse_links(final: Path) -> None:
    """One line when a checkpoint's path is a symbolic link, or the RUN/checkpoints dir it goes into: the run would
    write, and rotate (delete), checkpoints wherever the link points."""
    if final.parent.name == CHECKPOINTS_DIR:
        refuse_link(final.parent)
    refuse_link(final)


def save_run_config(run_dir: Path, config: dict) -> Path:
    """Atomically write the resolved config to ``run_dir/config.yaml``."""
    path = Path(run_dir) / CONFIG_FILE
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    except OSError as e:
        raise LMForgeError(f"could not write {path}: {os_reason(e)}") from e
    return path


def _write_contents(
    tmp: Path,
    step: int,
    model: nn.Module | Mapping[str, torch.Tensor],
    config: dict,
    tokenizer: Tokenizer | None,
    train_state: dict | None,
    on_partial: Callable[[], None] | None,
) -> None:
    """Fill the scratch directory; the manifest comes last and only after every file is on disk."""
    write_side_files(tmp, config, tokenizer)
    if on_partial is not None:
        on_partial()
    # A compiled or DDP-wrapped model's keys carry its wrappers' prefixes, which write_weights drops.
    write_weights(tmp, model if isinstance(model, Mapping) else model.state_dict())
    known: dict[str, dict] = {}
    if train_state is not None:
        # The weights are hashed (and fsynced) in a second thread while the training state is written: hashing and
        # file writes release the GIL, so a large checkpoint's two halves overlap.
        with ThreadPoolExecutor(1) as pool:
            weights = pool.submit(hash_file, tmp / WEIGHTS_FILE, True)
            size, digest = write_train_state(tmp, train_state)
            known[TRAIN_STATE_FILE] = {"size": size, "sha256": digest}
            size, digest = weights.result()
        known[WEIGHTS_FILE] = {"size": size, "sha256": digest}
    write_manifest(tmp, step, known)


def publish(tmp: Path, final: Path) -> None:
    """Rename the finished scratch dir into place; a same-step checkpoint is replaced. A run whose run-dir lock is
    no longer its own (a second process got in) stops here instead (`RunLock.check`)."""
    check_lock(final, f"checkpoint {final.name} was not saved")
    old = None
    if final.exists():
        old = scratch_dir(final, "old")
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except OSError:
        if old is not None:
            os.replace(old, final)
        raise
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --- the files of one checkpoint ------------------------------------------------------------------------------------


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
