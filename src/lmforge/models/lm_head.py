"""The LM head's logits and their cross-entropy: the vocabulary-sized end of a language model's training step
(`Transformer.lm_loss`), and the cross-entropy every objective uses."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

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


class _CrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits (N, V) against labels (N,), skipping `ignore_index`; = F.cross_entropy.

    Saves the logits (in their own dtype) and one float32 log-sum-exp per row; the backward rebuilds the softmax
    from them in a single elementwise pass. F.cross_entropy keeps float32 log-probabilities instead (N·V·4 bytes:
    3.3 GB for GPT-2 at 16×1024 tokens), which its backward reads back, so this costs less memory and traffic."""

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, ignore_index: int) -> Tensor:
        valid = labels != ignore_index
        target = labels.masked_fill(~valid, 0)
        acc = torch.promote_types(logits.dtype, torch.float32)  # statistics in float32 at least
        lse = torch.logsumexp(logits.to(acc), dim=-1)  # (N,)
        picked = logits.gather(1, target[:, None]).squeeze(1).to(acc)
        n = valid.sum()  # no labelled token → 0/0 = nan, as F.cross_entropy
        ctx.save_for_backward(logits, target, valid, lse, n)
        return ((lse - picked) * valid).sum() / n

    @staticmethod
    def backward(ctx, grad: Tensor):
        logits, target, valid, lse, n = ctx.saved_tensors
        scale = (grad / n * valid)[:, None]  # (N, 1)
        probs = torch.exp(logits.to(lse.dtype) - lse[:, None])
        is_target = torch.arange(logits.shape[1], device=logits.device) == target[:, None]
        return ((probs - is_target.to(probs.dtype)) * scale).to(logits.dtype), None, None


def cross_entropy(logits: Tensor, labels: Tensor, ignore_index: int = -100) -> Tensor:
    """Mean cross-entropy (nats) over labelled positions of logits (..., V) and labels (...)."""
    return _CrossEntropy.apply(logits.flatten(0, -2), labels.flatten(), ignore_index)
