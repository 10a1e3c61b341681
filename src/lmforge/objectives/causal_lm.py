"""Causal language modelling (GPT-1 §3.1): L1 = Σ_i log P(u_i | u_{i−k}, …, u_{i−1})."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.objectives.base import LossOutput, Objective
from lmforge.registry import OBJECTIVES


@OBJECTIVES.register("causal_lm")
class CausalLM(Objective):
    """Next-token prediction over packed windows: inputs x[:, :-1], targets x[:, 1:]."""

    name = "causal_lm"
    language_model = True

    def transform(self, tokens: Tensor) -> dict[str, Tensor]:
        return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        logits = model(batch["input_ids"]).logits  # (B, T, V)
        labels = batch["labels"]
        # Mean negative log-likelihood in nats; cross_entropy computes in float32 under bf16 autocast.
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return LossOutput(loss, labels.numel())
