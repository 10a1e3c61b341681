"""Sequence-length schedule of pretraining (`train.seq_len_schedule`): short windows early in the run, longer ones
later, at the same tokens per step (sequence-length warmup, Li et al. 2022; the fast-encoder recipes of cramming and
MosaicBERT). Nothing in the loader changes: each (B, T + 1) packed window of a batch is cut into T/t consecutive
(t + 1)-token pieces that overlap by one token, as the loader's windows do, so the batch becomes (B·T/t, t + 1) and
every objective's transform sees the windows it always sees, only shorter: a causal LM's every target is still the
next token of its input, and each of the B·T tokens after a window's first is a target once, as before."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lmforge.errors import LMForgeError

if TYPE_CHECKING:
    from torch import Tensor

KEY = "train.seq_len_schedule"


def check_schedule(cfg) -> None:
    """Refuse, with one line, a schedule that is malformed, does not fit train.seq_len, or is set for an objective
    whose batches are not packed independent windows (a pretraining Config; nothing to do without a schedule)."""
    schedule, T = cfg.train.seq_len_schedule, cfg.train.seq_len
    if schedule is None:
        return
    if not schedule:
        raise LMForgeError(f"{KEY}: empty (leave it unset, or give [[0.0, LENGTH], [FRACTION, LENGTH], ...])")
    fractions, lengths = [], []
    for pair in schedule:
        if len(pair) != 2:
            raise LMForgeError(f"{KEY}: each entry is a pair [fraction, length], got {pair!r}")
        fraction, length = pair
        if not float(length).is_integer() or length < 2:
            raise LMForgeError(f"{KEY}: lengths are whole numbers of tokens >= 2, got {length:g}")
        fractions.append(fraction)
        lengths.append(int(length))
    if fractions[0] != 0.0:
        raise LMForgeError(f"{KEY}: the first fraction must be 0.0 (the run's start), got {fractions[0]:g}")
    if any(b <= a for a, b in zip(fractions, fractions[1:])) or fractions[-1] >= 1.0:
        raise LMForgeError(f"{KEY}: fractions must strictly increase and stay below 1, got {fractions}")
    if any(b <= a for a, b in zip(lengths, lengths[1:])):
        raise LMForgeError(f"{KEY}: lengths must strictly increase, got {lengths}")
    for length in lengths:
        if length > T or T % length:
            raise LMForgeError(f"{KEY}: length {length} does not divide train.seq_len={T}")
    from lmforge.objectives import OBJECTIVES

    name = cfg.objective.name
    if not OBJECTIVES.get(name).packed_windows(cfg.objective.options):
        raise LMForgeError(
            f"{KEY}: objective '{name}' does not train on packed independent windows (sentence pairs, document "
            "chunks or segments with memory), which the schedule cuts: leave it unset"
        )


def stage_lengths(schedule: list[list[float]] | None) -> list[int]:
    """The window lengths a (checked) schedule trains at, in order."""
    return [int(length) for _, length in schedule or []]


def length_at(schedule: list[list[float]], step: int, total: int) -> int:
    """The window length of optimizer step `step` (0-based) of a run of `total` planned steps: that of the last
    pair whose fraction of `total` is at most `step`."""
    length = int(schedule[0][1])
    for fraction, t in schedule:
        if step >= fraction * total:
            length = int(t)
    return length


def cut_windows(tokens: Tensor, length: int) -> Tensor:
    """(B, T + 1) packed windows → (B·T/length, length + 1): each window's consecutive pieces, overlapping by one
    token as the loader's windows do (piece j holds tokens [j·length, (j+1)·length] of its window); rows of one
    window stay together, in order. length == T returns the batch as it is."""
    T = tokens.shape[1] - 1
    if length == T:
        return tokens
    if T % length:
        raise LMForgeError(f"{KEY}: length {length} does not divide the windows' {T} tokens")
    return tokens.unfold(1, length + 1, length).reshape(-1, length + 1)


class DrawLengths:
    """Draw index → window length: draw n belongs to optimizer step n // grad_accum, whose length follows the
    run's planned steps (`total()`: the loop's, which a time budget replans). Counting draws, not reading the
    loop's step, keeps a batch built ahead in the prefetch thread on its own step's length."""

    def __init__(self, schedule: list[list[float]], grad_accum: int, total: Callable[[], int]) -> None:
        self.schedule, self.grad_accum, self.total = schedule, grad_accum, total

    def __call__(self, draw: int) -> int:
        return length_at(self.schedule, draw // self.grad_accum, self.total())
