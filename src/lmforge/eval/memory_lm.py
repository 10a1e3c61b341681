"""Evaluation with memory (Transformer-XL §4): a split's token stream scored in consecutive segments of seq_len
tokens, each attending to the cached hidden states of the mem_len tokens before it.

The paper evaluates its WikiText-103 base model on segments of 64 tokens with 640 of memory and relative distances
clamped at 400 (model.clamp_len); mem_len = 0 gives the vanilla model's segment-by-segment evaluation, every
segment scored without context. The stream is cut into `batch_size` rows (data/stream.py), each scored from its
start."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from lmforge.data.stream import StreamLoader
from lmforge.errors import LMForgeError
from lmforge.objectives.losses import lm_head_loss
from lmforge.progress import progress


@dataclass
class MemoryEval:
    loss: float
    """Mean negative log-likelihood (nats/token) of every scored token."""
    n_tokens: int

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 50.0))


@torch.no_grad()
def evaluate_with_memory(
    model: torch.nn.Module,
    data_dir: str | Path,
    *,
    seq_len: int,
    mem_len: int,
    split: str = "val",
    batch_size: int = 8,
    max_batches: int | None = None,
) -> MemoryEval:
    """Mean loss of a Transformer-XL decoder over consecutive segments of a prepared split, carrying memory."""
    cfg = model.config
    if not cfg.position_scheme.recurrent or not cfg.is_decoder:
        raise LMForgeError(f"model '{cfg.name}' is not a Transformer-XL decoder (model.position='xl', arch decoder)")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    loader = StreamLoader(Path(data_dir), split, seq_len=seq_len, batch_size=batch_size)  # type: ignore[arg-type]
    total, n, mems = 0.0, 0, None
    n_batches = (loader.row_len - 1) // seq_len
    n_batches = n_batches if max_batches is None else min(n_batches, max_batches)
    for tokens in progress(loader.eval_batches(max_batches), total=n_batches, desc="eval with memory", unit="seg"):
        tokens = tokens.to(device)
        out = model(tokens[:, :-1], mems=mems, use_mems=True, mem_len=mem_len, return_logits=False)
        mems = out.mems
        labels = tokens[:, 1:]
        total += float(lm_head_loss(model, out.last_hidden_state, labels)) * labels.numel()
        n += labels.numel()
    model.train(was_training)
    return MemoryEval(total / max(n, 1), n)
