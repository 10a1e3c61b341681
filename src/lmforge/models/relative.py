"""Transformer-XL relative attention (Dai et al. 2019 §3.3) and XLNet's relative segment encoding (Yang et al. 2019
§2.5), on top of the stack's fused q/k/v projection and SDPA.

The score of query i and key j is

    A_ij = (q_i + u)·k_j + (q_i + v)·W_{k,R} R_{i-j} [+ (q_i + b)·s_ij]

(terms (a)+(c) and (b)+(d) of §3.3, and XLNet's segment term), scaled by 1/sqrt(head_dim). R is the sinusoid table
of relative distances (sin features first, then cos, as both papers' code builds it); u, v and the segment bias b
are per-layer, per-head vectors (the released models' "untied" biases). The content term runs inside SDPA with
q + u as the query; the position and segment terms, (B, H, Tq, Tk) tensors, ride in as its additive mask.

Position scores are computed once per distinct distance, (B, H, Tq, P), and gathered into place: exact for any
query and key positions (memory, cache offsets, XLNet's query stream at arbitrary targets), no shift trick."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.models.positions import sinusoidal_embedding


class XLRelative(nn.Module):
    """A layer's relative-attention parameters: W_{k,R} (`r`), the content bias u, the position bias v and, with
    XLNet's segment encoding, the segment bias and the two segment vectors (row 0 = same segment, 1 = other)."""

    def __init__(self, d_model: int, n_heads: int, head_dim: int, segments: bool, init_std: float) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.r = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.u = nn.Parameter(torch.empty(n_heads, head_dim))
        self.v = nn.Parameter(torch.empty(n_heads, head_dim))
        params = [self.u, self.v]
        if segments:
            self.seg_bias = nn.Parameter(torch.empty(n_heads, head_dim))
            self.seg = nn.Parameter(torch.empty(2, n_heads, head_dim))
            params += [self.seg_bias, self.seg]
        for p in params:
            nn.init.normal_(p, std=init_std)

    def project(self, r: Tensor) -> Tensor:
        """Sinusoids R (P, d_model) -> W_{k,R} R per head (P, H, head_dim)."""
        return self.r(r).view(r.shape[0], self.n_heads, self.head_dim)


@dataclass
class RelInputs:
    """What every layer shares for one stream of one forward."""

    index: Tensor
    """(1|B, Tq, Tk) long: row of the distance table R for each query-key pair."""
    allowed: Tensor | None = None
    """(1|B, Tq, Tk) bool: keys each query may attend to (None = all)."""
    seg_diff: Tensor | None = None
    """(B, Tq, Tk) bool: query and key lie in different segments (XLNet; None = no segment term)."""

    def rows(self, positions: Tensor) -> RelInputs:
        """The inputs of queries at sequence positions (B, P): XLNet's query stream at its targets."""

        def pick(t: Tensor | None) -> Tensor | None:
            if t is None:
                return None
            t = t.expand(positions.shape[0], -1, -1)
            return t.gather(1, positions[:, :, None].expand(-1, -1, t.shape[-1]))

        return RelInputs(pick(self.index), pick(self.allowed), pick(self.seg_diff))


def distance_table(
    q_len: int, k_len: int, q_offset: int, d_model: int, clamp_len: int, causal: bool, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Sinusoids of the distances that occur, (P, d_model) float32, and each query-key pair's row (q_len, k_len).

    Query i sits at position q_offset + i, key j at j (memory or cache first). Distances beyond clamp_len (> 0)
    are clamped (both papers' clamp_len); a causal stack never looks at negative distances, so they share row 0
    there instead of costing table rows. Bounds come from Python ints: no device sync, no graph break."""
    q_pos = torch.arange(q_offset, q_offset + q_len, device=device)
    dist = q_pos[:, None] - torch.arange(k_len, device=device)[None, :]  # (Tq, Tk)
    lo, hi = q_offset - (k_len - 1), q_offset + q_len - 1
    if causal:
        dist, lo = dist.clamp(min=0), max(lo, 0)
    if clamp_len > 0:
        dist = dist.clamp(-clamp_len, clamp_len)
        lo, hi = max(lo, -clamp_len), min(hi, clamp_len)
    table = sinusoidal_embedding(torch.arange(lo, hi + 1, device=device), d_model, interleaved=False)
    return table, dist - lo


def relative_attention(
    rel: XLRelative, q: Tensor, k: Tensor, v: Tensor, r_k: Tensor, inp: RelInputs, scale: float, dropout: float
) -> Tensor:
    """q (B, H, Tq, hd), k and v (B, H, Tk, hd), r_k = W_{k,R} R (P, H, hd) -> attention output (B, H, Tq, hd)."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    dtype = q.dtype
    pos = torch.einsum("bhqd,phd->bhqp", q + rel.v.to(dtype)[:, None], r_k.to(dtype))  # (B, H, Tq, P)
    bias = pos.gather(-1, inp.index[:, None].expand(B, H, Tq, Tk))  # (B, H, Tq, Tk): terms (b) + (d)
    if inp.seg_diff is not None:
        seg = torch.einsum("bhqd,shd->bhqs", q + rel.seg_bias.to(dtype)[:, None], rel.seg.to(dtype))  # (B,H,Tq,2)
        bias = bias + torch.where(inp.seg_diff[:, None], seg[..., 1:], seg[..., :1])
    bias = bias * scale
    if inp.allowed is not None:
        # The most negative finite value, not -inf: a query with no visible key (XLNet's first target without
        # memory) then attends uniformly, as the reference implementation's -1e30 does, instead of giving NaN.
        bias = bias.masked_fill(~inp.allowed[:, None], torch.finfo(dtype).min)
    return F.scaled_dot_product_attention(
        q + rel.u.to(dtype)[:, None], k, v, attn_mask=bias, dropout_p=dropout, scale=scale
    )  # terms (a) + (c) inside
