"""Loss kernels shared by objectives."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.train.checkpoint import unwrap_model


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of softmax(h Wᵀ) without materialising the (N, V) logits or their float32 copies.

    Rows are processed in chunks; each chunk's logits are computed, turned into the loss and the logit gradient
    (softmax − one-hot) at once, and immediately contracted into grad_h and grad_W. Backward only rescales the
    stored gradients. Matmuls run in the autocast dtype; softmax statistics and grad_W accumulate in float32."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, labels: Tensor, chunk: int, ignore_index: int) -> Tensor:
        dev = h.device.type
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        cdtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
        acc = torch.promote_types(cdtype, torch.float32)  # softmax statistics in at least float32
        with torch.autocast(dev, enabled=False):
            w = weight.to(cdtype)
            valid_all = labels != ignore_index
            n_valid = valid_all.sum().clamp(min=1)
            grad_h = torch.empty(h.shape, dtype=cdtype, device=h.device)
            grad_w = torch.zeros(weight.shape, dtype=acc, device=h.device)
            total = torch.zeros((), dtype=acc, device=h.device)
            for s in range(0, h.shape[0], chunk):
                hc = h[s : s + chunk].to(cdtype)  # (c, d)
                lc, valid = labels[s : s + chunk], valid_all[s : s + chunk]
                safe = lc.clamp(min=0)
                logits = (hc @ w.t()).to(acc)  # (c, V)
                lse = torch.logsumexp(logits, dim=-1)
                target = logits.gather(1, safe[:, None]).squeeze(1)
                total = total + ((lse - target) * valid).sum()
                if not need_grad:
                    continue
                g = torch.exp(logits - lse[:, None])  # softmax
                g.scatter_add_(1, safe[:, None], -torch.ones_like(g[:, :1]))
                g = (g * (valid[:, None] / n_valid)).to(cdtype)
                grad_h[s : s + chunk] = g @ w
                grad_w += (g.t() @ hc).to(acc)
        if need_grad:
            ctx.save_for_backward(grad_h.to(h.dtype), grad_w.to(weight.dtype))
        return total / n_valid

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out, grad_w * grad_out, None, None, None


def linear_cross_entropy(
    h: Tensor, weight: Tensor, labels: Tensor, *, chunk: int = 4096, ignore_index: int = -100
) -> Tensor:
    """Mean cross-entropy (nats) of logits h @ weight.T (h: (N, d), weight: (V, d), labels: (N,)), chunked."""
    return _LinearCrossEntropy.apply(h, weight, labels, chunk, ignore_index)


def lm_head_loss(model: nn.Module, h: Tensor, labels: Tensor, *, chunked: bool = True) -> Tensor:
    """Mean cross-entropy of the model's LM head over hidden states h (..., d_model) against labels (...).

    A plain linear head (GPT, Llama) takes the chunked kernel above; heads with a transform, bias or rescale
    (BERT, T5, BART) go through `model.logits` and F.cross_entropy."""
    core = unwrap_model(model)
    cfg = core.config
    plain = not (cfg.lm_head_transform or cfg.lm_head_bias or cfg.scale_tied_logits)
    if chunked and plain:
        return linear_cross_entropy(h.flatten(0, -2), core.lm_head.weight, labels.flatten())
    logits = core.logits(h)
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100)
