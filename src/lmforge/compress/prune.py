"""Pruning: global unstructured magnitude pruning of the blocks' linear weights, and attention-head pruning
scored by the norm of each head's slice of the output projection (zeroed under a mask, or physically removed).

Both are followed by fine-tuning: masks made here with `torch.nn.utils.prune` stay applied while training (the
module computes weight = weight_orig * weight_mask before every forward); `make_permanent` folds them in."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils import prune

from lmforge.errors import LMForgeError

HeadSet = dict[tuple[str, int], list[int]]
"""(stack name, layer index) → head indices, e.g. {("decoder", 0): [1, 3]}."""


def block_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The linear layers inside transformer blocks (attention projections and MLPs): embeddings, LM head,
    pooler and task heads are left out, as their rows are per-token or per-class rather than redundant."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and ".blocks." in f".{n}"]


def magnitude_prune(model: nn.Module, sparsity: float, modules: list[nn.Linear] | None = None) -> int:
    """Zero the `sparsity` fraction of smallest-magnitude weights across all `modules` together (global
    unstructured pruning; default: `block_linears`). Returns the number of pruned weights."""
    if not 0 <= sparsity < 1:
        raise LMForgeError(f"sparsity must be in [0, 1), got {sparsity}")
    modules = modules if modules is not None else [m for _, m in block_linears(model)]
    if not modules:
        raise LMForgeError("the model has no linear layers to prune")
    params = [(m, "weight") for m in modules]
    prune.global_unstructured(params, pruning_method=prune.L1Unstructured, amount=sparsity)
    return sum(int((m.weight_mask == 0).sum()) for m in modules)


def weight_sparsity(modules: list[nn.Module]) -> float:
    """Fraction of exactly-zero entries over the modules' weights."""
    zeros = sum(int((m.weight == 0).sum()) for m in modules)
    total = sum(m.weight.numel() for m in modules)
    return zeros / max(total, 1)


def make_permanent(model: nn.Module) -> None:
    """Fold every pruning mask into its weight (drops weight_orig / weight_mask and the forward hooks)."""
    for m in model.modules():
        for name in [h._tensor_name for h in m._forward_pre_hooks.values() if isinstance(h, prune.BasePruningMethod)]:
            prune.remove(m, name)


# --- attention heads ------------------------------------------------------------------------------------------


def _self_attentions(model: nn.Module) -> dict[tuple[str, int], nn.Module]:
    """(stack, layer) → the self-attention module of every block of the model's stacks."""
    from lmforge.models.stack import Stack

    out = {}
    for name, m in model.named_modules():
        if isinstance(m, Stack):
            stack = name.rsplit(".", 1)[-1]
            for i, block in enumerate(m.blocks):
                out[(stack, i)] = block.attn
    if not out:
        raise LMForgeError("the model has no transformer stack")
    return out


def head_importance(model: nn.Module) -> dict[tuple[str, int], Tensor]:
    """(stack, layer) → (n_heads,) importance: the Frobenius norm of each head's columns of the output
    projection o (a head's contribution to the residual stream is o[:, head] @ its output)."""
    out = {}
    for key, attn in _self_attentions(model).items():
        w = attn.o.weight.detach()  # (d_model, n_heads * hd)
        out[key] = w.view(w.shape[0], attn.n_heads, attn.hd).pow(2).sum(dim=(0, 2)).sqrt()
    return out


def least_important_heads(importance: dict[tuple[str, int], Tensor], fraction: float) -> HeadSet:
    """The `fraction` of all heads with the lowest importance, ranked globally; every layer keeps one head."""
    if not 0 <= fraction < 1:
        raise LMForgeError(f"head fraction must be in [0, 1), got {fraction}")
    ranked = sorted((float(s), key, h) for key, scores in importance.items() for h, s in enumerate(scores))
    budget = round(fraction * len(ranked))
    left = {key: len(scores) for key, scores in importance.items()}
    out: HeadSet = {}
    for _, key, h in ranked:
        if budget == 0:
            break
        if left[key] > 1:
            out.setdefault(key, []).append(h)
            left[key] -= 1
            budget -= 1
    return {k: sorted(v) for k, v in out.items()}


def _q_rows(attn: nn.Module, heads: list[int]) -> Tensor:
    """Row indices of the fused qkv projection belonging to `heads` (their q rows, and k/v rows for MHA)."""
    hd, q_dim = attn.hd, attn.n_heads * attn.hd
    per = torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in heads]) if heads else torch.zeros(0, dtype=torch.long)
    if attn.n_kv != attn.n_heads:
        return per
    return torch.cat([per, per + q_dim, per + 2 * q_dim])


def _o_cols(attn: nn.Module, heads: list[int]) -> Tensor:
    hd = attn.hd
    return torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in heads]) if heads else torch.zeros(0, dtype=torch.long)


def mask_heads(model: nn.Module, heads: HeadSet) -> None:
    """Zero the heads' columns of the output projection under a pruning mask, so they stay zero while
    fine-tuning (a head whose output is multiplied by zero contributes nothing)."""
    attns = _self_attentions(model)
    for key, hs in heads.items():
        attn = attns[key]
        mask = torch.ones_like(attn.o.weight)
        mask[:, _o_cols(attn, hs)] = 0
        prune.custom_from_mask(attn.o, "weight", mask)


@torch.no_grad()
def remove_heads(model: nn.Module, heads: HeadSet) -> None:
    """Physically drop the heads' slices of the qkv and output projections (multi-head attention: their query,
    key and value rows; grouped-query attention is not supported). The stack's per-head position biases (ALiBi,
    T5 buckets) would no longer match, so those models are refused. The model's config keeps its original
    n_heads: a model with removed heads is for in-memory inference and fine-tuning, not for saving."""
    cfg = model.config
    if cfg.position_scheme.per_head_bias:
        raise LMForgeError(f"removing heads is not supported with per-head position biases ({cfg.position})")
    if cfg.share_layers:
        raise LMForgeError("removing heads of ALBERT-style shared layers would remove them from every layer")
    attns = _self_attentions(model)
    for key, hs in heads.items():
        attn = attns[key]
        if attn.n_kv != attn.n_heads:
            raise LMForgeError("removing heads needs multi-head attention (n_kv_heads == n_heads)")
        if len(set(hs)) >= attn.n_heads or any(not 0 <= h < attn.n_heads for h in hs):
            raise LMForgeError(f"{key}: cannot remove heads {hs} of {attn.n_heads} (one head must stay)")
        keep_rows = _keep(attn.qkv.out_features, _q_rows(attn, hs))
        keep_cols = _keep(attn.o.in_features, _o_cols(attn, hs))
        attn.qkv = _sliced(attn.qkv, rows=keep_rows)
        attn.o = _sliced(attn.o, cols=keep_cols)
        attn.n_heads = attn.n_kv = attn.n_heads - len(set(hs))


def _keep(n: int, drop: Tensor) -> Tensor:
    keep = torch.ones(n, dtype=torch.bool)
    keep[drop] = False
    return keep.nonzero().squeeze(-1)


def _sliced(linear: nn.Linear, rows: Tensor | None = None, cols: Tensor | None = None) -> nn.Linear:
    w = linear.weight.detach()
    w = w[rows] if rows is not None else w
    w = w[:, cols] if cols is not None else w
    out = nn.Linear(w.shape[1], w.shape[0], bias=linear.bias is not None, device=w.device, dtype=w.dtype)
    out.weight.copy_(w)
    if linear.bias is not None:
        out.bias.copy_(linear.bias.detach()[rows] if rows is not None else linear.bias.detach())
    return out
