"""Building blocks of the one transformer stack: norms, attention (self and cross, KV cache), MLPs, the block."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.models.config import ModelConfig
from lmforge.models.position_components import POSITIONS
from lmforge.models.positions import RotaryEmbedding, ShawRelativePosition
from lmforge.models.sparse import SparseAttention, banded_attention


class RMSNorm(nn.Module):
    """Root-mean-square norm (T5, Llama): no mean subtraction, no bias; statistics in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # x · rsqrt(mean(x²) + eps) in float32 as one kernel (eager: half the time of the five-op expression forward
        # and backward on a GPU), cast back to x's dtype before the gain, as Llama and T5 do.
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


def make_norm(cfg: ModelConfig, dim: int | None = None) -> nn.Module:
    dim = dim or cfg.d_model
    if cfg.norm == "rmsnorm":
        return RMSNorm(dim, cfg.norm_eps)
    return nn.LayerNorm(dim, eps=cfg.norm_eps)


def activation_fn(name: str):
    """The elementwise nonlinearity (the gate's, for gated MLPs)."""
    if name in ("gelu_tanh", "geglu"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    if name in ("silu", "swiglu"):
        return F.silu
    if name == "relu":
        return F.relu
    if name == "relu2":
        return lambda x: F.relu(x).square()
    raise ValueError(f"unknown activation {name}")


class MLP(nn.Module):
    """Position-wise feed-forward; gated variants (SwiGLU, GeGLU; Shazeer 2020) multiply act(gate) by up."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gated = cfg.gated
        self.act = activation_fn(cfg.activation)
        if self.gated:
            self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        # T5 drops the hidden activation too (T5DenseActDense / T5DenseGatedActDense); a module only where a family
        # asks for it, so that setting every dropout rate of a backbone (fine-tuning) leaves other MLPs without.
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout_ffn_hidden else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.gate(x)) * self.up(x) if self.gated else self.act(self.up(x))  # (B, T, d_ff)
        return self.down(h if self.dropout is None else self.dropout(h))


class KVCache:
    """Per-layer key/value cache for incremental decoding; cross-attention keys/values are computed once."""

    def __init__(self, n_layers: int) -> None:
        self.self_kv: list[tuple[Tensor, Tensor] | None] = [None] * n_layers
        self.cross_kv: list[tuple[Tensor, Tensor] | None] = [None] * n_layers

    @property
    def length(self) -> int:
        kv = self.self_kv[0]
        return 0 if kv is None else kv[0].shape[2]

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        past = self.self_kv[layer]
        if past is not None:
            k = torch.cat([past[0], k], dim=2)  # (B, KV, T_past + T, hd)
            v = torch.cat([past[1], v], dim=2)
        self.self_kv[layer] = (k, v)
        return k, v

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search)."""
        for store in (self.self_kv, self.cross_kv):
            for i, kv in enumerate(store):
                if kv is not None:
                    store[i] = (kv[0].index_select(0, index), kv[1].index_select(0, index))


@dataclass
class AttnInputs:
    """What every layer of a stack shares for one forward: masks, additive biases, positions, cache."""

    mask: Tensor | None = None
    """Additive float mask (B|1, 1|H, Tq, Tk) incl. position biases, or None."""
    is_causal: bool = False
    """Use SDPA's built-in causal mask (only when mask is None and there is no cache offset)."""
    positions: Tensor | None = None
    """Absolute positions of the new tokens (Tq,) or (B, Tq), for RoPE (rotates queries and new keys)."""
    query_index: Tensor | None = None
    """Sequence indices of the queries (Tq,) and of all keys (Tk,), for Shaw relative positions."""
    key_index: Tensor | None = None
    cache: KVCache | None = None
    derived: dict = field(default_factory=dict)
    """Tensors derived from these inputs, built by the first layer that needs them (sparse-layer masks)."""


class Attention(nn.Module):
    """Multi-head / grouped-query attention over SDPA (flash or memory-efficient kernels when eligible)."""

    def __init__(self, cfg: ModelConfig, cross: bool = False) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.kv_heads, cfg.dim_head
        self.cross = cross
        q_dim, kv_dim = self.n_heads * self.hd, self.n_kv * self.hd
        bias = cfg.qkv_bias
        if cross:
            self.q = nn.Linear(cfg.d_model, q_dim, bias=bias)
            self.kv = nn.Linear(cfg.d_model, 2 * kv_dim, bias=bias)
        else:
            # One fused projection: a single matmul for q, k and v.
            self.qkv = nn.Linear(cfg.d_model, q_dim + 2 * kv_dim, bias=bias)
        self.o = nn.Linear(q_dim, cfg.d_model, bias=bias)
        if cfg.qk_norm and not cross:
            self.q_norm, self.k_norm = RMSNorm(self.hd, cfg.norm_eps), RMSNorm(self.hd, cfg.norm_eps)
        self.scale = 1.0 / math.sqrt(self.hd) if cfg.scale_attention else 1.0
        self.attn_dropout = cfg.attn_dropout
        # The position scheme's per-layer modules (models/position_components.py): RoPE's `rope`, Shaw's relative
        # key/value tables `shaw`, Transformer-XL / XLNet's relative attention `rel` (run by models/recurrence.py).
        self.rope: RotaryEmbedding | None = None
        self.shaw: ShawRelativePosition | None = None
        for name, module in ({} if cross else POSITIONS[cfg.position].layer_modules(cfg)).items():
            setattr(self, name, module)
        self.sparse = SparseAttention(cfg) if cfg.attn_pattern != "dense" and not cross else None
        # Prefix-tuning hook (lmforge.adapt.prefix): a callable (k, v, mask, is_causal, layer) -> (k, v, mask) that
        # puts learned keys/values before this layer's self-attention keys. A plain attribute, not a submodule.
        self.kv_prefix = None

    def _heads(self, x: Tensor, n: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.hd).transpose(1, 2)  # (B, n, T, hd)

    @property
    def transforms_qk(self) -> bool:
        """Whether self-attention's queries and keys pass through QK-norm or rotary positions."""
        return hasattr(self, "q_norm") or self.rope is not None

    def qk_transform(self, q: Tensor, k: Tensor, positions: Tensor | None) -> tuple[Tensor, Tensor]:
        """QK-norm, then rotary positions (each where configured): a chain of pointwise work on the heads that
        `train.compile_scope=pointwise` compiles on its own."""
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = self.rope(q, k, positions)
        return q, k

    def forward(self, x: Tensor, inp: AttnInputs, layer: int, memory: Tensor | None = None) -> Tensor:
        B, T, _ = x.shape
        q_dim, kv_dim = self.n_heads * self.hd, self.n_kv * self.hd
        if self.cross:
            q = self._heads(self.q(x), self.n_heads)
            cached = inp.cache.cross_kv[layer] if inp.cache is not None else None
            if cached is None:
                k, v = self.kv(memory).split(kv_dim, dim=-1)
                k, v = self._heads(k, self.n_kv), self._heads(v, self.n_kv)
                if inp.cache is not None:
                    inp.cache.cross_kv[layer] = (k, v)
            else:
                k, v = cached
        else:
            q, k, v = self.qkv(x).split([q_dim, kv_dim, kv_dim], dim=-1)
            q, k, v = self._heads(q, self.n_heads), self._heads(k, self.n_kv), self._heads(v, self.n_kv)
            q, k = self.qk_transform(q, k, inp.positions)
            if inp.cache is not None:
                k, v = inp.cache.append(layer, k, v)
        mask, is_causal = inp.mask, inp.is_causal and not self.cross
        if self.shaw is not None:
            rel = self.shaw(q, inp.query_index, inp.key_index)  # (B, H, Tq, Tk), scaled by 1/sqrt(hd)
            if self.scale == 1.0:  # unscaled attention (T5-style): undo the shaw module's 1/sqrt(hd)
                rel = rel * math.sqrt(self.hd)
            mask = rel if mask is None else mask + rel
        band = 0
        if self.sparse is not None and self.sparse.applies(layer):  # GPT-3 / Sparse Transformer layers
            banded_ok = self.kv_prefix is None
            mask, is_causal, band = self.sparse.prepare(inp, mask, is_causal, layer, q.dtype, banded_ok)
        if self.kv_prefix is not None:  # after the cache: cached keys stay the sequence's own
            k, v, mask = self.kv_prefix(k, v, mask, is_causal and mask is None, layer)
        if self.n_kv != self.n_heads:  # grouped-query: each kv head serves n_heads // n_kv query heads
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        dropout = self.attn_dropout if self.training else 0.0
        if band:
            y = banded_attention(q, k, v, band, self.scale, dropout)
        elif self.shaw is not None and self.shaw.value_embeddings is not None:  # Shaw eq. 3: explicit probabilities
            y = self.shaw.attend(q, k, v, mask, self.scale, dropout, inp.query_index, inp.key_index)
        else:
            is_causal = is_causal and mask is None
            y = F.scaled_dot_product_attention(q, k, v, mask, dropout, is_causal, scale=self.scale)  # (B, H, T, hd)
        return self.o(y.transpose(1, 2).reshape(B, T, q_dim))


class Block(nn.Module):
    """One transformer layer: self-attention, optional cross-attention, MLP; pre- or post-LN residuals."""

    def __init__(self, cfg: ModelConfig, cross: bool = False) -> None:
        super().__init__()
        self.pre = cfg.norm_position == "pre"
        self.attn = Attention(cfg)
        self.norm1 = make_norm(cfg)
        if cross:
            self.cross_attn = Attention(cfg, cross=True)
            self.norm_cross = make_norm(cfg)
        self.mlp = MLP(cfg)
        self.norm2 = make_norm(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def _residual(self, x: Tensor, norm: nn.Module, fn) -> Tensor:
        if self.pre:
            return x + self.dropout(fn(norm(x)))
        return norm(x + self.dropout(fn(x)))

    def forward(
        self,
        x: Tensor,
        inp: AttnInputs,
        layer: int,
        memory: Tensor | None = None,
        memory_inp: AttnInputs | None = None,
    ) -> Tensor:
        x = self._residual(x, self.norm1, lambda h: self.attn(h, inp, layer))
        if memory is not None:
            x = self._residual(x, self.norm_cross, lambda h: self.cross_attn(h, memory_inp, layer, memory))
        return self._residual(x, self.norm2, self.mlp)
