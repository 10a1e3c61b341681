"""Training FLOPs of the three families, counted from the model config.

A weight matrix applied to one token costs 2 FLOPs per weight forward and 4 backward: 6 per weight per token
(Kaplan et al. 2020 §2.1, Table 1). Attention adds the scores QKᵀ and the weighted sum AV: 2·2·d_attn FLOPs per
query per key forward, so 12·L·d_attn·T per token of a length-T context for training (PaLM, Chowdhery et al. 2022,
App. B, counting the full T×T score matrix as PaLM and nanoGPT do; d_attn = n_heads·head_dim).

- decoder (and prefix LM), per token of a length-T sequence: 6·N + 12·L·d_attn·T;
- encoder: the same over its input tokens;
- encoder-decoder, per example of S source and T target tokens: the encoder's 6·N_enc·S + 12·L_enc·d_attn·S²,
  the decoder's 6·N_dec·T + 12·L_dec·d_attn·T² for its self-attention, cross-attention's key/value projections
  on the S encoder outputs (6·N_kv·S) and its scores and sums over S keys (12·L_dec·d_attn·T·S).

N counts matmul weights only (biases and norms are additions, embedding lookups are free); the LM head counts
whether or not it is tied to the embedding, since its matmul runs either way. An ALBERT block shared across
L layers is counted L times: parameters are shared, FLOPs are not. Multi-token-prediction heads (training only)
are not counted. docs/scaling.md states the formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.models.config import ModelConfig


def flops_per_token(n_params: int, n_layers: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N + 12·L·d·T (PaLM, Chowdhery et al. 2022, appendix B).

    6N covers the forward and backward matmuls with the weights; 12·L·d·T the attention scores and
    weighted sums (L layers, d = n_heads·head_dim, context T), counted over the full T×T score matrix as in
    nanoGPT's ``estimate_mfu``. Whether ``n_params`` includes position embeddings is the caller's choice
    (nanoGPT excludes them: they are a lookup, not a matmul). `model_flops_per_token` derives N, L and d from a
    model config for every family.
    """
    if min(n_params, n_layers, d_model, seq_len) < 0:
        raise ValueError("flops_per_token arguments must be non-negative")
    return 6.0 * n_params + 12.0 * n_layers * d_model * seq_len


@dataclass(frozen=True)
class MatmulWeights:
    """Matmul weights of a model, grouped by the tokens they are applied to (each layer application counted)."""

    encoder: int
    """Applied once per input token of the encoder, or of a decoder-only stack."""
    decoder: int
    """Applied once per decoder token of an encoder-decoder: self-attention, MLP, cross-attention's q and o."""
    cross_kv: int
    """Cross-attention key/value projections: applied once per source token (encoder output) in every layer."""
    head: int
    """LM head (and BERT's head transform, ELECTRA's replaced-token head): once per token it predicts."""

    @property
    def total(self) -> int:
        return self.encoder + self.decoder + self.cross_kv + self.head


def block_weights(cfg: ModelConfig) -> int:
    """Self-attention (fused q, k, v and the output projection) + MLP weights of one block."""
    d, q_dim, kv_dim = cfg.d_model, cfg.n_heads * cfg.dim_head, cfg.kv_heads * cfg.dim_head
    attn = d * (q_dim + 2 * kv_dim) + q_dim * d
    mlp = (3 if cfg.gated else 2) * d * cfg.d_ff
    return attn + mlp


def lm_head_weights(cfg: ModelConfig) -> int:
    """Matmul weights of the LM head (BERT's transform included): the part of `MatmulWeights.head` that an
    objective scoring only some positions (masked LMs) runs on fewer tokens."""
    if not cfg.lm_head:
        return 0
    emb = cfg.embedding_dim or cfg.d_model
    if cfg.lm_head_transform:
        return cfg.d_model * emb + emb * cfg.vocab_size
    return cfg.d_model * cfg.vocab_size


def matmul_weights(cfg: ModelConfig) -> MatmulWeights:
    """The matmul weights of `cfg`'s model by where they apply (see `MatmulWeights`)."""
    d, q_dim, kv_dim = cfg.d_model, cfg.n_heads * cfg.dim_head, cfg.kv_heads * cfg.dim_head
    emb = cfg.embedding_dim or d
    proj = emb * d if emb != d else 0  # factorised embeddings: E -> d_model, in every stack
    head = lm_head_weights(cfg)
    if cfg.rtd_head:
        head += d * d + d
    stack = proj + cfg.n_layers * block_weights(cfg)
    if not cfg.is_encoder_decoder:
        return MatmulWeights(encoder=stack, decoder=0, cross_kv=0, head=head)
    n_dec = cfg.decoder_layers
    decoder = proj + n_dec * (block_weights(cfg) + d * q_dim + q_dim * d)
    return MatmulWeights(encoder=stack, decoder=decoder, cross_kv=n_dec * 2 * d * kv_dim, head=head)


def training_flops(cfg: ModelConfig, seq_len: int, target_len: int | None = None) -> float:
    """Training FLOPs (forward + backward) of one sequence of `seq_len` tokens; for an encoder-decoder, of one
    example with `seq_len` source and `target_len` (default: seq_len) target tokens."""
    if seq_len < 0 or (target_len is not None and target_len < 0):
        raise ValueError("sequence lengths must be non-negative")
    w = matmul_weights(cfg)
    d_attn = cfg.n_heads * cfg.dim_head
    S = seq_len
    if not cfg.is_encoder_decoder:
        return S * flops_per_token(w.encoder + w.head, cfg.n_layers, d_attn, S)
    T = seq_len if target_len is None else target_len
    encoder = S * flops_per_token(w.encoder, cfg.n_layers, d_attn, S)
    decoder = T * flops_per_token(w.decoder + w.head, cfg.decoder_layers, d_attn, T + S)  # self + cross scores
    return encoder + decoder + 6.0 * w.cross_kv * S


def model_flops_per_token(cfg: ModelConfig, seq_len: int, target_len: int | None = None) -> float:
    """`training_flops` per token: over the seq_len tokens of a decoder or encoder sequence, over the
    seq_len + target_len tokens of an encoder-decoder example."""
    tokens = seq_len + ((seq_len if target_len is None else target_len) if cfg.is_encoder_decoder else 0)
    return training_flops(cfg, seq_len, target_len) / max(tokens, 1)
