"""SpanBERT (Joshi et al. 2020 §3.1): mask contiguous spans of complete words instead of single tokens.

Span lengths (in words) follow Geometric(p = 0.2) truncated at 10 (mean 3.8); 15% of the tokens are masked;
the 80/10/10 replacement is decided per span. No NSP: single contiguous segments (§3.3), i.e. packed windows.
The span-boundary objective (§3.2) is not implemented: the loss is the MLM loss."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.objectives import masking as M
from lmforge.objectives.mlm import MaskedObjective, check_rates
from lmforge.registry import OBJECTIVES


@dataclass
class SpanBERTOptions:
    mask_rate: float = 0.15
    """Fraction of the tokens masked (the budget spans are drawn against)."""
    mask_frac: float = 0.8
    """Fraction of spans whose tokens all become [MASK]."""
    random_frac: float = 0.1
    """Fraction of spans whose tokens all become random tokens; the other spans stay unchanged."""
    geometric_p: float = 0.2
    """p of the span-length distribution Geo(p) (lengths in words)."""
    max_span: int = 10
    """Longest span in words (the distribution is truncated and renormalised)."""
    static: bool = False
    """Same spans for an example every epoch instead of new ones."""

    def __post_init__(self) -> None:
        check_rates(self)
        if not 0.0 < self.geometric_p <= 1.0:
            raise LMForgeError(f"objective.geometric_p must be in (0, 1], got {self.geometric_p}")
        if self.max_span < 1:
            raise LMForgeError(f"objective.max_span must be at least 1, got {self.max_span}")


@OBJECTIVES.register("spanbert")
class SpanBERT(MaskedObjective):
    """MLM with span masking over complete words."""

    name = "spanbert"
    Options = SpanBERTOptions

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        self.length_probs = M.geometric_length_probs(self.options.geometric_p, self.options.max_span)

    def _needs_words(self) -> bool:
        return True  # spans always cover complete words

    def select(self, batch: dict[str, Tensor], cand: Tensor, draws: M.Draws) -> tuple[Tensor, Tensor | None]:
        starts = M.word_starts(batch["input_ids"], cand, self.word_table)
        return M.select_spans(cand, starts, self.options.mask_rate, self.length_probs, draws)
