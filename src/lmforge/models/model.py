"""The transformer model of every family: token embeddings, one or two stacks, optional LM head and pooler.

Models return hidden states and logits; objectives and tasks compute losses. This is the network alone: the class
users build and load, `lmforge.models.Transformer` (models/transformer.py), is this network with the Hugging Face
surface (generate, save_pretrained / from_pretrained, `labels=`) added in a module above it."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models.config import ModelConfig
from lmforge.models.init import init_weights
from lmforge.models.layers import KVCache, activation_fn, make_norm
from lmforge.models.lm_head import aligned_head_logits, cross_entropy
from lmforge.models.mtp import MTPHeads
from lmforge.models.output import ModelOutput
from lmforge.models.recurrence import xl_forward
from lmforge.models.stack import Stack


def _kinds(attn_kind: Tensor | None, prefix_len: Tensor | None) -> dict:
    """Stack arguments of per-row attention kinds, passed only when given (stack wrappers such as prompt tuning's
    take the plain arguments)."""
    if attn_kind is None:
        return {}
    return {"attn_kind": attn_kind} if prefix_len is None else {"attn_kind": attn_kind, "prefix_len": prefix_len}


def _collect(hidden_states: list[Tensor] | None) -> dict:
    """The stack argument that collects every layer's hidden states, passed only when asked for."""
    return {} if hidden_states is None else {"hidden_states": hidden_states}


class RTDHead(nn.Module):
    """ELECTRA §2 discriminator head: dense + activation, then one replaced-token logit per position."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.out = nn.Linear(cfg.d_model, 1)
        self.act = activation_fn(cfg.activation)

    def forward(self, h: Tensor) -> Tensor:
        return self.out(self.act(self.dense(h))).squeeze(-1)  # (B, T)


class TransformerCore(nn.Module):
    """A decoder, encoder or encoder-decoder transformer, chosen by `ModelConfig.arch`: the network, loss-free (the
    Hugging Face-shaped methods are `lmforge.models.Transformer`'s, a subclass)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.config = cfg
        emb_dim = cfg.embedding_dim or cfg.d_model
        self.tok_emb = nn.Embedding(cfg.vocab_size, emb_dim)
        if cfg.has_encoder:
            self.encoder = Stack(cfg, cfg.n_layers, "bidirectional", cross=False)
        if cfg.has_decoder:
            n = cfg.decoder_layers if cfg.is_encoder_decoder else cfg.n_layers
            kind = cfg.mask if cfg.is_decoder else "causal"
            self.decoder = Stack(cfg, n, kind, cross=cfg.is_encoder_decoder)
        if cfg.pooler:
            self.pooler = nn.Linear(cfg.d_model, cfg.d_model)
        if cfg.rtd_head:
            self.rtd_head = RTDHead(cfg)
        if cfg.nsp_head:  # BERT §3.1 Task #2: a 2-way classifier on the pooled [CLS] output
            self.nsp_head = nn.Linear(cfg.d_model, 2)
        if cfg.lm_head:
            head_in = cfg.d_model
            if cfg.lm_head_transform:  # BERT MLM head: dense + act + norm (to E for ALBERT), then tied decoder
                self.head_dense = nn.Linear(cfg.d_model, emb_dim)
                self.head_norm = make_norm(cfg, emb_dim)
                head_in = emb_dim
            self.lm_head = nn.Linear(head_in, cfg.vocab_size, bias=cfg.lm_head_bias)
        init_weights(self, cfg)  # as the family's reference does (models/init.py, ModelConfig.init_scheme)
        if cfg.mtp_heads:  # built and initialised after the trunk, which so initialises exactly as without heads
            self.mtp = MTPHeads(cfg)
            init_weights(self.mtp, cfg)
        if cfg.is_encoder_decoder and cfg.share_encoder_decoder:
            self._share_encoder_decoder()
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the LM head's matrix with the token embedding (GPT-1 §3.1: P(u) = softmax(h_n W_eᵀ))."""
        if self.config.lm_head and self.config.tie_embeddings:
            if self.lm_head.weight.shape != self.tok_emb.weight.shape:
                raise LMForgeError("model.tie_embeddings needs the LM head input width to equal the embedding width")
            self.lm_head.weight = self.tok_emb.weight

    def _share_encoder_decoder(self) -> None:
        # T5 Table 2 "Enc-dec, shared": decoder layers reuse the encoder's self-attention and MLP parameters.
        for enc, dec in zip(self.encoder.blocks, self.decoder.blocks):
            dec.attn, dec.norm1, dec.mlp, dec.norm2 = enc.attn, enc.norm1, enc.mlp, enc.norm2

    def num_params(self, non_embedding: bool = False) -> int:
        """Every parameter the model holds, heads included (LM head, MLM transform, pooler, RTD, NSP), tied and
        shared tensors once; `non_embedding` leaves out the token and learned-position tables.

        Buffers are not parameters (e.g. ALiBi slopes); HF's BART `final_logits_bias` is a buffer there but
        the trainable `lm_head.bias` here."""
        seen: set[int] = set()
        total = 0
        for name, p in self.named_parameters(remove_duplicate=True):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if non_embedding and (name == "tok_emb.weight" or ".pos_emb." in name):
                continue
            total += p.numel()
        return total

    def logits(self, h: Tensor) -> Tensor:
        """LM-head logits for hidden states h (..., d_model); objectives may pass only selected positions."""
        cfg = self.config
        if not cfg.lm_head:
            raise LMForgeError(f"model '{cfg.name}' has no LM head")
        if cfg.lm_head_transform:
            h = self.head_norm(activation_fn(cfg.activation)(self.head_dense(h)))
        if cfg.scale_tied_logits:
            h = h * cfg.d_model**-0.5
        logits = self.lm_head(h)
        if cfg.logit_softcap:
            logits = cfg.logit_softcap * torch.tanh(logits / cfg.logit_softcap)
        return logits

    def lm_loss(self, h: Tensor, labels: Tensor) -> Tensor:
        """Mean cross-entropy (nats) of the LM head over hidden states h (..., d_model) against labels (...).

        A plain linear head (GPT, Llama) runs with an aligned vocabulary; heads with a transform, bias, rescale or
        soft-cap (BERT, T5, BART, gpt-fast) go through `logits`. Softmax statistics are float32 whatever the
        logits' dtype."""
        cfg = self.config
        if cfg.lm_head_transform or cfg.lm_head_bias or cfg.scale_tied_logits or cfg.logit_softcap:
            logits = self.logits(h)
        else:
            logits = aligned_head_logits(h, self.lm_head.weight)
        return cross_entropy(logits, labels)

    def _positions(self, input_ids: Tensor, cache: KVCache | None, position_ids: Tensor | None) -> Tensor:
        if position_ids is not None:
            return position_ids  # the caller owns their range (generate.py checks max_seq_len itself)
        offset = cache.length if cache is not None else 0
        n = offset + input_ids.shape[1]
        cfg = self.config
        # Checked on Python ints: no device sync, no graph break under torch.compile.
        cfg.check_length(n, "sequence of length {n} exceeds max_seq_len {limit} for learned positions")
        return torch.arange(offset, n, device=input_ids.device)

    def encode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        attn_kind: Tensor | None = None,
        prefix_len: Tensor | None = None,
        hidden_states: list[Tensor] | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """Encoder hidden states (B, T, d_model); attn_kind and prefix_len as in `forward`; `hidden_states` collects
        every layer's (see ModelOutput). position_ids (T,) or (B, T): each token's position when the input is not
        the contiguous 0..T-1 (MAE-LM's encoder sees the unmasked tokens at their own positions)."""
        if self.config.position_scheme.recurrent:
            out = xl_forward(
                self.encoder, self.tok_emb(input_ids), causal=False, key_padding=attention_mask,
                token_type_ids=token_type_ids, output_hidden_states=hidden_states is not None,
            )  # fmt: skip
            if hidden_states is not None:
                hidden_states.extend(out.hidden_states)
            return out.h
        pos = self._positions(input_ids, None, position_ids)
        return self.encoder(
            self.tok_emb(input_ids), pos, token_type_ids=token_type_ids, key_padding=attention_mask,
            **_kinds(attn_kind, prefix_len), **_collect(hidden_states),
        )  # fmt: skip

    def _xl_args(self, **xl) -> dict:
        """The Transformer-XL / XLNet arguments of a forward; LMForgeError when the model has no such stack."""
        cfg = self.config
        if not cfg.position_scheme.recurrent and any(v is not None and v is not False for v in xl.values()):
            raise LMForgeError(
                f"model '{cfg.name}' has no Transformer-XL recurrence (model.position is '{cfg.position}')"
            )
        return xl

    def _forward_xl(
        self, input_ids: Tensor, attention_mask: Tensor | None, token_type_ids: Tensor | None, cache: KVCache | None,
        xl: dict, output_hidden_states: bool, return_logits: bool,
    ) -> ModelOutput:  # fmt: skip
        """Forward of a Transformer-XL / XLNet stack (models/recurrence.py); xl: mems, use_mems, mem_len,
        perm_mask, query_positions."""
        cfg = self.config
        stack = self.decoder if cfg.is_decoder else self.encoder
        mem_len = cfg.mem_len if xl["mem_len"] is None else xl["mem_len"]
        out = xl_forward(
            stack, self.tok_emb(input_ids), causal=cfg.is_decoder, key_padding=attention_mask,
            token_type_ids=token_type_ids, mems=xl["mems"], mem_len=mem_len if xl["use_mems"] else 0,
            perm_mask=xl["perm_mask"], query_positions=xl["query_positions"], cache=cache,
            output_hidden_states=output_hidden_states,
        )  # fmt: skip
        h, g = out.h, out.g
        pooled = torch.tanh(self.pooler(h[:, 0])) if cfg.pooler else None
        want = cfg.lm_head and return_logits
        return ModelOutput(
            last_hidden_state=h,
            logits=self.logits(h) if want else None,
            cache=cache,
            pooled=pooled,
            rtd_logits=self.rtd_head(h) if cfg.rtd_head else None,
            nsp_logits=self.nsp_head(pooled) if cfg.nsp_head else None,
            hidden_states=tuple(out.hidden_states) if output_hidden_states else None,
            mems=out.mems,
            query_hidden_state=g,
            query_logits=self.logits(g) if want and g is not None else None,
        )

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        encoder_hidden_states: Tensor | None = None,
        prefix_len: Tensor | int | None = None,
        cache: KVCache | None = None,
        use_cache: bool = False,
        return_logits: bool = True,
        mtp: bool = False,
        output_hidden_states: bool = False,
        mems: list[Tensor] | None = None,
        use_mems: bool = False,
        mem_len: int | None = None,
        perm_mask: Tensor | None = None,
        query_positions: Tensor | None = None,
        attn_kind: Tensor | None = None,
    ) -> ModelOutput:
        """input_ids (B, T); attention_mask (B, T) with 1 for real tokens (for a cached decoder: (B, T_past + T)).

        prefix_len (B,) or int: for a prefix-LM decoder (model.mask='prefix'), how many leading tokens of each row
        see each other bidirectionally; the rest is causal.

        Encoder-decoder: attention_mask masks the encoder input, decoder_attention_mask the decoder's. To decode
        with a cache, run `encode` once and pass its output as encoder_hidden_states on every step; the
        cross-attention keys/values are computed on the first step and kept in the cache.

        mtp: also run the extra multi-token prediction heads (decoders with model.mtp_heads > 0; training only);
        the next-token head is the stack's last block, so `logits` are the same with or without them.

        output_hidden_states: also return every layer's hidden states (ModelOutput.hidden_states).

        Transformer-XL / XLNet stacks (model.position='xl'): `mems` is the previous segments' memory (one
        (B, M, d_model) tensor per layer, ModelOutput.mems of the last call); use_mems returns the next one, of
        length mem_len (None = model.mem_len). perm_mask (B, T, T), 1 where position i may not see position j, is
        XLNet's factorisation-order mask; query_positions (B, P) runs the query stream at those positions.

        attn_kind (B,): a self-attention kind per row for one-stack models (models/masks.py: bidirectional,
        left-to-right, right-to-left, seq2seq with prefix_len source tokens; UniLM), replacing the stack's mask."""
        cfg = self.config
        if attn_kind is not None and cfg.is_encoder_decoder:
            raise LMForgeError(
                "attn_kind (a self-attention kind per row) applies to one-stack models, not encoder-decoders"
            )
        xl = self._xl_args(
            mems=mems, use_mems=use_mems, mem_len=mem_len, perm_mask=perm_mask, query_positions=query_positions
        )
        if mtp and not cfg.mtp_heads:
            raise LMForgeError(f"model '{cfg.name}' has no multi-token prediction heads (model.mtp_heads is 0)")
        if isinstance(prefix_len, int):
            prefix_len = torch.full((input_ids.shape[0],), prefix_len, device=input_ids.device)
        if use_cache and cache is None:
            cache = KVCache(cfg.decoder_layers if cfg.is_encoder_decoder else cfg.n_layers)
        if cfg.position_scheme.recurrent:
            return self._forward_xl(
                input_ids, attention_mask, token_type_ids, cache, xl, output_hidden_states, return_logits
            )
        enc = pooled = None
        # MTP's parallel heads read the trunk's output z, the input of the stack's last block (models/mtp.py).
        hidden = [] if output_hidden_states or mtp else None
        enc_hidden = [] if output_hidden_states and cfg.is_encoder_decoder else None
        if cfg.is_encoder:
            h = self.encode(
                input_ids, attention_mask, token_type_ids, attn_kind, prefix_len, hidden_states=hidden,
                position_ids=position_ids,
            )  # fmt: skip
        elif cfg.is_decoder:
            pos = self._positions(input_ids, cache, position_ids)
            h = self.decoder(
                self.tok_emb(input_ids),
                pos,
                token_type_ids=token_type_ids,
                key_padding=attention_mask,
                prefix_len=prefix_len,
                cache=cache,
                **_kinds(attn_kind, None),
                **_collect(hidden),
            )
        else:
            if decoder_input_ids is None:
                raise LMForgeError("an encoder-decoder forward needs decoder_input_ids")
            enc = encoder_hidden_states
            if enc is None:
                enc = self.encode(input_ids, attention_mask, token_type_ids, hidden_states=enc_hidden)
            else:
                enc_hidden = None  # the caller encoded: its layers are not here
            pos = self._positions(decoder_input_ids, cache, position_ids)
            h = self.decoder(
                self.tok_emb(decoder_input_ids),
                pos,
                key_padding=decoder_attention_mask,
                cache=cache,
                memory=enc,
                memory_padding=attention_mask,
                **_collect(hidden),
            )
        if cfg.pooler:
            pooled = torch.tanh(self.pooler(h[:, 0]))
        logits = self.logits(h) if cfg.lm_head and return_logits else None
        rtd = self.rtd_head(h) if cfg.rtd_head else None
        nsp = self.nsp_head(pooled) if cfg.nsp_head else None
        extra = self.mtp(self, h, hidden[-2], input_ids, attention_mask) if mtp else None
        hs = tuple(hidden) if output_hidden_states else None
        enc_hs = tuple(enc_hidden) if enc_hidden else None
        return ModelOutput(h, logits, cache, enc, pooled, rtd, nsp, extra, hs, enc_hs)
