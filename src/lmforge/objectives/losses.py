"""The LM-head loss of objectives that score every position (causal LM, Transformer-XL, XLNet, SFT)."""

from __future__ import annotations

from torch import Tensor, nn

from lmforge.models.wrappers import unwrap_model


def lm_head_loss(model: nn.Module, h: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy (nats) of the model's LM head over hidden states h (..., d_model) against labels (...),
    through `Transformer.lm_loss` (which `train.compile_scope=blocks|head` compiles on its own) of a wrapped model."""
    return unwrap_model(model).lm_loss(h, labels)
