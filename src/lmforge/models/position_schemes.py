"""What each position scheme is, as facts code outside the model reads instead of comparing `model.position` to a
string: one `PositionScheme` per value of `ModelConfig.position`, in `POSITION_SCHEMES`.

The modules that compute the encodings live in models/positions.py and each scheme's part of a stack (its
`Positions` component) in models/position_components.py; this table holds no tensors, so a config can answer these
questions without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["POSITION_SCHEMES", "PositionScheme"]


@dataclass(frozen=True)
class PositionScheme:
    """The facts of one position scheme (one row of `POSITION_SCHEMES`)."""

    name: str
    """The `model.position` value."""
    learned_table: bool = False
    """Learned absolute rows [0, max_seq_len) added to the embeddings: positions end at max_seq_len."""
    absolute_table: bool = False
    """An absolute per-position vector is added to the embeddings (a learned or a fixed sinusoid table)."""
    rotary: bool = False
    """Queries and keys are rotated by their position (RoPE)."""
    per_head_bias: bool = False
    """A per-head additive attention bias over relative distances (ALiBi slopes, T5 buckets): it is sized by the
    number of heads, so heads cannot be removed."""
    per_token: bool = False
    """Each token's encoding depends on its own position id alone (absolute tables, rotary, none), so a shortened
    input whose tokens keep their original position ids still tells the model where each token sits."""
    recurrent: bool = False
    """Transformer-XL relative attention (Dai et al. 2019): segments can carry memory, and the stack's blocks keep
    their own relative-attention parameters."""
    config_fields: tuple[str, ...] = ()
    """The `ModelConfig` fields that matter under this scheme and are ignored under the others that do not list them
    (RoPE's base; T5's buckets; the distance T5's and Shaw's tables clip at; Shaw's value vectors): a config's
    canonical form (models/hf/base.py) drops the ones its scheme does not list. Transformer-XL lists none."""

    def max_positions(self, max_seq_len: int) -> int | None:
        """How many positions a model of this scheme can encode (its learned table's length), None when unbounded."""
        return max_seq_len if self.learned_table else None


POSITION_SCHEMES: dict[str, PositionScheme] = {
    s.name: s
    for s in (
        PositionScheme("learned", learned_table=True, absolute_table=True, per_token=True),
        PositionScheme("sinusoidal", absolute_table=True, per_token=True),
        PositionScheme("rope", rotary=True, per_token=True, config_fields=("rope_base",)),
        PositionScheme("alibi", per_head_bias=True),
        PositionScheme("t5_bias", per_head_bias=True, config_fields=("rel_buckets", "rel_max_distance")),
        PositionScheme("shaw", config_fields=("rel_max_distance", "shaw_values")),
        PositionScheme("xl", recurrent=True),
        PositionScheme("none", per_token=True),
    )
}
"""Every value of `ModelConfig.position`, in the order of its `Position` literal."""
