"""Multi-token prediction heads of a decoder: extra heads that predict tokens t+2, t+3, ... from position t.

Two variants (ModelConfig.mtp_heads = D heads, ModelConfig.mtp_sequential):

- parallel (Gloeckle et al. 2024 §2): D independent heads on the shared trunk's last hidden state; head k is one
  transformer block (`mtp_head="block"`) or one linear layer (`"linear"`), then its own norm and the shared LM head.
- sequential (DeepSeek-V3 §2.2): depth k keeps the causal chain. h'_i = M_k [RMSNorm(h^{k-1}_i); RMSNorm(Emb(t_{i+k}))]
  (a projection of the two concatenated), h^k = TRM_k(h'), P^k_{i+k+1} = OutHead(h^k_i); h^0 is the trunk's output.

The heads only run when asked (`Transformer.forward(..., mtp=True)`): inference and generation use the next-token
head alone, so a model's logits do not depend on whether it has MTP heads."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmforge.models.config import ModelConfig
from lmforge.models.layers import Block, make_norm


class MTPHeads(nn.Module):
    """The D extra prediction heads of a decoder-only Transformer (their parameters live in the model)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.sequential, self.kind = cfg.mtp_sequential, cfg.mtp_head
        d, n = cfg.d_model, cfg.mtp_heads
        if self.sequential:
            self.h_norm = nn.ModuleList(make_norm(cfg) for _ in range(n))
            self.e_norm = nn.ModuleList(make_norm(cfg) for _ in range(n))
            self.proj = nn.ModuleList(nn.Linear(2 * d, d, bias=False) for _ in range(n))  # M_k
        if self.sequential or self.kind == "block":
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(n))
        else:
            self.linear = nn.ModuleList(nn.Linear(d, d, bias=cfg.bias) for _ in range(n))
        self.norm = nn.ModuleList(make_norm(cfg) for _ in range(n))  # each head's own output norm

    def forward(self, model: nn.Module, h: Tensor, input_ids: Tensor, attention_mask: Tensor | None) -> list[Tensor]:
        """Logits per depth k = 1..D, each (B, T - k, V): position t predicts token t + k + 1.

        h: (B, T, d_model) the trunk's last hidden state for input_ids (B, T); `model` is the owning Transformer
        (its embedding, attention setup and LM head are shared)."""
        T = input_ids.shape[1]
        out, prev = [], h
        for k in range(1, len(self.norm) + 1):
            n = T - k  # positions whose target t + k + 1 lies inside the window
            pad = attention_mask[:, :n] if attention_mask is not None else None
            inp = model.decoder._self_inputs(h[:, :n], torch.arange(n, device=h.device), pad, None, None)
            if self.sequential:
                emb = model.tok_emb(input_ids[:, k:])  # (B, n, d): the token k steps ahead of each position
                x = self.proj[k - 1](torch.cat([self.h_norm[k - 1](prev[:, :n]), self.e_norm[k - 1](emb)], -1))
                prev = self.blocks[k - 1](x, inp, 0)
                z = prev
            elif self.kind == "block":
                z = self.blocks[k - 1](h[:, :n], inp, 0)
            else:
                z = self.linear[k - 1](h[:, :n])
            out.append(model.logits(self.norm[k - 1](z)))
        return out
