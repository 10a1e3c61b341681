"""The block loop of a stack with Transformer-XL relative attention (model.position='xl'): segment-level recurrence
(Dai et al. 2019 §3.2) and XLNet's two-stream attention (Yang et al. 2019 §2.3).

It runs the stack's own blocks (their norms, fused q/k/v projection, output projection and MLP) with relative
attention in place of the plain one:

- memory: each layer's input hidden states of the previous segments, `mems[l]` (B, M, d_model), are extra keys and
  values of layer l (queries come from the current segment only); the new memory is cat(mems[l], h_l)[-mem_len:],
  detached so no gradient flows into the past (§3.2's SG(·));
- content stream h: the usual hidden states; with a permutation mask a position sees the positions before it in
  the factorisation order and itself (XLNet §2.3 eq. 4, h_{z_t} from x_{z<=t});
- query stream g: one row per target position, started from a learned vector w (`stack.mask_emb`); it sees the
  same keys and values (the content stream's) but not its own position's, so it knows where it predicts but not
  what (g_{z_t} from x_{z<t}). Both streams share every weight.

A KV cache works as in the other stacks (incremental decoding): keys and values of past tokens stay valid because
relative attention never puts positions into them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models.layers import Block, KVCache
from lmforge.models.relative import RelInputs, distance_table, relative_attention


@dataclass
class XLOutput:
    h: Tensor
    """(B, T, d_model) content stream after the last block (and the final norm)."""
    g: Tensor | None
    """(B, P, d_model) query stream at the target positions, when asked for."""
    mems: list[Tensor] | None
    """Per layer (B, <= mem_len, d_model): memory for the next segment (detached), when asked for."""
    hidden_states: list[Tensor] | None
    """Content stream entering each block, then the final output (n_layers + 1), when asked for."""


def update_memory(mem: Tensor | None, h: Tensor, mem_len: int) -> Tensor:
    """The last mem_len states of the previous memory followed by this segment's (B, <= mem_len, d), detached and
    contiguous: a memory with the same shape then has the same strides every step, so a compiled step is reused."""
    cat = h if mem is None else torch.cat([mem.to(h.dtype), h], dim=1)
    return cat[:, -mem_len:].detach().contiguous()


def stream_masks(
    B: int, T: int, M: int, causal: bool, key_padding: Tensor | None, perm_mask: Tensor | None, device
) -> tuple[Tensor | None, Tensor | None]:
    """Allowed keys (1|B, T, M + T) of the content and query streams; None = every key.

    perm_mask (B, T, T): 1/True where position i may NOT see position j (XLNet's and Hugging Face's convention);
    memory is visible to every query. key_padding (B, M + T) or (B, T): 1 for real tokens."""
    if not causal and key_padding is None and perm_mask is None:
        return None, None
    k_len = M + T
    ok = torch.ones(1, T, k_len, dtype=torch.bool, device=device)
    if causal:
        q_abs = torch.arange(T, device=device)[:, None] + M
        ok = ok & (torch.arange(k_len, device=device)[None, :] <= q_abs)[None]
    if key_padding is not None:
        pad = key_padding.bool().to(device)
        if pad.shape[1] == T and M:
            pad = torch.cat([pad.new_ones(B, M), pad], dim=1)
        ok = ok & pad[:, None, :]
    if perm_mask is not None:
        if perm_mask.shape != (B, T, T):
            raise LMForgeError(
                f"perm_mask must have shape (batch, seq, seq) = {(B, T, T)}, got {tuple(perm_mask.shape)}"
            )
        sees = torch.cat([perm_mask.new_zeros(B, T, M), perm_mask], dim=2) == 0
        ok = ok & sees.to(device)
    # The content stream always sees its own token (XLNet eq. 4: h_{z_t} depends on x_{z_t}).
    own = torch.zeros(T, k_len, dtype=torch.bool, device=device)
    own[torch.arange(T), torch.arange(T) + M] = True
    return ok | own, ok


def _segments(token_type_ids: Tensor | None, M: int) -> Tensor | None:
    """(B, T, M + T) bool: query and key in different segments; memory counts as segment 0 (as XLNet's code)."""
    if token_type_ids is None:
        return None
    cat_ids = torch.cat([token_type_ids.new_zeros(token_type_ids.shape[0], M), token_type_ids], dim=1)
    return token_type_ids[:, :, None] != cat_ids[:, None, :]


def _attend(block: Block, x: Tensor, kv: tuple[Tensor, Tensor], r_k: Tensor, inp: RelInputs) -> Tensor:
    """Relative self-attention of queries from x (B, Tq, d) (already normed for pre-LN) over keys/values kv."""
    attn = block.attn
    B, Tq, _ = x.shape
    q_dim = attn.n_heads * attn.hd
    q = attn._heads(attn.qkv(x)[..., :q_dim], attn.n_heads)
    y = relative_attention(attn.rel, q, kv[0], kv[1], r_k, inp, attn.scale, attn.attn_dropout if attn.training else 0.0)
    return attn.o(y.transpose(1, 2).reshape(B, Tq, q_dim))


def _residual(block: Block, x: Tensor, y: Tensor) -> Tensor:
    """The attention sublayer's residual: x + y (pre-LN) or norm(x + y) (post-LN)."""
    return x + block.dropout(y) if block.pre else block.norm1(x + block.dropout(y))


def xl_block(
    block: Block,
    layer: int,
    h: Tensor,
    g: Tensor | None,
    mem: Tensor | None,
    r: Tensor,
    rel_h: RelInputs,
    rel_g: RelInputs | None,
    cache: KVCache | None,
) -> tuple[Tensor, Tensor | None]:
    """One block on the content stream h (B, T, d) and, if given, the query stream g (B, P, d)."""
    attn = block.attn
    hn = block.norm1(h) if block.pre else h
    T = h.shape[1]
    ctx = hn
    if mem is not None:  # pre-LN normalises what the memory's keys and values are made of, as the current tokens'
        ctx = torch.cat([(block.norm1(mem) if block.pre else mem).to(hn.dtype), hn], dim=1)
    q_dim = attn.n_heads * attn.hd
    w = attn.qkv(ctx)  # (B, M + T, 3 * H * hd): one fused matmul, as the plain stack
    q, k, v = w[:, -T:, :q_dim], w[..., q_dim : 2 * q_dim], w[..., 2 * q_dim :]
    q, k, v = attn._heads(q, attn.n_heads), attn._heads(k, attn.n_heads), attn._heads(v, attn.n_heads)
    if cache is not None:
        k, v = cache.append(layer, k, v)
    r_k = attn.rel.project(r)  # (P, H, hd)
    drop = attn.attn_dropout if attn.training else 0.0
    y = relative_attention(attn.rel, q, k, v, r_k, rel_h, attn.scale, drop)
    h = _residual(block, h, attn.o(y.transpose(1, 2).reshape(h.shape[0], T, q_dim)))
    h = block._residual(h, block.norm2, block.mlp)
    if g is not None:
        g = _residual(block, g, _attend(block, block.norm1(g) if block.pre else g, (k, v), r_k, rel_g))
        g = block._residual(g, block.norm2, block.mlp)
    return h, g


def xl_forward(
    stack: nn.Module,
    x: Tensor,
    *,
    causal: bool,
    key_padding: Tensor | None = None,
    token_type_ids: Tensor | None = None,
    mems: list[Tensor] | None = None,
    mem_len: int = 0,
    perm_mask: Tensor | None = None,
    query_positions: Tensor | None = None,
    cache: KVCache | None = None,
    output_hidden_states: bool = False,
) -> XLOutput:
    """Run `stack` (a models.stack.Stack with position='xl') on token embeddings x (B, T, E).

    mems: the previous segments' memory (one (B, M, d_model) tensor per layer); mem_len > 0 returns the next one.
    perm_mask (B, T, T) and query_positions (B, P): XLNet's factorisation-order mask and the targets of the query
    stream (requires model.two_stream). cache: incremental decoding (not with mems)."""
    cfg = stack.cfg
    B, T, _ = x.shape
    if mems is not None and cache is not None:
        raise LMForgeError("pass either mems (segment recurrence) or a KV cache (decoding), not both")
    if mems is not None and len(mems) != stack.n_layers:
        raise LMForgeError(f"mems must hold one tensor per layer ({stack.n_layers}), got {len(mems)}")
    if query_positions is not None and not cfg.two_stream:
        raise LMForgeError(f"model '{cfg.name}' has no query stream (model.two_stream is false)")
    M = mems[0].shape[1] if mems is not None else (cache.length if cache is not None else 0)
    h = stack.embed(x, None, token_type_ids)  # no absolute positions (XLNet's segments are relative too)
    device = h.device
    table, index = distance_table(T, M + T, M, cfg.d_model, cfg.clamp_len, causal, device)
    r = stack.dropout(table.to(h.dtype))
    content, query = stream_masks(B, T, M, causal, key_padding, perm_mask, device)
    seg = _segments(token_type_ids, M) if cfg.rel_segments else None
    rel_h = RelInputs(index[None], content, seg)
    g = rel_g = None
    if query_positions is not None:
        rel_g = RelInputs(index[None], query, seg).rows(query_positions.to(device))
        g = stack.dropout(stack.mask_emb.to(h.dtype).expand(B, query_positions.shape[1], -1))
    hidden = [] if output_hidden_states else None
    new_mems = [] if mem_len > 0 else None
    for i in range(stack.n_layers):
        if hidden is not None:
            hidden.append(h)
        mem = mems[i] if mems is not None else None
        if new_mems is not None:
            new_mems.append(update_memory(mem, h, mem_len))
        block = stack.blocks[0 if cfg.share_layers else i]
        h, g = xl_block(block, i, h, g, mem, r, rel_h, rel_g, cache)
    h = stack.output(h)
    g = stack.output(g) if g is not None else None
    if hidden is not None:
        hidden.append(h)
    return XLOutput(h, g, new_mems, hidden)
