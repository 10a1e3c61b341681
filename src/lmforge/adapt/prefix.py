"""Prefix-tuning (Li & Liang 2021): learned keys and values put before every self-attention layer's own.

Each stack (a decoder's, or an encoder-decoder's encoder and decoder) gets a `PrefixEncoder` holding, per layer,
n_prefix key and value vectors per key/value head. Every attention layer sees them through the model's
`Attention.kv_prefix` hook, after its KV cache: the cache holds only the sequence's own keys, positions are
unchanged, and cached decoding sees the same prefix at every step. Prefix keys carry no position (no RoPE, no
relative bias) and every query, padded or causal, may attend to them. Cross-attention is left as it is.

During training the prefixes can be reparameterised (§4.3): P = MLP(P'), with a smaller P' (n_prefix × d_model)
and a two-layer tanh MLP, which Li & Liang found more stable than learning P directly; `bake_prefix` replaces the
MLP by the prefixes it computes once training is over."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.adapt.inject import (
    PeftOptions,
    PeftState,
    check_positive,
    freeze,
    named_transformers,
    stacks_of,
    train_extras,
    train_params,
)
from lmforge.errors import LMForgeError


@dataclass
class PrefixOptions(PeftOptions):
    """Prefix-tuning (`peft.method: prefix`)."""

    n_prefix: int = 10
    """Prefix length: learned key/value vectors per layer (Li & Liang use 10 for table-to-text, 200 for
    summarisation)."""
    reparam_hidden: int = 512
    """Width of the reparameterisation MLP (Li & Liang §4.3, 512); 0 learns the prefixes directly."""


class PrefixEncoder(nn.Module):
    """Per-layer prefix keys and values of one stack: `layer(i)` -> (2, n_kv_heads, n_prefix, head_dim)."""

    def __init__(self, n_layers: int, n_kv: int, head_dim: int, d_model: int, options: PrefixOptions) -> None:
        super().__init__()
        self.n_layers, self.n_kv, self.head_dim, self.n_prefix = n_layers, n_kv, head_dim, options.n_prefix
        width = 2 * n_kv * head_dim  # one layer's keys and values per prefix position
        if options.reparam_hidden > 0:
            self.embedding = nn.Parameter(torch.randn(options.n_prefix, d_model))  # P' (P, d_model)
            self.mlp_in = nn.Linear(d_model, options.reparam_hidden)
            self.mlp_out = nn.Linear(options.reparam_hidden, n_layers * width)  # rows: (layer, k|v, head, hd)
        else:
            self.prefix = nn.Parameter(torch.randn(n_layers, 2, n_kv, options.n_prefix, head_dim))

    @property
    def reparameterised(self) -> bool:
        return hasattr(self, "mlp_out")

    def layer(self, i: int) -> Tensor:
        """Layer i's prefix keys and values (2, n_kv, P, hd)."""
        if not self.reparameterised:
            return self.prefix[i]
        width = 2 * self.n_kv * self.head_dim
        rows = slice(i * width, (i + 1) * width)  # only this layer's rows of the output projection
        h = torch.tanh(self.mlp_in(self.embedding))  # (P, hidden)
        kv = F.linear(h, self.mlp_out.weight[rows], self.mlp_out.bias[rows])  # (P, 2 * n_kv * hd)
        return kv.view(self.n_prefix, 2, self.n_kv, self.head_dim).permute(1, 2, 0, 3)

    def all_layers(self) -> Tensor:
        """(n_layers, 2, n_kv, P, hd)."""
        return torch.stack([self.layer(i) for i in range(self.n_layers)])

    @torch.no_grad()
    def bake(self) -> None:
        """Keep only the prefixes the MLP computes (Li & Liang §4.3: the reparameterisation is dropped)."""
        if self.reparameterised:
            prefix = self.all_layers().detach().clone()
            del self.mlp_in, self.mlp_out, self.embedding
            self.prefix = nn.Parameter(prefix)


class PrefixHook:
    """The `Attention.kv_prefix` callable of one stack: prepends layer `layer`'s prefix to keys and values.

    A plain object (not a submodule), so the prefix parameters are registered once, on the stack."""

    def __init__(self, encoder: PrefixEncoder) -> None:
        self.encoder = encoder

    def __call__(
        self, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, layer: int
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        B, _, T_k, _ = k.shape  # k, v: (B, n_kv, T_k, hd)
        P = self.encoder.n_prefix
        pk, pv = self.encoder.layer(layer).to(k.dtype).unsqueeze(1).unbind(0)  # (1, n_kv, P, hd) each
        k = torch.cat([pk.expand(B, -1, -1, -1), k], dim=2)  # (B, n_kv, P + T_k, hd)
        v = torch.cat([pv.expand(B, -1, -1, -1), v], dim=2)
        if mask is not None:
            mask = F.pad(mask, (P, 0))  # (..., Tq, P + T_k): 0 = every query sees the prefix
        elif is_causal:
            # SDPA's built-in causal mask aligns queries and keys at the top-left, which the prefix would
            # shift; without a cache offset queries are the last T_k keys, so build the mask explicitly.
            future = torch.ones(T_k, T_k, dtype=torch.bool, device=k.device).triu(1)
            mask = torch.zeros(T_k, T_k, dtype=k.dtype, device=k.device).masked_fill(future, torch.finfo(k.dtype).min)
            mask = F.pad(mask, (P, 0))[None, None]  # (1, 1, T_k, P + T_k)
        return k, v, mask


def apply_prefix(model: nn.Module, options: PrefixOptions | None = None) -> nn.Module:
    """Add a PrefixEncoder to every self-attention stack and freeze everything but the prefixes (+ head)."""
    o = options or PrefixOptions()
    check_positive("prefix", n_prefix=o.n_prefix)
    if o.reparam_hidden < 0:
        raise LMForgeError(f"prefix.reparam_hidden must be >= 0, got {o.reparam_hidden}")
    if getattr(model, "peft_config", None) is not None:
        raise LMForgeError(f"the model is already adapted with '{model.peft_config.method}'")
    freeze(model)
    sites = []
    for t_name, t in named_transformers(model):
        cfg = t.config
        device, dtype = t.tok_emb.weight.device, t.tok_emb.weight.dtype
        for name, stack in stacks_of(t):
            attns = [b.attn for b in stack.blocks]
            if any(a.kv_prefix is not None for a in attns):
                continue  # T5's shared encoder-decoder layers: the encoder's prefixes serve both stacks
            enc = PrefixEncoder(stack.n_layers, cfg.kv_heads, cfg.dim_head, cfg.d_model, o).to(device, dtype)
            enc.train(stack.training)
            stack.add_module("kv_prefix", enc)
            hook = PrefixHook(enc)
            for a in attns:
                a.kv_prefix = hook
            train_params(enc)
            sites.append(f"{t_name}.{name}.kv_prefix".lstrip("."))
    train_extras(model, o)
    model.peft_config = PeftState("prefix", o, sites)
    return model


def bake_prefix(model: nn.Module) -> nn.Module:
    """Drop the reparameterisation MLPs, keeping the prefixes they compute (the model's outputs are unchanged);
    a later `save_adapter` records reparam_hidden = 0."""
    encoders = [m for m in model.modules() if isinstance(m, PrefixEncoder)]
    for enc in encoders:
        enc.bake()
    state = getattr(model, "peft_config", None)
    if state is not None and state.method == "prefix":
        state.options = replace(state.options, reparam_hidden=0)
    return model
