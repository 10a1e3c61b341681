"""The transformer model of every family: token embeddings, one or two stacks, optional LM head and pooler.

Models return hidden states and logits; objectives and tasks compute losses."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models.config import ModelConfig
from lmforge.models.layers import KVCache, activation_fn, make_norm
from lmforge.models.stack import Stack


@dataclass
class ModelOutput:
    last_hidden_state: Tensor
    """(B, T, d_model): the decoder's for decoder and encoder-decoder models, else the encoder's."""
    logits: Tensor | None = None
    """(B, T, vocab_size) when the model has an LM head and logits were requested."""
    cache: KVCache | None = None
    encoder_last_hidden_state: Tensor | None = None
    pooled: Tensor | None = None
    """(B, d_model) BERT pooler output over the first token."""


class Transformer(nn.Module):
    """A decoder, encoder or encoder-decoder transformer, chosen by `ModelConfig.arch`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.config = cfg
        emb_dim = cfg.embedding_dim or cfg.d_model
        self.tok_emb = nn.Embedding(cfg.vocab_size, emb_dim)
        if cfg.arch in ("encoder", "encoder-decoder"):
            self.encoder = Stack(cfg, cfg.n_layers, "bidirectional", cross=False)
        if cfg.arch in ("decoder", "encoder-decoder"):
            n = cfg.decoder_layers if cfg.arch == "encoder-decoder" else cfg.n_layers
            kind = cfg.mask if cfg.arch == "decoder" else "causal"
            self.decoder = Stack(cfg, n, kind, cross=cfg.arch == "encoder-decoder")
        if cfg.pooler:
            self.pooler = nn.Linear(cfg.d_model, cfg.d_model)
        if cfg.lm_head:
            head_in = cfg.d_model
            if cfg.lm_head_transform:  # BERT MLM head: dense + act + norm (to E for ALBERT), then tied decoder
                self.head_dense = nn.Linear(cfg.d_model, emb_dim)
                self.head_norm = make_norm(cfg, emb_dim)
                head_in = emb_dim
            self.lm_head = nn.Linear(head_in, cfg.vocab_size, bias=cfg.lm_head_bias)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            # GPT-2 §2.3: scale residual-path projections by 1/sqrt(N) at init, N = number of residual layers.
            if name.endswith(("attn.o.weight", "mlp.down.weight")):
                nn.init.normal_(p, std=cfg.init_std / math.sqrt(2 * cfg.n_layers))
        if cfg.arch == "encoder-decoder" and cfg.share_encoder_decoder:
            self._share_encoder_decoder()
        self.tie_weights()

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=self.config.init_std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=self.config.init_std)

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
        """Parameters counted once (tied and shared tensors once); optionally without embedding tables."""
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
        if cfg.scale_tied_logits and cfg.tie_embeddings:
            h = h * cfg.d_model**-0.5
        return self.lm_head(h)

    def _positions(self, input_ids: Tensor, cache: KVCache | None, position_ids: Tensor | None) -> Tensor:
        if position_ids is not None:
            return position_ids
        offset = cache.length if cache is not None else 0
        return torch.arange(offset, offset + input_ids.shape[1], device=input_ids.device)

    def encode(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """Encoder hidden states (B, T, d_model)."""
        pos = self._positions(input_ids, None, None)
        return self.encoder(self.tok_emb(input_ids), pos, token_type_ids=token_type_ids, key_padding=attention_mask)

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
        prefix_len: Tensor | None = None,
        cache: KVCache | None = None,
        use_cache: bool = False,
        return_logits: bool = True,
    ) -> ModelOutput:
        """input_ids (B, T); attention_mask (B, T) with 1 for real tokens (for a cached decoder: (B, T_past + T))."""
        cfg = self.config
        if use_cache and cache is None:
            cache = KVCache(cfg.decoder_layers if cfg.arch == "encoder-decoder" else cfg.n_layers)
        enc = pooled = None
        if cfg.arch == "encoder":
            h = self.encode(input_ids, attention_mask, token_type_ids)
        elif cfg.arch == "decoder":
            pos = self._positions(input_ids, cache, position_ids)
            h = self.decoder(
                self.tok_emb(input_ids),
                pos,
                token_type_ids=token_type_ids,
                key_padding=attention_mask,
                prefix_len=prefix_len,
                cache=cache,
            )
        else:
            if decoder_input_ids is None:
                raise LMForgeError("an encoder-decoder forward needs decoder_input_ids")
            enc = encoder_hidden_states
            if enc is None:
                enc = self.encode(input_ids, attention_mask, token_type_ids)
            pos = self._positions(decoder_input_ids, cache, position_ids)
            h = self.decoder(
                self.tok_emb(decoder_input_ids),
                pos,
                key_padding=decoder_attention_mask,
                cache=cache,
                memory=enc,
                memory_padding=attention_mask,
            )
        if cfg.pooler:
            pooled = torch.tanh(self.pooler(h[:, 0]))
        logits = self.logits(h) if cfg.lm_head and return_logits else None
        return ModelOutput(h, logits, cache, enc, pooled)
