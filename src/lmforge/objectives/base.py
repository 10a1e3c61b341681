"""The objective interface: a batch transform in the data path plus a loss over model outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn


@dataclass
class LossOutput:
    loss: Tensor
    """Scalar mean loss over the predicted tokens of the batch."""
    n_tokens: int
    """Number of predicted tokens the mean is over."""
    metrics: dict[str, float] = field(default_factory=dict)


class Objective:
    """Base class. `transform` turns a packed token window batch into model inputs + targets (vectorised, run on
    the fly so masking is dynamic); `loss` runs the model and scores it."""

    name: str = ""

    def __init__(self, cfg, tokenizer) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer

    def transform(self, tokens: Tensor) -> dict[str, Tensor]:
        """tokens: (B, T + 1) packed token windows → a batch dict of tensors."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        raise NotImplementedError
