"""The one block loop. Encoder = bidirectional mask, decoder = causal (or prefix-LM) mask, and a decoder stack of
an encoder-decoder adds cross-attention over the encoder's output."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models.config import MaskKind, ModelConfig
from lmforge.models.layers import AttnInputs, Block, KVCache, make_norm
from lmforge.models.masks import MASK_RULES, kind_allowed
from lmforge.models.position_components import Positions, build_positions
from lmforge.models.static_cache import StaticKVCache


def allowed_keys(
    kind: MaskKind,
    q_len: int,
    k_len: int,
    q_offset: int,
    key_padding: Tensor | None,
    prefix_len: Tensor | None,
    device: torch.device,
) -> Tensor | None:
    """Boolean (B|1, 1, Tq, Tk) mask of keys each query may attend to, or None when all are allowed.

    prefix_len (B,): for kind="prefix", keys at indices < prefix_len are visible to every query (T5 §3.2.1,
    UniLM); None means no prefix beyond what causality already shows (decoding steps after the prompt).
    """
    rule = MASK_RULES[kind]
    if rule.future and key_padding is None:
        return None
    q_pos = torch.arange(q_len, device=device)[:, None] + q_offset  # (Tq, 1)
    k_pos = torch.arange(k_len, device=device)[None, :]  # (1, Tk)
    if rule.future:
        ok = torch.ones(1, 1, q_len, k_len, dtype=torch.bool, device=device)
    else:
        ok = (k_pos <= q_pos)[None, None]  # causal
        if rule.prefix and prefix_len is not None:
            ok = ok | (k_pos[None, None] < prefix_len.to(device)[:, None, None, None])
    if key_padding is not None:
        ok = ok & key_padding.bool()[:, None, None, :]
    return ok


def attention_dtype(x: Tensor) -> torch.dtype:
    """The dtype attention runs in: autocast's inside autocast, else x's. Additive masks and position biases are
    built in it, so SDPA gets q, k, v and mask in one dtype (and a bf16 mask takes half a float32 one's memory)."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


class Stack(nn.Module):
    """Embedding post-processing (positions, segments, norm, factorised projection) + the block loop."""

    def __init__(self, cfg: ModelConfig, n_layers: int, kind: MaskKind, cross: bool) -> None:
        super().__init__()
        self.cfg, self.kind, self.n_layers = cfg, kind, n_layers
        emb_dim = cfg.embedding_dim or cfg.d_model
        positions = build_positions(cfg, kind)
        self._positions_attr = positions.attr
        # Registration order is models/init.py's draw order: a table added to the embeddings comes before the
        # segment table and the embedding norm, an attention bias after them (as they always have).
        if positions.scheme.absolute_table:
            self.add_module(positions.attr, positions)
        if cfg.type_vocab_size:
            self.type_emb = nn.Embedding(cfg.type_vocab_size, emb_dim)
        if cfg.embedding_norm:
            self.emb_norm = make_norm(cfg, emb_dim)
        if emb_dim != cfg.d_model:  # ALBERT / ELECTRA: factorised embeddings, E -> d_model
            self.emb_proj = nn.Linear(emb_dim, cfg.d_model)
        if not positions.scheme.absolute_table:
            self.add_module(positions.attr, positions)
        if cfg.two_stream:  # XLNet §2.3: the query stream starts from one learned vector w
            self.mask_emb = nn.Parameter(torch.empty(cfg.d_model))  # initialised by models/init.py
        self.dropout = nn.Dropout(cfg.dropout)
        # ALBERT cross-layer sharing: one block applied n_layers times.
        self.blocks = nn.ModuleList(Block(cfg, cross) for _ in range(1 if cfg.share_layers else n_layers))
        if cfg.final_norm:
            self.final_norm = make_norm(cfg)
        # T5Stack drops its output after the final norm; a module only where a family asks for it (see MLP).
        self.final_dropout = nn.Dropout(cfg.dropout) if cfg.dropout_final_norm else None

    @property
    def pos(self) -> Positions:
        """This stack's position component (models/position_components.py), registered as its `attr`."""
        # Read by name, so a component another stack lends (ELECTRA's generator borrows `pos_emb`) is the one used.
        return getattr(self, self._positions_attr)

    def embed(self, x: Tensor, positions: Tensor | None, token_type_ids: Tensor | None) -> Tensor:
        """Add positions and segments to token embeddings x (B, T, E) and map to d_model."""
        cfg = self.cfg
        if cfg.scale_embeddings:
            x = x * math.sqrt(cfg.d_model)
        x = self.pos.embed(x, positions)
        if cfg.type_vocab_size:
            if token_type_ids is None:
                token_type_ids = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
            x = x + self.type_emb(token_type_ids)
        if cfg.embedding_norm:
            x = self.emb_norm(x)
        x = self.dropout(x)
        return self.emb_proj(x) if hasattr(self, "emb_proj") else x

    def output(self, h: Tensor) -> Tensor:
        """The stack's output from the last block's: the final norm and its dropout, each where configured."""
        h = self.final_norm(h) if self.cfg.final_norm else h
        return h if self.final_dropout is None else self.final_dropout(h)

    def _self_inputs(
        self,
        x: Tensor,
        positions: Tensor,
        key_padding: Tensor | None,
        prefix_len: Tensor | None,
        cache: KVCache | StaticKVCache | None,
        attn_kind: Tensor | None = None,
    ) -> AttnInputs:
        if isinstance(cache, StaticKVCache):  # one fixed-shape decoding step (models/static_cache.py)
            return cache.step_inputs(self, x, positions)
        B, T, _ = x.shape
        offset = cache.length if cache is not None else 0
        k_len = offset + T
        rule = MASK_RULES[self.kind]
        if rule.prefix and prefix_len is None and offset == 0:
            raise LMForgeError("a prefix-LM model (model.mask='prefix') needs prefix_len in its first forward")
        key_index = torch.arange(k_len, device=x.device)
        query_index = key_index[offset:]
        pos = self.pos
        causal = not rule.future and attn_kind is None  # row kinds mask the future themselves
        bias = pos.attention_bias(query_index, key_index, offset, causal)  # (1, H, T, Tk) or None
        plain = not (rule.future or rule.prefix) and key_padding is None and bias is None and not pos.explicit_mask
        if plain and attn_kind is None and (offset == 0 or T == 1):
            # No explicit mask: SDPA's causal path (flash attention on GPU); one new token sees every key.
            return AttnInputs(None, offset == 0, positions, query_index, key_index, cache)
        if attn_kind is not None:  # a mask kind per row (UniLM's mixture), in place of the stack's own
            ok = kind_allowed(attn_kind, prefix_len, T, k_len, offset, key_padding, x.device)
        else:
            ok = allowed_keys(self.kind, T, k_len, offset, key_padding, prefix_len, x.device)
        mask = None
        dtype = attention_dtype(x)
        if ok is not None:
            # A large negative number rather than -inf keeps fully masked (padding) rows finite.
            neg = torch.finfo(dtype).min
            mask = torch.zeros(ok.shape, dtype=dtype, device=x.device).masked_fill(~ok, neg)
        if bias is not None:
            bias = bias.to(dtype)
            mask = bias if mask is None else (mask + bias).clamp(min=torch.finfo(dtype).min)
            if mask.requires_grad and mask.shape[0] == 1 < B:
                # A learned bias broadcast over the batch keeps compiled SDPA off its fused kernels (math attention,
                # partly in float32); one copy per sequence lets it run memory-efficient attention. T5-base training,
                # B=16, T=512, H200: peak memory 9.0 -> 6.7 GiB, GPU time per step -16% (bench/README.md).
                mask = mask.expand(B, -1, -1, -1).contiguous()
        return AttnInputs(mask, False, positions, query_index, key_index, cache)

    def forward(
        self,
        x: Tensor,
        positions: Tensor,
        *,
        token_type_ids: Tensor | None = None,
        key_padding: Tensor | None = None,
        prefix_len: Tensor | None = None,
        cache: KVCache | StaticKVCache | None = None,
        memory: Tensor | None = None,
        memory_padding: Tensor | None = None,
        hidden_states: list[Tensor] | None = None,
        attn_kind: Tensor | None = None,
    ) -> Tensor:
        """x: token embeddings (B, T, E); positions: (T,) or (B, T); key_padding: (B, T_past + T), 1 = real token;
        attn_kind (B,): a self-attention kind per row (models/masks.py), replacing the stack's own mask.

        hidden_states: a list to append the input of every block and the final output to (n_layers + 1)."""
        h = self.embed(x, positions, token_type_ids)
        inp = self._self_inputs(h, positions, key_padding, prefix_len, cache, attn_kind)
        mem_inp = None
        if memory is not None:
            mem_mask = None
            if memory_padding is not None:
                dtype = attention_dtype(h)
                mem_mask = torch.zeros(memory_padding.shape, dtype=dtype, device=h.device)
                mem_mask = mem_mask.masked_fill(~memory_padding.bool(), torch.finfo(dtype).min)[:, None, None, :]
            mem_inp = AttnInputs(mem_mask, False, cache=cache)
        for i in range(self.n_layers):
            if hidden_states is not None:
                hidden_states.append(h)
            block = self.blocks[0 if self.cfg.share_layers else i]
            h = block(h, inp, i, memory, mem_inp)
        h = self.output(h)
        if hidden_states is not None:
            hidden_states.append(h)
        return h
