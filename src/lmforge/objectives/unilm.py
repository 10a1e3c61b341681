"""UniLM pre-training (Dong et al. 2019 §2-3): one bidirectional transformer trained with cloze tasks under four
self-attention masks, mixed within each batch (§2.4: 1/3 bidirectional, 1/3 sequence-to-sequence, 1/6
left-to-right, 1/6 right-to-left).

Inputs are BERT's segment pairs "[SOS] A [EOS] B [EOS]" ([CLS] and [SEP] play [SOS] and [EOS]). Each example gets a
kind; the model receives it as `attn_kind` (models/masks.py), with the source length "[SOS] A [EOS]" as `prefix_len`
for seq2seq rows (source tokens see the source, target tokens the source and the target up to themselves). 15% of
the tokens of both segments are predicted, 80% of them replaced by [MASK], 10% by a random token, 10% unchanged;
80% of the masked units are single tokens, 20% bigrams or trigrams (§2.4). Segment embeddings double as the LM
identifier (§2.1): bidirectional rows use 0/1 for A/B, left-to-right 2, right-to-left 3, seq2seq 4/5 for source /
target (the released UniLM's six segment types). Bidirectional rows also train next-sentence prediction (§2.3);
the other kinds always read the true continuation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models.lm_head import cross_entropy
from lmforge.models.masks import ATTENTION_KINDS, by_kind
from lmforge.models.wrappers import unwrap_model
from lmforge.objectives import masking as M
from lmforge.objectives.base import LossOutput, Objective
from lmforge.objectives.mlm import MaskedObjective, MLMOptions
from lmforge.objectives.sentence_data import SentencePairLoader, sentence_end_ids
from lmforge.registry import OBJECTIVES

LM_SEGMENTS = 6
"""Segment types with objective.lm_segments: A/B of bidirectional rows, left-to-right, right-to-left, source/target."""
KIND_SEGMENTS = torch.tensor(
    [
        # first segment id, 1 where the A/B (source/target) id 0/1 is added to it
        [0, 1],  # bidirectional: A/B 0/1
        [2, 0],  # left_to_right
        [3, 0],  # right_to_left
        [4, 1],  # seq2seq: source/target 4/5
    ]
)
"""The segment ids of each attention kind (row, by code) with objective.lm_segments."""
NSP_KINDS = torch.tensor([True, False, False, False])
"""Per attention kind (by code): whether its rows train next-sentence prediction, and so may get a NotNext B."""


@dataclass
class UniLMOptions(MLMOptions):
    """Options of the UniLM objective; the four proportions must sum to 1."""

    bidirectional: float = 1 / 3
    seq2seq: float = 1 / 3
    left_to_right: float = 1 / 6
    right_to_left: float = 1 / 6
    mix: Literal["example", "batch"] = "example"
    """example: each example draws its kind ("within one training batch", §2.4); batch: one kind per batch."""
    span_frac: float = 0.2
    """Fraction of the masked units that are bigrams or trigrams (half each); the rest are single tokens."""
    nsp: bool = True
    """Next-sentence prediction on the bidirectional rows (needs model.pooler and model.nsp_head)."""
    lm_segments: bool = True
    """Segment ids name the LM kind (6 types, model.type_vocab_size >= 6); false: BERT's A/B ids for every kind."""

    def __post_init__(self) -> None:
        super().__post_init__()
        probs = self.kind_probs()
        if any(p < 0 for p in probs) or abs(sum(probs) - 1.0) > 1e-6:
            raise LMForgeError(
                "objective.bidirectional, seq2seq, left_to_right and right_to_left are proportions: each >= 0, "
                f"summing to 1 (got {', '.join(f'{p:g}' for p in probs)})"
            )
        if not 0.0 <= self.span_frac <= 1.0:
            raise LMForgeError(f"objective.span_frac must be between 0 and 1, got {self.span_frac}")
        if self.span_frac and self.ngram:
            raise LMForgeError("objective.span_frac and objective.ngram are two n-gram maskings: set one to 0")

    def kind_probs(self) -> list[float]:
        """Proportions in ATTENTION_KINDS order."""
        return [self.bidirectional, self.left_to_right, self.right_to_left, self.seq2seq]


class UniLMLoader(SentencePairLoader):
    """SentencePairLoader's "[CLS] A [SEP] B [SEP]" pairs with an attention kind per row (`attn_kind`) and the
    source length "[CLS] A [SEP]" (`prefix_len`). Kinds are drawn with the pair's other random choices (from the
    global batch's generator), so they resume exactly and do not depend on the world size. Only bidirectional rows
    may get a NotNext segment."""

    def __init__(self, *args, kind_probs: list[float], per_batch: bool, nsp: bool, **kw) -> None:
        self.cdf = np.cumsum(kind_probs)
        self.per_batch, self.nsp = per_batch, nsp
        # Without NSP no row gets a negative; the "sop" pairing then only skips the 2-document check of NSP negatives.
        super().__init__(*args, task="nsp" if nsp else "sop", **kw)

    def examples(self, chunks: np.ndarray, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        n = len(chunks)
        u = rng.random(1 if self.per_batch else n)
        kinds = np.minimum(np.searchsorted(self.cdf, u, side="right"), len(self.cdf) - 1)
        kinds = np.broadcast_to(kinds, (n,)).astype(np.int64)
        batch = self.pairs(chunks, rng, negatives=NSP_KINDS.numpy()[kinds] if self.nsp else np.zeros(n, bool))
        real = batch["attention_mask"].bool()
        batch["attn_kind"] = torch.from_numpy(kinds)
        batch["prefix_len"] = ((batch["token_type_ids"] == 0) & real).sum(1)  # [CLS] A [SEP]
        return batch


def lm_segment_ids(token_type_ids: Tensor, attn_kind: Tensor) -> Tensor:
    """UniLM's segment ids (§2.1, the LM identifier): A/B 0/1 (bidirectional), 2 (left-to-right), 3 (right-to-left),
    source/target 4/5 (seq2seq)."""
    first, ab = by_kind(KIND_SEGMENTS, attn_kind).to(token_type_ids)[:, None].unbind(-1)  # (B, 1)
    return first + ab * token_type_ids


@OBJECTIVES.register("unilm")
class UniLM(MaskedObjective):
    """Cloze tasks under a per-example mixture of bidirectional, left-to-right, right-to-left and seq2seq masks,
    plus NSP on the bidirectional rows; loss = mean cloze cross-entropy + NSP."""

    name = "unilm"
    Options = UniLMOptions

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        if self.pad_id is None or self.cls_id is None or self.sep_id is None:
            raise LMForgeError(
                "objective 'unilm' needs a tokenizer with distinct [CLS], [SEP] and [PAD] tokens "
                "(data.tokenizer_family: bert or bart)"
            )
        if not cfg.model.is_encoder:
            raise LMForgeError(f"objective 'unilm' trains one bidirectional encoder, got model.arch='{cfg.model.arch}'")
        self.span_probs = None
        if self.options.span_frac:
            f = self.options.span_frac
            self.span_probs = torch.tensor([1 - f, f / 2, f / 2], dtype=torch.float64)

    def build_model(self, model_cfg) -> nn.Module:
        o = self.options
        need = LM_SEGMENTS if o.lm_segments else 2
        if model_cfg.type_vocab_size < need:
            raise LMForgeError(
                f"objective 'unilm' uses {need} segment types (objective.lm_segments={str(o.lm_segments).lower()}): "
                f"set model.type_vocab_size to at least {need}, got {model_cfg.type_vocab_size}"
            )
        if o.nsp and not (model_cfg.pooler and model_cfg.nsp_head):
            raise LMForgeError(
                "objective 'unilm' trains next-sentence prediction on its bidirectional rows: the model needs "
                "model.pooler=true and model.nsp_head=true (or objective.nsp=false)"
            )
        return Objective.build_model(self, model_cfg)

    def make_loader(self, data_dir, split: str, *, rank: int = 0, world_size: int = 1) -> UniLMLoader:
        t, o = self.cfg.train, self.options
        return UniLMLoader(
            data_dir, split, t.seq_len, t.batch_size, rank=rank, world_size=world_size, seed=self.cfg.run.seed,
            end_ids=sentence_end_ids(self.tokenizer), cls_id=self.cls_id, sep_id=self.sep_id, pad_id=self.pad_id,
            kind_probs=o.kind_probs(), per_batch=o.mix == "batch", nsp=o.nsp,
        )  # fmt: skip

    # --- data path ------------------------------------------------------------------------------------------

    def inputs(self, tokens) -> dict[str, Tensor]:
        if not isinstance(tokens, dict) or "attn_kind" not in tokens:
            raise LMForgeError("objective 'unilm' reads segment pairs with attention kinds from its own loader")
        batch = dict(tokens)
        if self.options.lm_segments:
            batch["token_type_ids"] = lm_segment_ids(batch["token_type_ids"], batch["attn_kind"])
        return batch

    def select(self, batch: dict[str, Tensor], cand: Tensor, draws: M.Draws) -> tuple[Tensor, Tensor | None]:
        """Units of 1 token (1 - span_frac) or 2-3 tokens (span_frac, half each) covering mask_rate of the tokens;
        the 80/10/10 replacement is decided per token."""
        if self.span_probs is None:
            return super().select(batch, cand, draws)
        starts = M.word_starts(batch["input_ids"], cand, self.word_table)
        selected, _ = M.select_spans(cand, starts, self.options.mask_rate, self.span_probs, draws)
        return selected, None

    # --- loss -----------------------------------------------------------------------------------------------

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        kind = batch["attn_kind"]
        out = model(
            batch["input_ids"], batch.get("attention_mask"), token_type_ids=batch.get("token_type_ids"),
            attn_kind=kind, prefix_len=batch["prefix_len"], return_logits=False,
        )  # fmt: skip
        labels = batch["labels"]
        # The cloze positions come with the batch (`mlm_index`, found on the CPU): nothing here waits for the device.
        index = M.labelled_index(labels, batch)
        n = index.numel()
        h = out.last_hidden_state.flatten(0, 1).index_select(0, index)
        logits = unwrap_model(model).logits(h)  # (N, V): the head on the cloze positions only
        target = labels.flatten().index_select(0, index)
        cloze = cross_entropy(logits, target) if n else logits.sum() * 0.0
        position_kind = kind[:, None].expand_as(labels).flatten().index_select(0, index)
        metrics = self._kind_metrics(logits.detach(), target, position_kind) if n else {}
        total = cloze
        if self.options.nsp:
            nsp, nsp_metrics = self._nsp(out.nsp_logits, batch["sentence_label"], by_kind(NSP_KINDS, kind))
            total, metrics = total + nsp, {**metrics, **nsp_metrics, "mlm_loss": cloze.detach()}
        for extra in (out.pooled, out.nsp_logits, out.rtd_logits):  # unused heads join the graph (DDP)
            if extra is not None:
                total = total + 0.0 * extra.sum()
        return LossOutput(total, n, metrics)

    @staticmethod
    def _kind_metrics(logits: Tensor, target: Tensor, position_kind: Tensor) -> dict[str, Tensor]:
        """Cloze accuracy overall and cross-entropy per attention kind, as tensors the loop reads on log steps; a
        kind none of whose tokens the batch masked gets NaN (logged as null)."""
        with torch.no_grad():
            nll = F.cross_entropy(logits.float(), target, reduction="none")
            k = len(ATTENTION_KINDS)
            sums = torch.zeros(k, device=nll.device).index_add_(0, position_kind, nll)
            counts = torch.zeros(k, device=nll.device).index_add_(0, position_kind, torch.ones_like(nll))
            per_kind = sums / counts
            out = {"mlm_acc": (logits.argmax(-1) == target).float().mean()}
        out.update({f"loss_{name}": per_kind[i] for i, name in enumerate(ATTENTION_KINDS)})
        return out

    @staticmethod
    def _nsp(logits: Tensor, label: Tensor, rows: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """NSP cross-entropy over the bidirectional rows, weighted rather than selected (a boolean selection would
        wait for the device): zero, in the graph, when a batch has none, and then NaN metrics (logged as null)."""
        weight = rows.float()
        count = weight.sum()
        logits = logits.float()
        nll = F.cross_entropy(logits, label, reduction="none")
        total = (nll * weight).sum()
        acc = ((logits.argmax(-1) == label).float() * weight).sum() / count
        return total / count.clamp(min=1.0), {"nsp_loss": total.detach() / count, "nsp_acc": acc}
