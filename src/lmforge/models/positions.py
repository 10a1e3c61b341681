"""Position encodings: sinusoidal, learned, RoPE, ALiBi, T5 relative buckets and Shaw relative keys and values.

Pure, vectorised building blocks for the transformer stack. Conventions follow Hugging Face `transformers`
exactly so that weights convert one-to-one and whole models match logit for logit:

- RoPE uses the Llama "rotate_half" layout (`LlamaRotaryEmbedding` + `apply_rotary_pos_emb`).
- ALiBi slopes equal BLOOM's `_get_alibi_slopes`.
- T5 buckets equal `T5Attention._relative_position_bucket`; the bias table is `relative_attention_bias`.
- The sinusoid table equals XLM's (interleaved) and Marian's (halves) tables.

Attention tensors are (B, H, T, head_dim) throughout; biases are additive to the scaled logits.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LMForgeError

__all__ = [
    "LearnedPositions",
    "RotaryEmbedding",
    "ShawRelativePosition",
    "T5RelativeBias",
    "alibi_bias",
    "alibi_slopes",
    "apply_rotary",
    "rotate_half",
    "sinusoidal_embedding",
    "sinusoidal_table",
    "t5_relative_position_bucket",
]


# ----------------------------------------------------------------------------------------------------
# Absolute positions
# ----------------------------------------------------------------------------------------------------


def sinusoidal_table(n_positions: int, dim: int, interleaved: bool = True) -> Tensor:
    """Fixed sinusoidal encodings (Vaswani et al. 2017 §3.5), float32 of shape (n_positions, dim).

    Feature j has angle pos / 10000^(2*(j//2)/dim). `interleaved=True` puts sin on even and cos on odd
    features (the paper, XLM); `interleaved=False` puts all sin features first, then all cos features
    (Marian). fairseq's table (M2M100, Speech2Text) uses a different frequency denominator: not this one.
    """
    if n_positions < 0 or dim <= 0:
        raise LMForgeError(f"sinusoidal table needs n_positions >= 0 and dim > 0, got {n_positions} and {dim}")
    return sinusoidal_embedding(torch.arange(n_positions), dim, interleaved)


def sinusoidal_embedding(positions: Tensor, dim: int, interleaved: bool = True) -> Tensor:
    """Rows of `sinusoidal_table` for arbitrary integer positions (...,) -> float32 (..., dim), on their device.

    Computed from the positions directly, so there is no table to size and no maximum length.
    """
    # float64 keeps angles exact for large positions; the result is rounded once to float32.
    pos = positions.to(torch.float64)[..., None]  # (..., 1)
    j = torch.arange(dim, dtype=torch.float64, device=positions.device)
    angles = pos / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / dim)  # (..., dim)
    sin, cos = torch.sin(angles[..., 0::2]), torch.cos(angles[..., 1::2])  # (..., ceil(dim/2)), (..., dim//2)
    if interleaved:
        out = torch.empty(angles.shape, dtype=torch.float64, device=positions.device)
        out[..., 0::2], out[..., 1::2] = sin, cos
    else:
        out = torch.cat([sin, cos], dim=-1)
    return out.to(torch.float32)


class LearnedPositions(nn.Module):
    """Learned absolute position embeddings (GPT-2, BERT): a plain lookup of rows [0, max_seq_len).

    The length check lives in `Transformer`, on Python ints: checking tensor values here would sync with the
    device on every forward and break torch.compile graphs.
    """

    def __init__(self, max_seq_len: int, d_model: int) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.emb = nn.Embedding(max_seq_len, d_model)

    def forward(self, positions: Tensor) -> Tensor:
        """positions: LongTensor of any shape (...) -> (..., d_model)."""
        return self.emb(positions)


# ----------------------------------------------------------------------------------------------------
# RoPE (Su et al. 2021), Llama / GPT-NeoX "rotate_half" layout
# ----------------------------------------------------------------------------------------------------


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dim: pairs feature i with i + d/2."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate the first `cos.shape[-1]` features of q and k; the rest pass through unchanged.

    q, k: (B, H, T, head_dim); cos, sin: (T, rotary_dim) or (B, 1, T, rotary_dim), in q's dtype.
    """
    rd = cos.shape[-1]
    if rd == q.shape[-1]:
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    q_rot, q_pass = q[..., :rd], q[..., rd:]
    k_rot, k_pass = k[..., :rd], k[..., rd:]
    q_rot = q_rot * cos + rotate_half(q_rot) * sin
    k_rot = k_rot * cos + rotate_half(k_rot) * sin
    return torch.cat([q_rot, q_pass], dim=-1), torch.cat([k_rot, k_pass], dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, identical to transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb.

    With rotary_dim < head_dim only the first rotary_dim features of each head rotate (GPT-NeoX, Phi).
    There is no maximum length: cos/sin are computed from the positions on every call.
    """

    inv_freq: Tensor

    def __init__(self, head_dim: int, base: float = 10000.0, rotary_dim: int | None = None) -> None:
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
            raise LMForgeError(f"rotary_dim must be even and in [2, head_dim={head_dim}], got {rotary_dim}")
        self.head_dim, self.rotary_dim, self.base = head_dim, rotary_dim, float(base)
        # Non-persistent (as in transformers): derived from base and rotary_dim, so kept out of checkpoints.
        self.register_buffer("inv_freq", self._compute_inv_freq(), persistent=False)

    def _compute_inv_freq(self, device: torch.device | None = None) -> Tensor:
        # Same expression and dtype as transformers' default RoPE init, so values match bit for bit.
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.float, device=device) / self.rotary_dim
        return 1.0 / (self.base**exponents)  # (rotary_dim/2,)

    def reset_parameters(self) -> None:
        """Recompute inv_freq in place (after `to_empty()` from the meta device)."""
        self.inv_freq.copy_(self._compute_inv_freq(self.inv_freq.device))

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions (T,) or (B, T) -> cos, sin of shape (T, rotary_dim) or (B, 1, T, rotary_dim) in `dtype`.

        Computed in float32 whatever `dtype` is (low-precision angles drift at large positions), then cast.
        The stack can call this once per forward and share the result across layers via `apply_rotary`.
        """
        inv_freq = self.inv_freq
        if inv_freq.dtype != torch.float32:  # the module was cast to a low-precision dtype: rebuild exactly
            inv_freq = self._compute_inv_freq(inv_freq.device)
        freqs = positions[..., None].float() * inv_freq  # (..., T, rotary_dim/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (..., T, rotary_dim): the rotate_half layout
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        if positions.dim() == 2:  # per-sequence positions broadcast over heads
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, rotary_dim)
        return cos, sin

    def forward(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """q, k: (B, H, T, head_dim) (H may differ for k); positions (T,) or (B, T) -> rotated q, k."""
        cos, sin = self.cos_sin(positions, q.dtype)
        return apply_rotary(q, k, cos, sin)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}"


# ----------------------------------------------------------------------------------------------------
# ALiBi (Press et al. 2022)
# ----------------------------------------------------------------------------------------------------


def alibi_slopes(n_heads: int, device: torch.device | str | None = None) -> Tensor:
    """Per-head ALiBi slopes, float32 (H,): 2^(-8/n), its powers, and the paper's non-power-of-2 rule.

    For n not a power of two, take the 2^k = floor-power-of-two slopes, then every other slope of the 2^(k+1)
    sequence for the remaining heads (Press et al. 2022 §3; identical to BLOOM's `_get_alibi_slopes`).
    """
    if n_heads <= 0:
        raise LMForgeError(f"ALiBi needs n_heads > 0, got {n_heads}")
    closest = 2 ** math.floor(math.log2(n_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32, device=device)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32, device=device))  # 2^(-8k/closest)
    if closest != n_heads:
        extra_base = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32, device=device)
        n_extra = min(closest, n_heads - closest)
        odd = torch.arange(1, 1 + 2 * n_extra, 2, dtype=torch.int32, device=device)
        extra = torch.pow(extra_base, odd)
        slopes = torch.cat([slopes, extra])
    return slopes


def alibi_bias(slopes: Tensor, q_positions: Tensor, k_positions: Tensor, causal: bool) -> Tensor:
    """Additive ALiBi bias (H, Tq, Tk) in slopes' dtype, to add to the scaled attention logits.

    causal=True: -slope * (i - j) for keys j <= i and -inf for future keys, so the result also carries the
    causal mask. Because softmax is invariant to a per-row constant, -slope*(i - j) = slope*j - slope*i gives
    the same attention as BLOOM's `slope * j` form. causal=False (encoders): symmetric -slope * |i - j|.
    Positions are absolute (a KV-cache query at cache position p has q_position p); no maximum length.
    """
    dist = (q_positions[:, None] - k_positions[None, :]).to(slopes.dtype)  # (Tq, Tk): i - j
    bias = -slopes[:, None, None] * dist.abs()  # (H, Tq, Tk)
    if causal:
        future = (k_positions[None, :] > q_positions[:, None]).to(slopes.device)  # (Tq, Tk)
        bias = bias.masked_fill(future, float("-inf"))
    return bias


# ----------------------------------------------------------------------------------------------------
# T5 relative position buckets (Raffel et al. 2020 §2.1)
# ----------------------------------------------------------------------------------------------------


def t5_relative_position_bucket(
    relative_position: Tensor, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """Map relative positions (key - query) to bucket ids in [0, num_buckets); same as transformers' T5.

    Half the buckets (per direction when bidirectional) are exact small distances, the other half are
    logarithmic bins up to max_distance; farther distances share the last bucket. Unidirectional (decoder)
    attention maps every future offset (> 0) to bucket 0.
    """
    buckets = torch.zeros_like(relative_position, dtype=torch.long)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).to(torch.long) * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)
    # distance is now >= 0
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # log(0) = -inf for distance 0 is harmless: torch.where picks the exact bucket there.
    if_large = max_exact + (
        torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    if_large = torch.clamp(if_large, max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, if_large)


class T5RelativeBias(nn.Module):
    """T5's learned per-head bias over bucketed relative positions; weight name matches transformers."""

    def __init__(
        self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
    ) -> None:
        super().__init__()
        self.n_heads, self.num_buckets = n_heads, num_buckets
        self.max_distance, self.bidirectional = max_distance, bidirectional
        self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)

    def forward(self, q_len: int, k_len: int, q_offset: int = 0) -> Tensor:
        """Bias (1, H, q_len, k_len); query i sits at absolute position q_offset + i (KV-cache decoding)."""
        device = self.relative_attention_bias.weight.device
        q_pos = torch.arange(q_len, dtype=torch.long, device=device)[:, None] + q_offset  # (Tq, 1)
        k_pos = torch.arange(k_len, dtype=torch.long, device=device)[None, :]  # (1, Tk)
        buckets = t5_relative_position_bucket(
            k_pos - q_pos, self.bidirectional, self.num_buckets, self.max_distance
        )  # (Tq, Tk)
        values = self.relative_attention_bias(buckets)  # (Tq, Tk, H)
        return values.permute(2, 0, 1).unsqueeze(0)

    def extra_repr(self) -> str:
        return (
            f"n_heads={self.n_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )


# ----------------------------------------------------------------------------------------------------
# Shaw et al. 2018 relative position representations (§3: keys, eq. 4; values, eq. 3)
# ----------------------------------------------------------------------------------------------------


class ShawRelativePosition(nn.Module):
    """Learned relative vectors a_{clip(j-i, ±max_relative_position)}, one table per use shared by all heads (§3.3):
    a^K for the keys and, with `values`, a^V for the values."""

    def __init__(self, head_dim: int, max_relative_position: int, values: bool = False) -> None:
        super().__init__()
        if max_relative_position < 0:
            raise LMForgeError(f"max_relative_position must be >= 0, got {max_relative_position}")
        self.head_dim, self.max_relative_position = head_dim, max_relative_position
        # Row r holds the vector for clipped offset r - max_relative_position.
        self.embeddings = nn.Embedding(2 * max_relative_position + 1, head_dim)
        self.value_embeddings = nn.Embedding(2 * max_relative_position + 1, head_dim) if values else None

    def _rows(self, q_positions: Tensor, k_positions: Tensor, device: torch.device) -> Tensor:
        m = self.max_relative_position
        return (torch.clamp(k_positions[None, :] - q_positions[:, None], -m, m) + m).to(device)  # (Tq, Tk)

    def forward(self, q: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """q (B, H, Tq, hd) -> (B, H, Tq, Tk) of q_i · a_{clip(j-i)} / sqrt(hd).

        The 1/sqrt(hd) scale matches SDPA's logit scale, so the result is the additive float `attn_mask`
        that turns SDPA's softmax(q·k/sqrt(hd)) into Shaw's softmax(q·(k + a)/sqrt(hd)).
        """
        rel = self._rows(q_positions, k_positions, q.device)
        # Project onto the 2m+1 table vectors first, then gather: O(Tq * (2m+1) * hd) work and no
        # (Tq, Tk, hd) intermediate.
        scores = torch.matmul(q, self.embeddings.weight.to(q.dtype).t())  # (B, H, Tq, 2m+1)
        index = rel.expand(*q.shape[:2], -1, -1)  # (B, H, Tq, Tk)
        return torch.gather(scores, -1, index) * (1.0 / math.sqrt(self.head_dim))

    def value_term(self, probs: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """Eq. 3's second term Σ_j α_ij a^V_{clip(j-i)} for attention probabilities α (B, H, Tq, Tk) -> (B, H, Tq, hd).

        The probabilities are summed per clipped offset first (a scatter-add into 2m+1 bins), then multiplied by
        the table: no (Tq, Tk, hd) intermediate."""
        rel = self._rows(q_positions, k_positions, probs.device).expand_as(probs)
        bins = probs.new_zeros(*probs.shape[:-1], 2 * self.max_relative_position + 1).scatter_add_(-1, rel, probs)
        return torch.matmul(bins, self.value_embeddings.weight.to(probs.dtype))

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, dropout_p: float,
        q_positions: Tensor, k_positions: Tensor,
    ) -> Tensor:  # fmt: skip
        """Eq. 3 attention: softmax(q·k·scale + mask) (v + a^V) with the probabilities made explicit (SDPA does not
        return them). `mask` holds the key term and any masking; keys before the sequence's own (prefix tuning's)
        have no relative position and get no value vector."""
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale  # (B, H, Tq, Tk')
        if mask is not None:
            scores = scores + mask.float()
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        probs = F.dropout(probs, dropout_p) if dropout_p > 0 else probs
        n = len(k_positions)
        return torch.matmul(probs, v) + self.value_term(probs[..., -n:], q_positions, k_positions)
