"""SpanBERT (Joshi et al. 2020 §3.1): mask contiguous spans of complete words instead of single tokens.

Span lengths (in words) follow Geometric(p = 0.2) truncated at 10 (mean 3.8); 15% of the tokens are masked;
the 80/10/10 replacement is decided per span. No NSP: single contiguous segments (§3.3), i.e. packed windows.

Span boundary objective (§3.2): every token x_i of a masked span (x_s..x_e) is also predicted from the encoder's
outputs at the two boundary tokens x_{s-1}, x_{e+1} and an embedding of its offset i - s in the span, through
two GELU + LayerNorm layers and the (tied) output embeddings. Loss = L_MLM + L_SBO. The boundary head trains
with the encoder and stays in the run's checkpoints; `lmforge.load` returns the encoder."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models import Transformer
from lmforge.models.wrappers import unwrap_model
from lmforge.objectives import masking as M
from lmforge.objectives.base import LossOutput
from lmforge.objectives.mlm import MaskedObjective, MLMOptions, check_rates, mlm_loss
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
    """Static spans: each example masked in dupe_factor fixed ways, chosen in advance, instead of anew every time it
    is seen."""
    dupe_factor: int | None = None
    """With static: the masked copies of each example, epoch e using copy e mod dupe_factor (BERT's
    create_pretraining_data --dupe_factor; mlm's objective.dupe_factor). None = 10; 1 = the same spans all run."""
    sbo: bool = True
    """Add the span boundary objective (§3.2); false = the MLM loss alone."""
    sbo_positions: int = 32
    """Offset embeddings of the boundary head: offsets within a span, in tokens; longer spans share the last."""

    def __post_init__(self) -> None:
        check_rates(self)
        MLMOptions(static=self.static, dupe_factor=self.dupe_factor)  # dupe_factor's rules, as mlm states them
        if self.sbo_positions < 1:
            raise LMForgeError(f"objective.sbo_positions must be at least 1, got {self.sbo_positions}")
        if not 0.0 < self.geometric_p <= 1.0:
            raise LMForgeError(f"objective.geometric_p must be in (0, 1], got {self.geometric_p}")
        if self.max_span < 1:
            raise LMForgeError(f"objective.max_span must be at least 1, got {self.max_span}")


@OBJECTIVES.register("spanbert")
class SpanBERT(MaskedObjective):
    """MLM with span masking over complete words."""

    name = "spanbert"
    Options = SpanBERTOptions
    # lmforge.load(run) returns the backbone: the model section of the run's config describes it
    # (checkpoint/read.py, EXPORT_MODULES)

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        self.length_probs = M.geometric_length_probs(self.options.geometric_p, self.options.max_span)

    def _needs_words(self) -> bool:
        return True  # spans always cover complete words

    def select(self, batch: dict[str, Tensor], cand: Tensor, draws: M.Draws) -> tuple[Tensor, Tensor | None]:
        starts = M.word_starts(batch["input_ids"], cand, self.word_table)
        return M.select_spans(cand, starts, self.options.mask_rate, self.length_probs, draws)

    def span_targets(self, batch: dict[str, Tensor], groups: Tensor | None) -> dict[str, Tensor]:
        if self.options.sbo and groups is not None:
            batch["sbo_left"], batch["sbo_right"], batch["sbo_offset"] = span_boundaries(groups)
        return batch

    def build_model(self, model_cfg) -> nn.Module:
        return SpanBERTModel(model_cfg, self.options.sbo_positions if self.options.sbo else 0)

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        mlm, n, acc, out = mlm_loss(model, batch)
        head = getattr(unwrap_model(model), "sbo", None)  # a bare encoder: the MLM loss alone
        if head is None or "sbo_left" not in batch:
            return LossOutput(mlm, n, {"mlm_acc": acc})
        T = batch["labels"].shape[1]
        index = M.labelled_index(batch["labels"], batch)
        rows, cols = index // T, index % T  # the N predicted tokens, in the order mlm_loss takes them
        h = out.last_hidden_state
        left, right = h[rows, batch["sbo_left"][rows, cols]], h[rows, batch["sbo_right"][rows, cols]]
        logits = head(left, right, batch["sbo_offset"][rows, cols], unwrap_model(model).backbone.tok_emb.weight)
        target = batch["labels"].flatten().index_select(0, index)
        sbo = F.cross_entropy(logits.float(), target) if index.numel() else logits.sum() * 0.0
        return LossOutput(mlm + sbo, n, {"mlm_acc": acc, "mlm_loss": mlm.detach(), "sbo_loss": sbo.detach()})


def span_boundaries(span: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per token of a span (span ids (B, L), -1 = none): the positions just before its span's first token and
    just after its last one (clamped to the row), and its offset from the first token; 0 outside spans."""
    B, L = span.shape
    sel = span >= 0
    ids = span.clamp(min=0)
    S = int(ids.max()) + 1 if sel.any() else 1
    pos = torch.arange(L, device=span.device).expand(B, L)
    first = torch.full((B, S), L, device=span.device).scatter_reduce(1, ids, torch.where(sel, pos, L), "amin")
    last = torch.full((B, S), -1, device=span.device).scatter_reduce(1, ids, torch.where(sel, pos, -1), "amax")
    f, e = first.gather(1, ids), last.gather(1, ids)  # (B, L)
    zero = torch.zeros_like(span)
    left = torch.where(sel, (f - 1).clamp(min=0), zero)
    right = torch.where(sel, (e + 1).clamp(max=L - 1), zero)
    return left, right, torch.where(sel, pos - f, zero)


class BoundaryHead(nn.Module):
    """y_i = LN(GELU(W2 · LN(GELU(W1 · [h_{s-1}; h_{e+1}; p_{i-s}])))), scored against the output embeddings."""

    def __init__(self, d_model: int, emb_dim: int, positions: int, vocab: int, eps: float) -> None:
        super().__init__()
        self.positions = nn.Embedding(positions, d_model)
        self.fc1, self.norm1 = nn.Linear(3 * d_model, d_model), nn.LayerNorm(d_model, eps=eps)
        self.fc2, self.norm2 = nn.Linear(d_model, emb_dim), nn.LayerNorm(emb_dim, eps=eps)
        self.bias = nn.Parameter(torch.zeros(vocab))
        nn.init.normal_(self.positions.weight, std=0.02)

    def forward(self, left: Tensor, right: Tensor, offset: Tensor, embeddings: Tensor) -> Tensor:
        """left, right: (N, d) boundary states; offset: (N,); embeddings (V, E) → (N, V) logits."""
        p = self.positions(offset.clamp(max=self.positions.num_embeddings - 1))
        y = self.norm1(F.gelu(self.fc1(torch.cat([left, right, p], -1))))
        y = self.norm2(F.gelu(self.fc2(y)))
        return F.linear(y, embeddings, self.bias)


class SpanBERTModel(nn.Module):
    """The encoder (`backbone`) and, with SBO, its boundary head (`sbo`); calls and `logits` go to the encoder."""

    def __init__(self, cfg, positions: int) -> None:
        super().__init__()
        self.backbone = Transformer(cfg)
        self.config = cfg
        emb = cfg.embedding_dim or cfg.d_model
        self.sbo = BoundaryHead(cfg.d_model, emb, positions, cfg.vocab_size, cfg.norm_eps) if positions else None

    def forward(self, *args, **kwargs):
        return self.backbone(*args, **kwargs)

    def logits(self, h: Tensor) -> Tensor:
        return self.backbone.logits(h)

    def num_params(self, non_embedding: bool = False) -> int:
        extra = sum(p.numel() for p in self.sbo.parameters()) if self.sbo is not None else 0
        return self.backbone.num_params(non_embedding) + extra
