"""Reading sharded (DCP) checkpoints without a process group: their metadata, unpickled through an allowlist, and
their weights consolidated in one process (for `lmforge.load`, `lmforge convert` and `run.init`). Writing and
resharded loading are train/dcp.py.

`torch.distributed.checkpoint` (0.6 s to import) is imported by the functions that read a sharded checkpoint, so
that a run with plain checkpoints never pays for it."""

from __future__ import annotations

import dataclasses
import enum
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.files import os_reason

SHARDS_DIR = "dcp"
"""The torch.distributed.checkpoint directory of a sharded checkpoint (train/dcp.py)."""
SHARDS_METADATA = f"{SHARDS_DIR}/.metadata"


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
