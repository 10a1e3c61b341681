"""Prefix language modelling for decoder-only models (Raffel et al. 2020 §3.2.1; UniLM, Dong et al. 2019).

Each window is split at a random point: the prefix is fully visible to itself (the model's `mask="prefix"` with
`prefix_len`), the rest is causal, and only the continuation is scored. A loss on the prefix would leak: a prefix
position sees the token it would predict.

Encoder-decoders get the same two objectives from `t5.py`: style `prefix_lm` (the encoder reads the prefix, the
decoder writes the continuation) and style `lm` (T5 Table 2's "Language model" rows: the encoder reads only EOS, the
decoder predicts the whole text)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models.lm_head import cross_entropy
from lmforge.objectives.base import LossOutput, Objective
from lmforge.objectives.rng import rng, with_fixed_noise
from lmforge.registry import OBJECTIVES

IGNORE = -100


@dataclass
class PrefixLMOptions:
    min_prefix: float = 0.0
    """Shortest prefix as a fraction of seq_len (at least 1 token)."""
    max_prefix: float = 1.0
    """Longest prefix as a fraction of seq_len (at most seq_len - 1 tokens, so one token is always scored).
    The split point is uniform between the two (T5 §3.2.1 splits uniformly)."""


def prefix_bounds(seq_len: int, min_prefix: float, max_prefix: float) -> tuple[int, int]:
    """Inclusive range of prefix lengths for windows of seq_len inputs."""
    lo = max(1, round(min_prefix * seq_len))
    hi = min(seq_len - 1, round(max_prefix * seq_len))
    return lo, max(lo, hi)


@OBJECTIVES.register("prefix_lm")
class PrefixLM(Objective):
    """Random split per row; bidirectional prefix, causal continuation, loss on the continuation only."""

    name = "prefix_lm"
    scores_labels = True
    Options = PrefixLMOptions

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        o: PrefixLMOptions = self.options
        m = cfg.model
        if not m.is_decoder:
            raise LMForgeError(
                f"objective 'prefix_lm' trains decoder-only models, got model.arch='{m.arch}' "
                "(an encoder-decoder trains a prefix LM with objective t5 and objective.style=prefix_lm)"
            )
        if m.mask != "prefix":
            raise LMForgeError(
                "objective 'prefix_lm' needs a decoder with a prefix-visible mask: set --model.mask=prefix"
            )
        if not 0.0 <= o.min_prefix <= o.max_prefix <= 1.0:
            raise LMForgeError(
                f"objective.min_prefix and max_prefix must satisfy 0 <= min <= max <= 1, got {o.min_prefix}, "
                f"{o.max_prefix}"
            )
        if cfg.train.seq_len < 2:
            raise LMForgeError("objective 'prefix_lm' needs train.seq_len >= 2 (a prefix and a continuation)")

    def transform(self, tokens: Tensor) -> dict[str, Tensor]:
        B, T = tokens.shape[0], tokens.shape[1] - 1
        lo, hi = prefix_bounds(T, self.options.min_prefix, self.options.max_prefix)
        prefix_len = torch.randint(lo, hi + 1, (B,), generator=rng())
        labels = tokens[:, 1:].clone()
        # Position i predicts token i + 1; only predictions of continuation tokens (i + 1 >= prefix_len) count.
        labels[torch.arange(T)[None, :] < prefix_len[:, None] - 1] = IGNORE
        return {"input_ids": tokens[:, :-1], "labels": labels, "prefix_len": prefix_len}

    def eval_transform(self, tokens: Tensor) -> dict[str, Tensor]:
        """Validation batches get fixed noise (a function of the window), so evaluations are comparable."""
        return with_fixed_noise(self.transform, tokens, self.cfg.run.seed)

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        logits = model(batch["input_ids"], prefix_len=batch["prefix_len"]).logits  # (B, T, V)
        labels = batch["labels"]
        loss = cross_entropy(logits, labels, IGNORE)
        return LossOutput(loss, (labels != IGNORE).sum())
