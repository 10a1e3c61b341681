"""Sparse self-attention of causal decoders: GPT-3's alternating dense and locally banded layers (Brown et al. 2020
§2.1) and the Sparse Transformer's factorised strided and fixed patterns (Child et al. 2019 §4.2-4.3).

A pattern is a boolean mask over (query, key) sequence indices, intersected with whatever the stack already masks
(causality, padding, position biases). A banded layer with nothing else to mask runs as a banded computation
instead (FlexAttention with a sliding-window block mask on CUDA, else query blocks of `attn_band` attending to their
own and the previous block's keys), so the work grows as T · band rather than T²; a decoding step attends to the
last `attn_band` cached keys only."""

from __future__ import annotations

import functools
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.models.config import ModelConfig

try:  # FlexAttention (torch >= 2.5): banded layers skip the key blocks outside the band
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover - older torch
    create_block_mask = flex_attention = None

BandedImpl = Literal["auto", "flex", "blocks"]


def is_sparse_layer(cfg: ModelConfig, layer: int) -> bool:
    """Layer `layer` (0-based) uses the sparse pattern: every attn_sparse_every-th layer, the first one dense when
    attn_sparse_every > 1 (GPT-3's alternation: dense, banded, dense, ...)."""
    return cfg.attn_pattern != "dense" and layer % cfg.attn_sparse_every == cfg.attn_sparse_every - 1


def factor_sets(cfg: ModelConfig, q_idx: Tensor, k_idx: Tensor) -> tuple[Tensor, Tensor]:
    """Child et al.'s two index sets as (Tq, Tk) bool masks, causality included (§4.2, stride l, c):

    strided: A(1)_i = {j : i - l <= j <= i}, A(2)_i = {j : (i - j) mod l = 0};
    fixed:   A(1)_i = {j : floor(j / l) = floor(i / l)}, A(2)_i = {j : j mod l >= l - c} ∪ {i}.

    The fixed A(2) also holds i itself: the first l - c queries precede every summary position, and a query must
    attend to something (used alone, by the interleaved and per-head factorisations, A(2) would be empty there)."""
    i, j = q_idx[:, None], k_idx[None, :]  # (Tq, 1), (1, Tk)
    causal = j <= i
    l = cfg.attn_stride
    if cfg.attn_pattern == "strided":
        a1, a2 = i - j <= l, torch.remainder(i - j, l) == 0
    elif cfg.attn_pattern == "fixed":
        a1 = torch.div(j, l, rounding_mode="floor") == torch.div(i, l, rounding_mode="floor")
        a2 = (torch.remainder(j, l) >= l - cfg.attn_fixed_c) | (j == i)
    else:
        raise ValueError(f"pattern '{cfg.attn_pattern}' has no factorised index sets")
    return causal & a1, causal & a2


def band_allowed(q_idx: Tensor, k_idx: Tensor, band: int) -> Tensor:
    """(Tq, Tk) bool: i - band < j <= i (GPT-3 §2.1 locally banded attention)."""
    d = q_idx[:, None] - k_idx[None, :]
    return (d >= 0) & (d < band)


def layer_allowed(cfg: ModelConfig, layer: int, q_idx: Tensor, k_idx: Tensor) -> Tensor:
    """(1 | n_heads, Tq, Tk) bool: the keys each query of sparse layer `layer` may attend to (causal)."""
    if cfg.attn_pattern == "banded":
        return band_allowed(q_idx, k_idx, cfg.attn_band)[None]
    a1, a2 = factor_sets(cfg, q_idx, k_idx)
    if cfg.attn_factorize == "union":
        return (a1 | a2)[None]
    if cfg.attn_factorize == "interleaved":
        rank = layer // cfg.attn_sparse_every  # which sparse layer this is: A(1), A(2), A(1), ...
        return (a1 if rank % 2 == 0 else a2)[None]
    n1 = cfg.n_heads // 2  # "heads": the first n_heads // 2 heads attend to A(1), the others to A(2)
    return torch.cat([a1[None].expand(n1, -1, -1), a2[None].expand(cfg.n_heads - n1, -1, -1)])


class SparseAttention:
    """The sparse-pattern step of an attention layer: turns the stack's mask into the layer's, or picks the banded
    computation. A plain object (no parameters); masks are built once per forward and shared by the layers that
    use the same pattern (kept in AttnInputs.derived)."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg

    def applies(self, layer: int) -> bool:
        return is_sparse_layer(self.cfg, layer)

    def _key(self, layer: int) -> str:
        f = self.cfg.attn_factorize
        if self.cfg.attn_pattern == "banded" or f != "interleaved":
            return "sparse"
        return f"sparse{(layer // self.cfg.attn_sparse_every) % 2}"

    def prepare(
        self, inp, mask: Tensor | None, is_causal: bool, layer: int, dtype: torch.dtype, banded_ok: bool
    ) -> tuple[Tensor | None, bool, int]:
        """(mask, is_causal, band) for this layer's attention; band > 0 asks for `banded_attention`.

        `mask` is the additive mask so far (None: causal via is_causal, or a single decoding step); `banded_ok` is
        False when the layer must see one explicit mask (prefix keys, relative position terms)."""
        cfg = self.cfg
        q_idx, k_idx = inp.query_index, inp.key_index
        if cfg.attn_pattern == "banded" and mask is None and banded_ok:
            if cfg.attn_band >= len(k_idx):
                return None, is_causal, 0  # the band covers every key: plain causal attention
            if is_causal or len(q_idx) == 1:  # a whole sequence, or one decoding step
                return None, False, cfg.attn_band
        shared = mask is None or mask is inp.mask  # the same for every sparse layer of this kind: build it once
        key = (self._key(layer), dtype, shared and mask is not None)
        if shared and key in inp.derived:
            return inp.derived[key], False, 0
        allowed = layer_allowed(cfg, layer, q_idx, k_idx)[None]  # (1, 1|H, Tq, Tk)
        neg = torch.finfo(dtype).min
        if mask is None:
            out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, neg)
        else:
            out = mask.to(dtype).masked_fill(~allowed.to(mask.device), neg)
        if shared:
            inp.derived[key] = out
        return out, False, 0


def banded_attention(
    q: Tensor, k: Tensor, v: Tensor, band: int, scale: float, dropout_p: float = 0.0, impl: BandedImpl = "auto"
) -> Tensor:
    """Causal attention of each query to itself and the band - 1 keys before it, without a (T, T) matrix.

    q (B, H, Tq, hd); k, v (B, H, Tk, hd), the queries being the last Tq key positions. Tq == 1 (a decoding step):
    attention over the last `band` keys. Tq == Tk: impl "flex" runs FlexAttention with a sliding-window block mask
    (compiled; it skips the key blocks outside the band); "blocks" cuts the sequence into blocks of `band` queries
    attending to their own and the previous block's keys through one (band, 2·band) mask; "auto" takes flex for
    CUDA training steps without dropout, else blocks. H200, bf16, 12 heads of 64, forward + backward, band 256:
    T = 2048 takes 0.65 ms with flex, 1.11 ms in blocks, 0.66 ms for dense causal attention and 1.49 ms for the band
    as a dense mask; T = 32768 takes 1.18, 2.10, 13.1 and 43 ms (docs/sparse-attention.md)."""
    Tq = q.shape[2]
    if Tq == 1:
        return F.scaled_dot_product_attention(q, k[:, :, -band:], v[:, :, -band:], dropout_p=dropout_p, scale=scale)
    if Tq != k.shape[2]:
        raise ValueError("banded_attention needs as many queries as keys, or a single query")
    # auto: flex for training steps; inference (prompts of any length) keeps blocks, which never recompile.
    use_flex = q.is_cuda and dropout_p == 0.0 and torch.is_grad_enabled() and flex_attention is not None
    if impl == "flex" or (impl == "auto" and use_flex):
        return _flex_banded(q, k, v, band, scale)
    return _blocks_banded(q, k, v, band, scale, dropout_p)


def _blocks_banded(q: Tensor, k: Tensor, v: Tensor, band: int, scale: float, dropout_p: float) -> Tensor:
    B, H, Tq, D = q.shape
    w = band
    nb = -(-Tq // w)
    pad = nb * w - Tq  # padded keys sit after every real query: the causal band never reaches them
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    qb = q.reshape(B * H, nb, w, D)
    kb, vb = k.reshape(B * H, nb, w, D), v.reshape(B * H, nb, w, D)
    # Keys of block b: block b - 1 (zeros before the first block, masked out) then block b.
    kk = torch.cat([F.pad(kb[:, :-1], (0, 0, 0, 0, 1, 0)), kb], dim=2)  # (BH, nb, 2w, D)
    vv = torch.cat([F.pad(vb[:, :-1], (0, 0, 0, 0, 1, 0)), vb], dim=2)
    mask = _block_mask(nb, w, q.dtype, q.device)  # (1, nb, w, 2w)
    y = F.scaled_dot_product_attention(qb, kk, vv, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    return y.reshape(B, H, nb * w, D)[:, :, :Tq]


@functools.cache
def _compiled_flex():
    """FlexAttention compiled once for eager callers (its uncompiled form materialises the scores)."""
    return torch.compile(flex_attention, dynamic=False)


def _band_mod(band: int):
    def mask_mod(b, h, i, j):
        return (i >= j) & (i - j < band)

    return mask_mod


@functools.lru_cache(maxsize=16)
def _cached_band_block_mask(T: int, band: int, device: str):
    return create_block_mask(_band_mod(band), None, None, T, T, device=device)


def _flex_banded(q: Tensor, k: Tensor, v: Tensor, band: int, scale: float) -> Tensor:
    T = q.shape[2]
    if flex_attention is None:
        raise LMForgeError("banded attention with impl='flex' needs torch.nn.attention.flex_attention (torch >= 2.5)")
    if torch.compiler.is_compiling():  # traced into the caller's graph: no cache lookups, no nested compile
        block_mask = create_block_mask(_band_mod(band), None, None, T, T, device=q.device)
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale)
    return _compiled_flex()(q, k, v, block_mask=_cached_band_block_mask(T, band, str(q.device)), scale=scale)


def _block_mask(nb: int, w: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Additive (1, nb, w, 2w) mask of block-local queries r against keys c of [previous block | own block].

    Query r of block b sits at b·w + r, key c at (b - 1)·w + c, so the band 0 <= i - j < w reads r < c <= r + w;
    block 0 has no previous block (c < w masked)."""
    r = torch.arange(w, device=device)[:, None]
    c = torch.arange(2 * w, device=device)[None, :]
    ok = ((c > r) & (c <= r + w))[None].expand(nb, -1, -1).clone()  # (nb, w, 2w)
    ok[0, :, :w] = False
    return torch.zeros(ok.shape, dtype=dtype, device=device).masked_fill(~ok, torch.finfo(dtype).min)[None]
