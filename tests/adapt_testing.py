"""Shared helpers of the adaptation tests: tiny models of each family and a padded batch through them."""

from __future__ import annotations

import torch
from torch import nn

from lmforge.models import Transformer, get_preset

V = 120
FAMILIES = ["gpt-tiny", "bert-tiny", "t5-tiny"]


def tiny(name: str, seed: int = 0, **kw) -> Transformer:
    """A preset with vocabulary V, no dropout, eval mode."""
    torch.manual_seed(seed)
    return Transformer(get_preset(name, vocab_size=V, dropout=0.0, attn_dropout=0.0, **kw)).eval()


def forward(model: nn.Module, seed: int = 0):
    """The model's output on a seeded batch of 2 × 9 tokens, the second row padded after 6 (and 5 decoder tokens
    for an encoder-decoder)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, V, (2, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    kw = {}
    if model.config.arch == "encoder-decoder":
        kw["decoder_input_ids"] = torch.randint(4, V, (2, 5), generator=g)
    return model(ids, mask, **kw)


def run(model: nn.Module, seed: int = 0) -> torch.Tensor:
    """The last hidden states of `forward`."""
    return forward(model, seed).last_hidden_state
