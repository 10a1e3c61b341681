"""Random-number-generator state of a run (Python, NumPy, torch CPU/CUDA) as tensors and plain data, so that it
saves with `torch.save` and loads back with `torch.load(weights_only=True)`."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from lmforge.errors import LMForgeError


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy (global), torch CPU and CUDA generator states as tensors and plain data."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(mt), "gauss": gauss},
        # uint32 keys fit losslessly in int64, which torch stores natively.
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Undo :func:`capture_rng_state`; CUDA states are restored for the devices present."""
    try:
        py = state["python"]
        random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
        npy = state["numpy"]
        keys = npy["keys"].numpy().astype(np.uint32)
        np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
        raise LMForgeError(f"training state holds a malformed RNG state: {e}") from e
