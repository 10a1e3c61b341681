"""Fixed corruption for validation: the same window always gets the same noise, so successive evaluations of a
run score the same predictions, and evaluating leaves the training RNG stream untouched."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

EVAL_SEED = 0x5EED


def with_fixed_noise(transform: Callable[[Tensor], dict[str, Tensor]], tokens: Tensor, seed: int = 0):
    """transform(tokens) under a CPU RNG seeded from the window contents (tokens: (B, T + 1) integer ids)."""
    # A cheap content hash: position-weighted sum of the ids, in int64 (wraps harmlessly).
    weights = torch.arange(1, tokens.numel() + 1, dtype=torch.int64).view_as(tokens) * 2_654_435_761
    key = int((tokens.long() * weights).sum()) ^ (seed + EVAL_SEED)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(key & 0x7FFF_FFFF_FFFF_FFFF)
        return transform(tokens)
