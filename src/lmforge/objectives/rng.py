"""Where an objective's corruption noise comes from.

Transforms draw every random number from `rng()`: the generator of the batch source that runs them (set with
`use_rng`), so the noise of a batch depends only on the seed and the data position — also when batches are built
in a background thread while the training step uses the global generator (dropout) — and a checkpoint resumes it
exactly. Outside a batch source `rng()` is None, which torch reads as its global generator.

Validation uses fixed noise: the same window always gets the same corruption, so successive evaluations score
the same predictions, and evaluating leaves the training stream untouched."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

EVAL_SEED = 0x5EED
_RNG: ContextVar[torch.Generator | None] = ContextVar("lmforge_objective_rng", default=None)


def rng() -> torch.Generator | None:
    """The generator transforms draw from (None: torch's global one)."""
    return _RNG.get()


@contextmanager
def use_rng(generator: torch.Generator | None) -> Iterator[None]:
    """Make `generator` the source of `rng()` in this thread for the duration of the block."""
    token = _RNG.set(generator)
    try:
        yield
    finally:
        _RNG.reset(token)


def with_fixed_noise(transform: Callable[[Tensor], dict[str, Tensor]], tokens: Tensor, seed: int = 0):
    """transform(tokens) with noise drawn from a generator seeded from the window contents (tokens: (B, T + 1))."""
    # A cheap content hash: position-weighted sum of the ids, in int64 (wraps harmlessly).
    weights = torch.arange(1, tokens.numel() + 1, dtype=torch.int64).view_as(tokens) * 2_654_435_761
    key = int((tokens.long() * weights).sum()) ^ (seed + EVAL_SEED)
    with use_rng(torch.Generator().manual_seed(key & 0x7FFF_FFFF_FFFF_FFFF)):
        return transform(tokens)
