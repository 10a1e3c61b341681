"""The one model config: every architectural variant of the three families is a typed field here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Arch = Literal["decoder", "encoder", "encoder-decoder"]
Norm = Literal["layernorm", "rmsnorm"]
Activation = Literal["gelu", "gelu_tanh", "relu", "silu", "swiglu", "geglu"]
Position = Literal["learned", "sinusoidal", "rope", "alibi", "t5_bias", "shaw", "none"]
MaskKind = Literal["causal", "bidirectional", "prefix"]


@dataclass
class ModelConfig:
    """Architecture of a transformer language model (decoder, encoder or encoder-decoder)."""

    name: str = "custom"
    """Preset name this config came from (informational)."""
    arch: Arch = "decoder"
    """decoder: one causal (or prefix-LM) stack; encoder: one bidirectional stack; encoder-decoder: two stacks."""
    vocab_size: int = 50257
    d_model: int = 768
    n_layers: int = 12
    """Layers of the (encoder) stack."""
    n_decoder_layers: int | None = None
    """Decoder layers of an encoder-decoder (None = n_layers)."""
    n_heads: int = 12
    n_kv_heads: int | None = None
    """Key/value heads for grouped-query attention (None = n_heads, i.e. multi-head attention)."""
    head_dim: int | None = None
    """Per-head width (None = d_model // n_heads; T5 sets it independently)."""
    d_ff: int = 3072
    max_seq_len: int = 1024
    norm: Norm = "layernorm"
    norm_eps: float = 1e-5
    norm_position: Literal["pre", "post"] = "pre"
    """pre-LN (GPT-2, T5, Llama) normalises sublayer inputs; post-LN (GPT-1, BERT, BART) normalises residual sums."""
    final_norm: bool = True
    """Norm after the last block (pre-LN stacks need one)."""
    embedding_norm: bool = False
    """Norm over the summed embeddings (BERT, BART)."""
    activation: Activation = "gelu_tanh"
    position: Position = "learned"
    position_offset: int = 0
    """Index shift of learned positions (BART's learned positions start at row 2)."""
    rope_base: float = 10000.0
    rel_buckets: int = 32
    """T5 relative-attention buckets."""
    rel_max_distance: int = 128
    """T5 bucket max distance, and Shaw et al.'s clipping distance for position='shaw'."""
    bias: bool = True
    """Biases in attention and MLP projections (False for T5 and Llama)."""
    tie_embeddings: bool = True
    """LM head shares the token embedding matrix."""
    mask: MaskKind = "causal"
    """Self-attention mask of a decoder-only stack: causal, or prefix-LM (fully visible prefix, causal rest)."""
    type_vocab_size: int = 0
    """Segment (token type) embeddings, BERT's sentence A/B (0 = none)."""
    embedding_dim: int | None = None
    """ALBERT's factorised embedding size E (None = d_model); an E→d_model projection follows the embeddings."""
    share_layers: bool = False
    """ALBERT cross-layer parameter sharing: one block's weights reused n_layers times."""
    share_encoder_decoder: bool = False
    """T5 'Enc-dec, shared': the decoder reuses the encoder's self-attention and MLP weights."""
    scale_embeddings: bool = False
    """Multiply token embeddings by sqrt(d_model) (Vaswani et al. §3.4)."""
    scale_attention: bool = True
    """Scale logits by 1/sqrt(head_dim); T5 folds that into its initialisation instead."""
    lm_head: bool = True
    lm_head_transform: bool = False
    """BERT/RoBERTa/ELECTRA MLM head: dense + activation + norm before the vocabulary projection."""
    lm_head_bias: bool = False
    scale_tied_logits: bool = False
    """T5 (v1.0) rescales the decoder output by d_model**-0.5 when the LM head is tied."""
    pooler: bool = False
    """BERT pooler: dense + tanh over the first token."""
    pad_id: int = 0
    decoder_start_id: int = 0
    """First decoder input of an encoder-decoder (T5: pad, BART: </s>)."""
    dropout: float = 0.0
    attn_dropout: float = 0.0
    init_std: float = 0.02

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers

    @property
    def gated(self) -> bool:
        return self.activation in ("swiglu", "geglu")

    def validate(self) -> None:
        """Raise LMForgeError for inconsistent fields."""
        from lmforge.errors import LMForgeError

        if self.head_dim is None and self.d_model % self.n_heads:
            raise LMForgeError(f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise LMForgeError(f"model.n_heads={self.n_heads} is not a multiple of model.n_kv_heads={self.kv_heads}")
        if self.position == "rope" and self.dim_head % 2:
            raise LMForgeError("rope needs an even head dimension")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise LMForgeError(f"model.{name} must be positive, got {getattr(self, name)}")
