"""Sharded checkpoints of train.parallel=fsdp runs with torch.distributed.checkpoint (DCP); the layout is in
write.py's docstring.

Every rank writes the shards it holds; a checkpoint written by N processes loads into M (DCP reshards on load) and
into one process without any process group (`read_full_weights`, for `lmforge.load` and `lmforge convert`: its
metadata is unpickled through an allowlist). The crash-safety rules of the single-file checkpoints hold: a scratch
dir renamed into place once the manifest (sizes and sha256 of every file) is written last, stale scratch dirs
removed, the newest checkpoint that verifies chosen. With `async_save`, the state is copied to CPU memory before
`save` returns and written by a background thread; the checkpoint appears when it is complete, and a run killed
meanwhile keeps its previous one.

`torch.distributed.checkpoint` (0.6 s to import) is imported by the functions that use it, so that a run with plain
checkpoints never pays for it. The ranks are described by any object with `enabled`, `is_main`, `rank` and
`world_size` (train/distributed.py's `DistInfo`), so that this package stays below the training machinery."""

from __future__ import annotations

import dataclasses
import enum
import pickle
import shutil
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lmforge.checkpoint.layout import CHECKPOINTS_DIR, SHARDS_DIR, SHARDS_METADATA, TRAIN_STATE_FILE, scratch_dir
from lmforge.checkpoint.rotate import prune, remove_stale_scratch
from lmforge.checkpoint.tensors import normalize_keys
from lmforge.checkpoint.train_state import check_plain_data, write_train_state
from lmforge.checkpoint.write import publish, refuse_links, write_manifest, write_side_files
from lmforge.errors import LMForgeError
from lmforge.files import hash_file, os_reason


class Ranks(Protocol):
    """The processes of a run, as train/distributed.py's `DistInfo` describes them."""

    enabled: bool
    rank: int
    world_size: int

    @property
    def is_main(self) -> bool: ...


OPTIM_REST = "optim_rest"
"""train_state.pt key: the optimizer's param groups and non-tensor state of a sharded checkpoint."""


# --- what is saved ------------------------------------------------------------------------------------------------


def _optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    return list(getattr(optimizer, "optimizers", {"": optimizer}).values())


def _state(model: nn.Module, optimizer: Any, weights: nn.Module) -> tuple[dict[str, Tensor], dict, dict]:
    """(DCP tensors by key, model state dict, optimizer state dict) of a run: `weights` is what a checkpoint holds
    of the model (the model itself, or a view of its trainable tensors); the optimizer's state is keyed by
    parameter name (get_state_dict), so it reshards with the model."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, _optimizers(optimizer))
    if weights is not model:
        own = weights.state_dict()
        names = normalize_keys(list(own))
        msd = {names[k]: v for k, v in own.items()}
    tensors = {}
    for name, t in msd.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"model state entry '{name}' is not a tensor")
        tensors[f"model.{name}"] = t
    for name, entries in osd["state"].items():
        for key, v in entries.items():
            if isinstance(v, Tensor):
                tensors[f"optim.state.{name}.{key}"] = v
    return tensors, msd, osd


def _optim_rest(osd: dict) -> dict:
    """What of an optimizer state dict is not a tensor (param groups, scalar state): plain data."""
    state = {n: {k: v for k, v in e.items() if not isinstance(v, Tensor)} for n, e in osd["state"].items()}
    return {"param_groups": osd["param_groups"], "state": state}


# --- saving -------------------------------------------------------------------------------------------------------


class ShardedCheckpoints:
    """Writes a run's sharded checkpoints; every rank calls every method, in the same order."""

    def __init__(self, dist_info: Ranks, async_save: bool) -> None:
        self.dist, self.async_save = dist_info, async_save
        # Async writes run collectives from a background thread: on a group of their own (gloo: DCP needs a CPU
        # backend for them), never interleaved with the training's.
        self.group = dist.new_group(backend="gloo") if async_save else None
        self.thread: threading.Thread | None = None
        self.error: tuple[int, BaseException] | None = None

    def save(
        self, run_dir: Path, step: int, model: nn.Module, optimizer: Any, weights: nn.Module, *, config: dict,
        tokenizer: Any, train_state: dict, keep_last: int, protect: tuple[int, ...] = (),
        on_partial: Callable[[], None] | None = None,
    ) -> Path:  # fmt: skip
        """Write RUN/checkpoints/step_<step> (in the background with async_save); returns its final path."""
        self.wait()
        root = Path(run_dir) / CHECKPOINTS_DIR
        final = root / f"step_{step}"
        tensors, _, osd = _state(model, optimizer, weights)
        train_state = {**train_state, OPTIM_REST: _optim_rest(osd)}
        tmp = self._begin(root, step, config, tokenizer, train_state)
        import torch.distributed.checkpoint as dcp

        shards = dcp.FileSystemWriter(str(tmp / SHARDS_DIR))
        job = (tmp, final, step, keep_last, protect, on_partial)
        try:
            if not self.async_save:
                dcp.save(tensors, storage_writer=shards)
                self._finish(job, None)
                return final
            future = dcp.async_save(tensors, storage_writer=shards, process_group=self.group)
        except _SavedButStopped:
            raise
        except Exception as e:
            self._abandon(tmp)
            raise LMForgeError(f"could not save checkpoint step_{step}: {dcp_reason(e)}") from e
        self.thread = threading.Thread(target=self._background, args=(job, future), daemon=False)
        self.thread.start()
        return final

    def wait(self) -> None:
        """Block until the checkpoint being written in the background is complete; raise if it failed."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            (step, e), self.error = self.error, None
            if isinstance(e, _SavedButStopped):
                raise e
            raise LMForgeError(f"could not save checkpoint step_{step}: {dcp_reason(e)}") from e

    def _begin(self, root: Path, step: int, config: dict, tokenizer: Any, train_state: dict) -> Path:
        """Rank 0 makes the scratch dir and writes config, tokenizer and train state; every rank gets its path."""
        tmp, error = None, None
        if self.dist.is_main:
            try:
                refuse_links(root / f"step_{step}")
                check_plain_data(train_state, "train_state")
                root.mkdir(parents=True, exist_ok=True)
                remove_stale_scratch(root)
                tmp = scratch_dir(root / f"step_{step}")
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
                write_side_files(tmp, config, tokenizer)
                write_train_state(tmp, train_state)
                (tmp / SHARDS_DIR).mkdir()
            except LMForgeError as e:
                error = str(e)
            except (OSError, ValueError, TypeError) as e:
                error = f"could not save checkpoint step_{step}: {os_reason(e) if isinstance(e, OSError) else e}"
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
        tmp, error = _broadcast((str(tmp) if tmp else None, error), self.dist)
        if error:
            raise LMForgeError(error)
        return Path(tmp)

    def _background(self, job: tuple, future: Any) -> None:
        try:
            self._finish(job, future)
        except BaseException as e:  # noqa: BLE001 — reported by the next wait()
            self.error = (job[2], e)

    def _finish(self, job: tuple, future: Any) -> None:
        """Once this rank's shards are written: hash them; rank 0 writes the manifest and publishes the dir."""
        tmp, final, step, keep_last, protect, on_partial = job
        published = False
        try:
            if future is not None:
                future.result()
            mine = _hash_own_shards(tmp, self.dist.rank)
            every = [mine]
            if self.dist.enabled:
                every = [None] * self.dist.world_size
                dist.all_gather_object(every, mine, group=self.group)
            if self.dist.is_main:
                if on_partial is not None:
                    on_partial()
                known = {k: v for files in every for k, v in files.items()}
                write_manifest(tmp, step, known)
                publish(tmp, final)
                published = True
                prune(final.parent, step, keep_last, protect)
        except BaseException:
            self._abandon(tmp)
            raise
        finally:
            if future is None and self.dist.enabled:
                try:
                    dist.barrier()  # a synchronous save returns once the checkpoint is published
                except Exception as e:
                    if published:  # another process died after its part: what was saved is whole, say so
                        raise _SavedButStopped(
                            f"checkpoint step_{step} is saved in {final}, but another process stopped during the "
                            f"save: {dcp_reason(e)}"
                        ) from e
                    raise

    def _abandon(self, tmp: Path) -> None:
        if self.dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)


class _SavedButStopped(LMForgeError):
    """The checkpoint was published, then a collective of the save failed (another process died)."""


def _hash_own_shards(tmp: Path, rank: int) -> dict[str, dict]:
    """{relative path: {size, sha256}} of the shard files this rank wrote (fsynced), hashed in parallel with the
    other ranks; rank 0 hashes whatever is left."""
    out = {}
    for path in sorted((tmp / SHARDS_DIR).glob(f"__{rank}_*.distcp")):
        size, digest = hash_file(path, fsync=True)
        out[path.relative_to(tmp).as_posix()] = {"size": size, "sha256": digest}
    return out


def _broadcast(obj: Any, dist_info: Ranks) -> Any:
    if not dist_info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# --- loading ------------------------------------------------------------------------------------------------------


def load_sharded(path: Path, model: nn.Module, optimizer: Any, weights: nn.Module, train_state: dict) -> None:
    """Load sharded checkpoint `path`'s weights and optimizer state into this run, whatever its world size (every
    rank calls it; `train_state` is the checkpoint's train_state.pt)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict, set_state_dict

    path = Path(path)
    stored = set(read_metadata(path).state_dict_metadata)
    tensors, msd, osd = _state(model, optimizer, weights)
    missing = [k for k in tensors if k.startswith("model.") and k not in stored]
    if missing:
        raise LMForgeError(f"checkpoint {path} does not match the model: key '{missing[0][6:]}' is missing from it")
    # State the checkpoint lacks belongs to parameters that never had a gradient: they stay without state.
    tensors = {k: v for k, v in tensors.items() if k in stored}
    try:
        rest = train_state[OPTIM_REST]
        dcp.load(tensors, storage_reader=dcp.FileSystemReader(str(path / SHARDS_DIR)))
    except KeyError as e:
        raise LMForgeError(f"{path / TRAIN_STATE_FILE} does not match this run: no {e}") from e
    except Exception as e:  # noqa: BLE001 — DCP wraps every rank's error in one exception
        raise LMForgeError(f"could not load checkpoint {path}: {dcp_reason(e)}") from e
    msd = {name: tensors[f"model.{name}"] for name in msd}
    state = {}
    for name, entries in osd["state"].items():
        found = {k: tensors[f"optim.state.{name}.{k}"] for k in entries if f"optim.state.{name}.{k}" in tensors}
        if found:
            state[name] = {**rest["state"].get(name, {}), **found}
    osd = {"state": state, "param_groups": rest["param_groups"]}
    if weights is model:
        set_state_dict(model, _optimizers(optimizer), model_state_dict=msd, optim_state_dict=osd)
    else:
        own = weights.state_dict()
        names = normalize_keys(list(own))
        weights.load_state_dict({k: msd[names[k]] for k in own}, strict=False)
        set_optimizer_state_dict(model, _optimizers(optimizer), osd)


# --- reading in one process, without a process group ------------------------------------------------------------


def dcp_reason(e: BaseException) -> str:
    """One line for an error of DCP (which wraps the ranks' errors) or of the file system."""
    if isinstance(e, OSError):
        return os_reason(e)
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, inner = next(iter(failures.items()))
        inner = inner[0] if isinstance(inner, tuple) else inner
        return f"rank {rank}: {dcp_reason(inner) if isinstance(inner, BaseException) else inner}"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def read_full_weights(path: Path) -> dict[str, Tensor]:
    """Every weight of sharded checkpoint `path`, consolidated into full CPU tensors in this process (no process
    group needed)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = Path(path)
    meta = read_metadata(path)
    state = {
        k: torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in meta.state_dict_metadata.items()
        if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process": it is
            dcp.load(state, storage_reader=dcp.FileSystemReader(str(path / SHARDS_DIR)), no_dist=True)
    except Exception as e:  # noqa: BLE001
        raise LMForgeError(f"could not read the sharded weights of {path}: {dcp_reason(e)}") from e
    return {k[len("model.") :]: v for k, v in state.items()}


_ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    *(("pathlib", c) for c in ("Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata from its pickle, refusing any global but plain-data types: DCP's own dataclasses and
    enums (Metadata, TensorStorageMetadata, _StorageInfo, ...), torch.Size, dtypes, layouts and paths."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module.startswith("torch.distributed.checkpoint.") and module in sys.modules:
            found = getattr(sys.modules[module], name, None)
            if isinstance(found, type) and (dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)):
                return found
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in checkpoint metadata")


def read_metadata(path: Path):
    """DCP's metadata of sharded checkpoint `path`, read with an allowlist of types: the checkpoint dir may come
    from anywhere, and a plain unpickling would run whatever a crafted file names."""
    import torch.distributed.checkpoint  # noqa: F401 — the unpickler finds DCP's metadata types in sys.modules

    where = Path(path) / SHARDS_METADATA
    try:
        with open(where, "rb") as f:
            meta = _MetadataUnpickler(f).load()
    except FileNotFoundError as e:
        raise LMForgeError(f"{path} is not a sharded checkpoint: no {SHARDS_METADATA}") from e
    except OSError as e:
        raise LMForgeError(f"cannot read {where}: {os_reason(e)}") from e
    except Exception as e:  # noqa: BLE001 — any malformed pickle
        raise LMForgeError(f"{where} is not valid checkpoint metadata: {e}") from e
    if not hasattr(meta, "state_dict_metadata"):
        raise LMForgeError(f"{where} is not valid checkpoint metadata")
    return meta
