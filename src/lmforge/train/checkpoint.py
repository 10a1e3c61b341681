"""Crash-safe checkpoints: save, verify, find and load weights, config and training state.

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

A run with ``train.parallel=fsdp`` writes sharded checkpoints instead (``train/dcp.py``): the same directory
and files, except that ``model.safetensors`` is replaced by

- ``dcp/``: a torch.distributed.checkpoint directory: ``.metadata`` (every tensor's global shape, dtype and
  where its chunks lie) and one ``__<rank>_<i>.distcp`` file per writing rank holding that rank's shards. Its
  tensors are ``model.<name>`` (the weights, wrapper-free names as above) and ``optim.state.<name>.<key>``
  (AdamW's moments and step, Muon's momentum), each stored as the shards the ranks held;
- ``train_state.pt`` also holds ``optim_rest``: the optimizer's param groups and its non-tensor state (plain
  data, so the checkpoint never holds pickled objects beside DCP's own metadata, which is read with an allowlist).

Every rank writes its own shards into the scratch dir; rank 0 writes the other files and, once every shard is on
disk (hashed by the rank that wrote it), the manifest, and publishes the directory with one rename. A sharded
checkpoint loads into any number of processes (DCP reshards on load), and ``read_weights`` consolidates its
weights in a single process, so ``lmforge.load``, ``lmforge convert`` and ``run.init`` read it like any other.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

# Reading checkpoints lives a floor below (lmforge/checkpoints.py: config's resume rules use it), and so does
# writing their files (lmforge/checkpoint_write.py: save_pretrained uses it); callers keep reading its names from
# here too.
from lmforge import checkpoints
from lmforge.checkpoint_write import Tokenizer, write_failure, write_manifest, write_side_files, write_weights
from lmforge.checkpoints import (  # noqa: F401
    BEST_DIR,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    MANIFEST_FILE,
    TRAIN_STATE_FILE,
    WEIGHTS_FILE,
    _checkpoints_in,
    _step_of,
    is_sharded,
    latest_checkpoint,
    list_checkpoints,
    model_checkpoint,
    read_config,
    read_weights,
    verify_checkpoint,
)
from lmforge.dcp_read import SHARDS_DIR, SHARDS_METADATA  # noqa: F401
from lmforge.errors import LMForgeError
from lmforge.files import (
    HashingWriter,
    fsync_dir,
    hash_file,
    load_torch_file,
    os_reason,
    pid_alive,
    refuse_link,
    write_atomic,
)
from lmforge.models.wrappers import unwrap_model
from lmforge.train.parallel import shard_like
from lmforge.train.rundir import check_lock

_SCRATCH_RE = re.compile(r"\.(tmp|old)-step_(\d+)-(\d+)(?:-([0-9a-f]+))?")
# Scratch dirs carry the writer's pid and this nonce: a container's trainer is PID 1 in every run, so the pid
# alone cannot tell this process's scratch dirs from those a killed predecessor with the same pid left.
_NONCE = os.urandom(4).hex()
# Leaf types torch.load(weights_only=True) accepts (plus torch.dtype / torch.device instances).
NONFINITE_DIR = "nonfinite"
"""RUN/checkpoints/nonfinite: the checkpoints a run saved after its last good one, set aside when a non-finite streak
stopped it."""
_PLAIN_LEAVES = (torch.Tensor, nn.Parameter, int, float, bool, complex, str, bytes, type(None))


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
        _check_plain_data(train_state, "train_state")
    root = Path(run_dir) / CHECKPOINTS_DIR
    final = root / f"step_{step}"
    tmp = root / f".tmp-step_{step}-{os.getpid()}-{_NONCE}"
    contents = (step, model, config, tokenizer, train_state, on_partial)
    _write_dir(tmp, final, f"save checkpoint step_{step}", contents)
    if keep_last is not None:
        _prune(root, step, keep_last, protect)
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
            _remove_stale_scratch(final.parent)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        _write_contents(tmp, *contents)
        _publish(tmp, final)
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
    model: nn.Module,
    config: dict,
    tokenizer: Tokenizer | None,
    train_state: dict | None,
    on_partial: Callable[[], None] | None,
) -> None:
    """Fill the scratch directory; the manifest comes last and only after every file is on disk."""
    write_side_files(tmp, config, tokenizer)
    if on_partial is not None:
        on_partial()
    write_weights(tmp, model if isinstance(model, Mapping) else unwrap_model(model).state_dict())
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


def write_train_state(tmp: Path, train_state: dict) -> tuple[int, str]:
    """torch.save `train_state` into `tmp`, hashed as it is written and fsynced → (size, sha256 hex).

    The zip format's CRC-32 of each record is left out where torch allows (it took 2.2 s of 2.8 s for 1.3 GB of
    optimizer state on a 2-core CPU): the manifest's sha256 covers the file."""
    with open(tmp / TRAIN_STATE_FILE, "wb") as f, _without_zip_crc():
        out = HashingWriter(f)
        try:
            torch.save(train_state, out)
        except RuntimeError as e:  # torch's zip writer reports a failed write as its own error
            if out.error is None:
                raise
            raise out.error from e
        f.flush()
        os.fsync(f.fileno())
    return out.size, out.sha256.hexdigest()


@contextmanager
def _without_zip_crc():
    try:
        from torch.utils.serialization import config  # torch >= 2.6
    except ImportError:
        yield
        return
    before, config.save.compute_crc32 = config.save.compute_crc32, False
    try:
        yield
    finally:
        config.save.compute_crc32 = before


def _publish(tmp: Path, final: Path) -> None:
    """Rename the finished scratch dir into place; a same-step checkpoint is replaced. A run whose run-dir lock is
    no longer its own (a second process got in) stops here instead (`RunLock.check`)."""
    check_lock(final, f"checkpoint {final.name} was not saved")
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}-{_NONCE}")
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


def load_weights(ckpt: Path, model: nn.Module, strict: bool = True) -> tuple[list[str], list[str]]:
    """Copy checkpoint weights into ``model`` (possibly compiled, DDP-wrapped or sharded: each rank keeps its
    shard of the full tensors), keeping its tied weights.

    Returns the (missing, unexpected) key names, which can be non-empty only when ``strict`` is False.
    """
    return checkpoints.load_weights(ckpt, unwrap_model(model), strict, shard=shard_like)


def _prune(root: Path, step: int, keep_last: int, protect: tuple[int, ...] = ()) -> None:
    """Delete older checkpoints beyond ``keep_last`` (never those in ``protect``); failures only warn, the new
    checkpoint is safe."""
    older = [c for c in _checkpoints_in(root) if _step_of(c) < step]
    for ckpt in older[: max(0, len(older) - (keep_last - 1))]:
        if _step_of(ckpt) in protect:
            continue
        # Renamed out of the way first: a reader of the run (lmforge.load, generate) sees a whole checkpoint or
        # none, never one half deleted.
        doomed = root / f".tmp-{ckpt.name}-{os.getpid()}-{_NONCE}"
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
    for c in _checkpoints_in(root):
        if good is not None and _step_of(c) <= good:
            continue
        aside.mkdir(exist_ok=True)
        if (aside / c.name).exists():  # left by an earlier streak: the newer one replaces it
            shutil.rmtree(aside / c.name)
        c.rename(aside / c.name)
        moved.append(c.name)
    if moved:
        fsync_dir(root)
    return moved


def _remove_stale_scratch(root: Path) -> None:
    """Remove scratch dirs left by crashed saves (their process is gone)."""
    if os.name != "posix":  # os.kill(pid, 0) only probes on POSIX
        return
    for p in root.iterdir():
        m = _SCRATCH_RE.fullmatch(p.name)
        if not m or m[4] == _NONCE or (int(m[3]) != os.getpid() and pid_alive(int(m[3]))):
            continue
        # An .old- dir whose step_<N> is missing is the only copy left: keep it for the user.
        if m[1] == "tmp" or (root / f"step_{m[2]}").exists():
            shutil.rmtree(p, ignore_errors=True)


def _check_plain_data(obj: Any, where: str) -> None:
    """Reject values that ``torch.load(weights_only=True)`` would refuse, naming where they are."""
    if type(obj) in (dict, OrderedDict):
        for k, v in obj.items():
            _check_plain_data(k, f"{where} key {k!r}")
            _check_plain_data(v, f"{where}[{k!r}]")
    elif type(obj) in (list, tuple, torch.Size):
        for i, v in enumerate(obj):
            _check_plain_data(v, f"{where}[{i}]")
    elif type(obj) not in _PLAIN_LEAVES and not isinstance(obj, (torch.dtype, torch.device)):
        raise TypeError(
            f"{where} has type {type(obj).__name__}, which torch.load(weights_only=True) cannot read; "
            "store tensors and plain Python data only"
        )


def load_train_state(ckpt: Path) -> dict:
    """The training state saved with a checkpoint; files holding anything but plain data are refused."""
    path = Path(ckpt) / TRAIN_STATE_FILE
    if not path.is_file():
        raise LMForgeError(f"no {TRAIN_STATE_FILE} in {ckpt}")
    state = load_torch_file(path)
    if not isinstance(state, dict):
        raise LMForgeError(f"{path} does not hold a dict")
    return state
