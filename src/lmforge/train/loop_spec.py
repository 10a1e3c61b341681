"""What a run kind gives the training loop besides its model, loss and batches: the checkpoint contents (`Saved`),
the evaluation and its checkpoint selection (`Selection`), and throughput and stopping facts (`LoopSpec`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn


@dataclass
class Saved:
    """What a checkpoint of the run holds besides the training state."""

    weights: nn.Module
    """The module whose state dict is saved (the model, or a view holding only trainable tensors)."""
    config: dict
    tokenizer: Any = None


@dataclass
class Selection:
    """Keep the checkpoint with the best value of a dev metric (in RUN/best)."""

    metric: str
    mode: Literal["max", "min"] = "max"

    def better(self, value: float, best: float | None) -> bool:
        return best is None or (value > best if self.mode == "max" else value < best)


@dataclass
class LoopSpec:
    """Everything a run kind gives the loop besides model, loss and batches."""

    saved: Callable[[], Saved]
    """Builds the checkpoint contents (called at each save)."""
    evaluate: Callable[[int], dict[str, float]] | None = None
    """Evaluation at a step → metrics (called on every rank; rank 0's result is logged and selects)."""
    eval_at: Callable[[int], bool] | None = None
    """Extra evaluation steps beside every `eval_every` and the last (e.g. epoch ends)."""
    eval_prefix: str = ""
    """Prefix of logged evaluation metrics (e.g. dev_)."""
    eval_fields: Callable[[int], dict] | None = None
    """Extra values logged beside an evaluation's metrics (e.g. the epoch)."""
    select: Selection | None = None
    tokens_per_step: int = 0
    """Tokens of one optimizer step over all ranks, for tokens/s (0 = examples only)."""
    flops_per_token: float | None = None
    peak_flops: float | None = None
    resume_hint: str = ""
    """The command that continues the run, for the stop message."""
    progress_every: int = 1
    stop_when: Callable[[dict[str, float]], bool] | None = None
    """Ends the run (with a checkpoint) at the first evaluation whose metrics it accepts (time-to-loss runs)."""
    worker_batches: bool = False
    """The batch source reads nothing the loop changes while training, so a forked worker process may build its
    batches (train.prefetch_worker)."""
