"""Multi-token prediction (Gloeckle et al. 2024; DeepSeek-V3 §2.2): next-token loss plus the losses of extra heads
that predict tokens t+2 .. t+1+D from position t. The heads are model fields (model.mtp_heads, mtp_sequential,
mtp_head; see models/mtp.py: the next-token head is the decoder's last block, the extra heads its siblings on the
trunk's output), so a saved run reloads with them; inference uses the next-token head only.

Gloeckle et al. eq. (2), L_n = -sum_t sum_{i=1..n} log P(x_{t+i} | z_{t:1}): the cross-entropies of all n = D + 1
heads summed (reduction=sum, weight=1), each one averaged over the window positions whose target it sees.
DeepSeek-V3 adds λ/D times the sum of its D depth losses to the main loss (reduction=mean, weight=λ: 0.3, later 0.1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models.lm_head import cross_entropy
from lmforge.objectives.base import LossOutput, Objective
from lmforge.registry import OBJECTIVES


@dataclass
class MTPOptions:
    reduction: Literal["sum", "mean"] = "sum"
    """How the extra depths' losses combine: summed (Gloeckle et al.) or averaged over depths (DeepSeek-V3)."""
    weight: float = 1.0
    """Factor on the combined extra-depth loss (DeepSeek-V3's λ)."""


@OBJECTIVES.register("mtp")
class MultiTokenPrediction(Objective):
    """Causal LM over packed windows with D extra prediction depths; validation scores the next token only, so
    its loss, perplexity and bits per byte compare with causal_lm runs."""

    name = "mtp"
    Options = MTPOptions
    language_model = True

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        m = cfg.model
        if not m.is_decoder or m.mtp_heads < 1:
            raise LMForgeError(
                "objective 'mtp' trains a decoder with multi-token prediction heads: set model.mtp_heads >= 1 "
                "(e.g. --model.mtp_heads=2, or --model.preset=gpt-mtp-tiny)"
            )
        if self.options.weight < 0:
            raise LMForgeError(f"objective.weight must be >= 0, got {self.options.weight}")
        if m.mtp_heads >= cfg.train.seq_len:
            raise LMForgeError(f"model.mtp_heads={m.mtp_heads} needs train.seq_len > {m.mtp_heads}")

    def transform(self, tokens: Tensor) -> dict[str, Tensor]:
        # Depth k's targets are labels[:, k:]: token t + k + 1 for position t.
        return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}

    def depth_losses(self, model: nn.Module, batch: dict[str, Tensor], extra: bool = True) -> list[Tensor]:
        """Mean cross-entropy per depth: [next token, token t+2, ..., token t+1+D] (only the first when not extra)."""
        labels = batch["labels"]  # (B, T)
        out = model(batch["input_ids"], mtp=extra)
        losses = [cross_entropy(out.logits, labels)]
        for k, logits in enumerate(out.mtp_logits or [], start=1):  # (B, T - k, V) against labels[:, k:]
            losses.append(cross_entropy(logits, labels[:, k:]))
        return losses

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        # Evaluation (model.eval()) skips the extra heads: the validation loss is the next-token loss.
        main, *depth = self.depth_losses(model, batch, extra=model.training)
        n = batch["labels"].numel()
        if not depth:
            return LossOutput(main, n)
        extra = sum(depth)
        if self.options.reduction == "mean":
            extra = extra / len(depth)
        return LossOutput(main + self.options.weight * extra, n)
