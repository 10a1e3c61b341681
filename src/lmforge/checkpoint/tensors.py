"""The tensors of a state dict as a checkpoint names them: wrapper-free keys, one identity per shared (tied) view,
and a sharded model's DTensors seen as this rank's part or cut from full tensors."""

from __future__ import annotations

import sys

import torch


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
    with it (DistributedDataParallel), since a model may legitimately have a child called ``module``.
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


def shard_like(own: dict[str, torch.Tensor], full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`full` (name → full tensor, the same on every rank) with each tensor that is sharded in `own` cut into this
    rank's shard, ready for `load_state_dict`; `full` itself for a model without DTensors. No communication."""
    if not any(is_dtensor(t) for t in own.values()):
        return full
    from torch.distributed.tensor import distribute_tensor

    out = dict(full)
    for name, mine in own.items():
        if name in full and is_dtensor(mine):
            t = full[name].to(mine.device, mine.dtype)
            out[name] = distribute_tensor(t, mine.device_mesh, mine.placements, src_data_rank=None)
    return out
