"""Helpers for the Transformer-XL and XLNet tests."""

from __future__ import annotations

import torch


@torch.no_grad()
def boost_relative(model: torch.nn.Module, seed: int = 3) -> torch.nn.Module:
    """Give the relative-attention biases (u, v; XLNet's segment bias and vectors) unit-scale values: at their init
    scale (std 0.02) a swapped or dropped bias would move outputs by less than the tolerance."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.rsplit(".", 1)[-1] in ("u", "v", "seg_bias", "seg", "r_w_bias", "r_r_bias", "r_s_bias", "seg_embed"):
            p.copy_(torch.randn(p.shape, generator=g))
    return model
