"""Loss helpers shared by objectives."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.train.checkpoint import unwrap_model

VOCAB_ALIGN = 64


def aligned_head_logits(h: Tensor, weight: Tensor) -> Tensor:
    """h @ weight.T with the vocabulary padded to a multiple of 64 (padding logits are -inf).

    An odd vocabulary (GPT-2's 50,257) leaves the logits' rows misaligned for the tensor-core matmuls and the
    softmax kernels; padding the matrix (a cheap copy) and masking the extra columns through the bias keeps the
    softmax, the loss and every gradient exactly those of the unpadded head."""
    V = weight.shape[0]
    pad = -V % VOCAB_ALIGN
    if pad == 0:
        return F.linear(h, weight)
    w = F.pad(weight, (0, 0, 0, pad))
    bias = torch.zeros(V + pad, dtype=w.dtype, device=w.device)
    bias[V:] = float("-inf")
    return F.linear(h, w, bias)


def lm_head_loss(model: nn.Module, h: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy (nats) of the model's LM head over hidden states h (..., d_model) against labels (...).

    A plain linear head (GPT, Llama) runs with an aligned vocabulary; heads with a transform, bias or rescale
    (BERT, T5, BART) go through `model.logits`. Softmax statistics are float32 (cross_entropy under autocast)."""
    core = unwrap_model(model)
    cfg = core.config
    if cfg.lm_head_transform or cfg.lm_head_bias or cfg.scale_tied_logits:
        logits = core.logits(h)
    else:
        logits = aligned_head_logits(h, core.lm_head.weight)
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100)
