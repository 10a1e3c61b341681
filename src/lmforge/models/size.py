"""A model's parameter count from its config alone, without building it: a config with n_layers=1e6 or
vocab_size=1e12 is sized in microseconds, where building it (even on the meta device, a module per layer) takes
minutes and gigabytes. The count is a lower bound of `Transformer(cfg).num_params()` that misses only the small
terms (biases, norms, relative-position tables, heads other than the LM head), so a size check built on it never
refuses a model that would fit."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.models.config import ModelConfig
from lmforge.models.flops import block_weights


@dataclass(frozen=True)
class ParamEstimate:
    """Parameters of a model by where they are, each with the config fields that set its size."""

    embeddings: int
    """The token embedding (and an untied LM head): vocab_size × the embedding width."""
    positions: int
    """A learned position table: max_seq_len × the embedding width (0 for other position schemes)."""
    blocks: int
    """The transformer blocks' weight matrices (attention, MLP, cross-attention)."""

    @property
    def total(self) -> int:
        return self.embeddings + self.positions + self.blocks

    def largest(self) -> tuple[str, tuple[str, ...]]:
        """The part with the most parameters and the ModelConfig fields that set its size."""
        parts = {
            "embeddings": (self.embeddings, ("vocab_size", "embedding_dim", "d_model")),
            "positions": (self.positions, ("max_seq_len", "embedding_dim", "d_model")),
            "blocks": (
                self.blocks,
                ("n_layers", "n_decoder_layers", "d_model", "d_ff", "n_heads", "head_dim", "mtp_heads"),
            ),
        }
        name = max(parts, key=lambda k: parts[k][0])
        return name, parts[name][1]


def estimate_params(cfg: ModelConfig) -> ParamEstimate:
    """A lower bound of the parameters of `cfg`'s model, by part (see the module docstring)."""
    d, emb = cfg.d_model, cfg.embedding_dim or cfg.d_model
    tables = cfg.vocab_size * emb * (1 if cfg.tie_embeddings or not cfg.lm_head else 2)
    positions = (cfg.max_seq_len + cfg.position_offset) * emb if cfg.position == "learned" else 0
    block = block_weights(cfg)
    blocks = (1 if cfg.share_layers else cfg.n_layers) * block + (emb * d if emb != d else 0)
    if cfg.mtp_heads:  # multi-token prediction: a block (or one d × d layer) a head, sequential ones a 2d → d merge
        linear = cfg.mtp_head == "linear" and not cfg.mtp_sequential
        blocks += cfg.mtp_heads * (d * d if linear else block + (2 * d * d if cfg.mtp_sequential else 0))
    if cfg.is_encoder_decoder:
        q_dim, kv_dim = cfg.n_heads * cfg.dim_head, cfg.kv_heads * cfg.dim_head
        cross = 2 * d * q_dim + 2 * d * kv_dim  # q, o and the key/value projections of cross-attention
        blocks += cfg.decoder_layers * (cross + (0 if cfg.share_encoder_decoder else block))
    return ParamEstimate(tables, positions, blocks)
