"""Where and how every run kind computes: its device, its autocast precision and its global seeds."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from lmforge.errors import LMForgeError
from lmforge.train.distributed import DistInfo


def pick_device(spec: str, dist: DistInfo, key: str = "train.device") -> torch.device:
    """The torch device `spec` names (`key`: its config key, for the error lines)."""
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", dist.local_rank)
        return torch.device("cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise LMForgeError(f"{key}: unknown device '{spec}'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LMForgeError(f"{key}=cuda but no CUDA GPU is available")
    if dev.type == "cuda" and dev.index is None:  # each rank's own GPU under torchrun (set_device needs an index)
        dev = torch.device("cuda", dist.local_rank)
    return dev


def autocast_for(device: torch.device, precision: str):
    """bf16 autocast on GPUs that support it (precision=auto|bf16), plain fp32 otherwise."""
    if precision == "fp32":
        return nullcontext()
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
