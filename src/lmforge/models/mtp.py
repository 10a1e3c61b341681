"""Multi-token prediction heads of a decoder: heads that predict tokens t+2, t+3, ... from position t.

Two variants (ModelConfig.mtp_heads = D extra heads, ModelConfig.mtp_sequential):

- parallel (Gloeckle et al. 2024 §2, Figure 1): a shared trunk f_s maps the tokens to z; n = D + 1 independent heads
  f_h1 .. f_hn, each one transformer layer, map z to their own hidden states, and the shared unembedding f_u (the
  final norm, then the LM head) maps head i's to the logits of token t + i. As in the released reference code
  (facebookresearch multi-token-prediction, llama/model.py: `layers[:-1]` are the trunk, `[layers[-1]] +
  extra_heads` the heads), the next-token head f_h1 is the decoder stack's last block and the trunk its blocks
  before it, so the model without the D extra heads is exactly a plain decoder of model.n_layers layers. The
  reference's n_layers counts all heads: it equals model.n_layers + model.mtp_heads here, and a next-token baseline
  of L layers is matched in parameters by model.n_layers = L - mtp_heads.
  `mtp_head="linear"` (the paper's Appendix B "linear heads") makes each extra head one d × d linear layer on z in
  place of a block; f_h1 stays the stack's last block, so the next-token model is the same in both.
- sequential (DeepSeek-V3 §2.2): depth k keeps the causal chain. h'_i = M_k [RMSNorm(h^{k-1}_i); RMSNorm(Emb(t_{i+k}))]
  (a projection of the two concatenated), h^k = TRM_k(h'), P^k_{i+k+1} = OutHead(RMSNorm_k(h^k_i)); h^0 is the main
  model's output.

The heads only run when asked (`Transformer.forward(..., mtp=True)`): inference and generation use the next-token
head alone, so a model's logits do not depend on whether it has MTP heads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmforge.models.config import ModelConfig
from lmforge.models.layers import Block, make_norm


@dataclass(frozen=True)
class HeadKind:
    """One kind of extra head (`ModelConfig.mtp_head`): the module list its D heads live in (their state-dict name),
    how one is built, and how it maps the trunk's z to its hidden states."""

    attr: str
    build: Callable[[ModelConfig], nn.Module]
    apply: Callable[[nn.Module, Tensor, object, int], Tensor]
    """(head, z (B, T, d), the stack's attention inputs, the last layer's index) -> (B, T, d)."""


HEAD_KINDS = {
    "block": HeadKind("blocks", Block, lambda head, z, inp, last: head(z, inp, last)),  # f_h(k+1)(z), not chained
    "linear": HeadKind(
        "linear", lambda cfg: nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias), lambda head, z, inp, last: head(z)
    ),
}


class MTPHeads(nn.Module):
    """The D extra prediction heads of a decoder-only Transformer (their parameters live in the model)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.sequential = cfg.mtp_sequential
        self.head = HEAD_KINDS["block" if self.sequential else cfg.mtp_head]  # a depth of the chain is a block
        d, n = cfg.d_model, cfg.mtp_heads
        if self.sequential:
            self.h_norm = nn.ModuleList(make_norm(cfg) for _ in range(n))
            self.e_norm = nn.ModuleList(make_norm(cfg) for _ in range(n))
            self.proj = nn.ModuleList(nn.Linear(2 * d, d, bias=False) for _ in range(n))  # M_k
            self.norm = nn.ModuleList(make_norm(cfg) for _ in range(n))  # each depth's own output norm
        setattr(self, self.head.attr, nn.ModuleList(self.head.build(cfg) for _ in range(n)))

    def forward(
        self, model: nn.Module, h: Tensor, trunk: Tensor, input_ids: Tensor, attention_mask: Tensor | None
    ) -> list[Tensor]:
        """Logits per extra head k = 1..D, each (B, T - k, V): position t predicts token t + k + 1.

        h: (B, T, d_model) the decoder's output (after its final norm) for input_ids (B, T); trunk: (B, T, d_model)
        the input of its last block, the trunk's z; `model` is the owning Transformer (its embedding, attention
        setup, final norm and LM head are shared)."""
        if self.sequential:
            return self._sequential(model, h, input_ids, attention_mask)
        stack = model.decoder
        T = input_ids.shape[1]
        last = stack.n_layers - 1  # every head is a sibling of f_h1, the stack's last layer
        inp = stack._self_inputs(trunk, torch.arange(T, device=trunk.device), attention_mask, None, None)
        out, heads = [], self._heads
        for k in range(1, len(heads) + 1):
            z = self.head.apply(heads[k - 1], trunk, inp, last)  # (B, T, d)
            # f_u: the stack's final norm (and its dropout, where configured), then the shared LM head; the last k
            # positions' targets lie past the window.
            out.append(model.logits(stack.output(z)[:, : T - k]))
        return out

    @property
    def _heads(self) -> nn.ModuleList:
        return getattr(self, self.head.attr)

    def _sequential(self, model: nn.Module, h: Tensor, input_ids: Tensor, attention_mask: Tensor | None):
        T = input_ids.shape[1]
        out, prev = [], h
        for k in range(1, len(self._heads) + 1):
            n = T - k  # positions whose target t + k + 1 lies inside the window
            pad = attention_mask[:, :n] if attention_mask is not None else None
            inp = model.decoder._self_inputs(h[:, :n], torch.arange(n, device=h.device), pad, None, None)
            emb = model.tok_emb(input_ids[:, k:])  # (B, n, d): the token k steps ahead of each position
            x = self.proj[k - 1](torch.cat([self.h_norm[k - 1](prev[:, :n]), self.e_norm[k - 1](emb)], -1))
            prev = self.blocks[k - 1](x, inp, 0)
            out.append(model.logits(self.norm[k - 1](prev)))
        return out
