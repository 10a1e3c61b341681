"""Causal language modelling (GPT-1 §3.1): L1 = Σ_i log P(u_i | u_{i−k}, …, u_{i−1})."""

from __future__ import annotations

from torch import Tensor, nn

from lmforge.objectives.base import LossOutput, Objective
from lmforge.objectives.losses import lm_head_loss
from lmforge.registry import OBJECTIVES


@OBJECTIVES.register("causal_lm")
class CausalLM(Objective):
    """Next-token prediction over packed windows: inputs x[:, :-1], targets x[:, 1:]."""

    name = "causal_lm"
    scores_labels = True
    language_model = True

    def transform(self, tokens: Tensor) -> dict[str, Tensor]:
        return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        h = model(batch["input_ids"], return_logits=False).last_hidden_state  # (B, T, d)
        labels = batch["labels"]
        # Mean negative log-likelihood in nats, softmax statistics in float32.
        loss = lm_head_loss(model, h, labels)
        return LossOutput(loss, labels.numel())
