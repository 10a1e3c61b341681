"""Position schemes as components of a stack: one `Positions` class per value of `ModelConfig.position`, in
`POSITIONS`. A stack builds its scheme's component once (`build_positions`) and calls its hooks; its attention layers
take the per-layer modules the scheme contributes (`Positions.layer_modules`). Neither compares `position` to a
string.

The facts of each scheme (no tensors) live in models/position_schemes.py, the encodings' building blocks in
models/positions.py and Transformer-XL's relative attention in models/relative.py. Components keep the module
names checkpoints and the Hugging Face converters use: a learned table is the stack's `pos_emb`, T5's bias table its
`rel_bias`, and the per-layer modules are the attention layer's `rope`, `shaw` and `rel`."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from lmforge.models.config import MaskKind, ModelConfig
from lmforge.models.masks import MASK_RULES
from lmforge.models.position_schemes import POSITION_SCHEMES, PositionScheme
from lmforge.models.positions import (
    LearnedPositions,
    RotaryEmbedding,
    ShawRelativePosition,
    T5RelativeBias,
    alibi_bias,
    alibi_slopes,
    sinusoidal_embedding,
)
from lmforge.models.relative import XLRelative

__all__ = [
    "POSITIONS",
    "Alibi",
    "LearnedTable",
    "NoPositions",
    "Positions",
    "Rotary",
    "ShawRelative",
    "Sinusoidal",
    "T5Bias",
    "XLRelativePositions",
    "build_positions",
]


class Positions(nn.Module):
    """What one position scheme contributes to a stack. The defaults contribute nothing: embeddings pass through,
    attention gets no bias and no per-layer module."""

    name: ClassVar[str]
    """The `ModelConfig.position` value (the key in `POSITIONS`)."""
    scheme: ClassVar[PositionScheme]
    """The scheme's facts (models/position_schemes.py), set on registration."""
    attr: ClassVar[str] = "positions"
    """The name the stack registers the component under: the one its parameters' state-dict keys start with."""
    explicit_mask: ClassVar[bool] = False
    """The attention layers add position scores to the mask themselves, so causality must be in that mask:
    SDPA's built-in causal path (no mask) cannot serve the stack."""

    @classmethod
    def build(cls, cfg: ModelConfig, kind: MaskKind) -> Positions:
        """The component of a stack of mask `kind` in a model of `cfg`."""
        return cls()

    @classmethod
    def layer_modules(cls, cfg: ModelConfig) -> dict[str, nn.Module]:
        """The modules one self-attention layer owns for this scheme, by attribute name."""
        return {}

    def max_positions(self, cfg: ModelConfig) -> int | None:
        """How many positions the stack can encode, None when unbounded."""
        return self.scheme.max_positions(cfg.max_seq_len)

    def embed(self, x: Tensor, positions: Tensor | None) -> Tensor:
        """Token embeddings x (B, T, E) with absolute positions (T,) or (B, T) added (x itself: no table)."""
        return x

    def attention_bias(
        self, query_index: Tensor, key_index: Tensor, q_offset: int | Tensor, causal: bool
    ) -> Tensor | None:
        """Additive self-attention bias (1, H, Tq, Tk) for queries at query_index (Tq,) (the first at q_offset)
        over keys at key_index (Tk,); causal: future keys are masked too. None: no bias."""
        return None

    def step_bias(self, slot: Tensor, key_index: Tensor) -> Tensor | None:
        """The bias (1, H, 1, L) of one static-cache decoding step: the query at `slot` (1,) over every cache slot
        key_index (L,), later slots masked."""
        return self.attention_bias(slot, key_index, slot, causal=True)


POSITIONS: dict[str, type[Positions]] = {}
"""Every value of `ModelConfig.position` -> its component class."""


def _register(cls: type[Positions]) -> type[Positions]:
    cls.scheme = POSITION_SCHEMES[cls.name]
    POSITIONS[cls.name] = cls
    return cls


def build_positions(cfg: ModelConfig, kind: MaskKind) -> Positions:
    """The position component of one stack (mask `kind`) of a model of `cfg`."""
    return POSITIONS[cfg.position].build(cfg, kind)


@_register
class LearnedTable(LearnedPositions, Positions):
    """Learned absolute rows (GPT-2, BERT), the first `offset` of them reserved (BART/OPT's offset of 2)."""

    name = "learned"
    attr = "pos_emb"

    def __init__(self, max_seq_len: int, d_model: int, offset: int = 0) -> None:
        super().__init__(max_seq_len, d_model)
        self.offset = offset

    @classmethod
    def build(cls, cfg: ModelConfig, kind: MaskKind) -> LearnedTable:
        return cls(cfg.max_seq_len + cfg.position_offset, cfg.embedding_dim or cfg.d_model, cfg.position_offset)

    def embed(self, x: Tensor, positions: Tensor | None) -> Tensor:
        return x + self(positions + self.offset)


@_register
class Sinusoidal(Positions):
    """Fixed sinusoids added to the embeddings (Vaswani et al. 2017 §3.5): no table, no maximum length."""

    name = "sinusoidal"

    def embed(self, x: Tensor, positions: Tensor | None) -> Tensor:
        return x + sinusoidal_embedding(positions, x.shape[-1]).to(x.dtype)


@_register
class Rotary(Positions):
    """RoPE: each self-attention layer rotates its queries and keys (its `rope` module)."""

    name = "rope"

    @classmethod
    def layer_modules(cls, cfg: ModelConfig) -> dict[str, nn.Module]:
        return {"rope": RotaryEmbedding(cfg.dim_head, base=cfg.rope_base)}


@_register
class Alibi(Positions):
    """ALiBi's per-head linear distance penalty (Press et al. 2022)."""

    name = "alibi"
    slopes: Tensor

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        # Non-persistent: derived from n_heads, so kept out of checkpoints.
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    @classmethod
    def build(cls, cfg: ModelConfig, kind: MaskKind) -> Alibi:
        return cls(cfg.n_heads)

    def attention_bias(
        self, query_index: Tensor, key_index: Tensor, q_offset: int | Tensor, causal: bool
    ) -> Tensor | None:
        return alibi_bias(self.slopes, query_index, key_index, causal)[None]


@_register
class T5Bias(T5RelativeBias, Positions):
    """T5's learned per-head bias over bucketed relative positions: one table per stack, computed once per forward
    and shared by every layer (as T5's layer 0 does). Bidirectional in an encoder stack, causal buckets otherwise."""

    name = "t5_bias"
    attr = "rel_bias"

    @classmethod
    def build(cls, cfg: ModelConfig, kind: MaskKind) -> T5Bias:
        return cls(cfg.n_heads, cfg.rel_buckets, cfg.rel_max_distance, bidirectional=MASK_RULES[kind].future)

    def attention_bias(
        self, query_index: Tensor, key_index: Tensor, q_offset: int | Tensor, causal: bool
    ) -> Tensor | None:
        # Future keys of a causal stack are masked by the stack's mask; the buckets depend on `bidirectional` alone.
        return self(query_index.shape[0], key_index.shape[0], q_offset=q_offset)  # (1, H, Tq, Tk)


@_register
class ShawRelative(Positions):
    """Shaw et al. 2018 relative keys (and values): each self-attention layer owns its tables (its `shaw` module)
    and adds their scores to the mask."""

    name = "shaw"
    explicit_mask = True

    @classmethod
    def layer_modules(cls, cfg: ModelConfig) -> dict[str, nn.Module]:
        return {"shaw": ShawRelativePosition(cfg.dim_head, cfg.rel_max_distance, values=cfg.shaw_values)}


@_register
class XLRelativePositions(Positions):
    """Transformer-XL / XLNet relative attention: each layer owns its parameters (its `rel` module), run by
    models/recurrence.py."""

    name = "xl"

    @classmethod
    def layer_modules(cls, cfg: ModelConfig) -> dict[str, nn.Module]:
        return {"rel": XLRelative(cfg.d_model, cfg.n_heads, cfg.dim_head, cfg.rel_segments, cfg.init_std)}


@_register
class NoPositions(Positions):
    """No positional encoding (NoPE): causal masking alone tells a decoder where tokens sit."""

    name = "none"
