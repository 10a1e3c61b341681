"""BART denoising (Lewis et al. 2020 §2.2): corrupt the text, let the encoder read it and the decoder rebuild it.

Noising functions (any combination): token masking, token deletion, text infilling (Poisson(λ) span lengths, one
<mask> per span, 0-length spans insert a <mask>), sentence permutation and document rotation. They run in fairseq's
DenoisingDataset order: permute sentences → mask/delete tokens and infill spans → rotate. The decoder is teacher-
forced on the original window (labels = the first seq_len tokens of each packed window)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput, Objective
from lmforge.objectives.rng import rng, with_fixed_noise
from lmforge.objectives.seq2seq import (
    check_seq2seq_model,
    lengths_mask,
    ordinary_ids,
    random_tokens,
    scatter_rows,
    seq2seq_batch,
    seq2seq_loss,
)
from lmforge.registry import OBJECTIVES

# A token ends a sentence when its text, closing quotes and brackets aside, ends with one of these.
SENTENCE_FINAL = (".", "!", "?")
CLOSERS = "\"')]}»”’"


@dataclass
class BartOptions:
    """Rates are fractions of the tokens of each window. Defaults: BART-large's final objective (§5.1: text
    infilling of 30% of tokens + permutation of all sentences)."""

    mask_rate: float = 0.0
    """Token masking: each token independently becomes <mask> (BERT-style, no random/keep split)."""
    delete_rate: float = 0.0
    """Token deletion: each token independently is removed (the model must find where input is missing)."""
    infill_rate: float = 0.3
    """Text infilling: the fraction of tokens covered by spans; each span becomes one <mask>. Spans override
    token masking/deletion of the tokens they cover."""
    poisson_lambda: float = 3.0
    """Mean span length of text infilling (span lengths ~ Poisson(λ); 0-length spans insert a <mask>)."""
    random_rate: float = 0.0
    """Fraction of the <mask> tokens in the source replaced by a random token (fairseq's --mask-random)."""
    permute: bool = True
    """Sentence permutation: shuffle the sentences (split after sentence-final tokens and EOS) of each window."""
    rotate: bool = False
    """Document rotation: rotate the noised source to start at a uniformly chosen token."""


@dataclass
class Spans:
    """Text-infilling spans of a batch, in left-to-right order per row; K spans per row at most."""

    start: Tensor
    """(B, K) index into the original row where the span begins (a 0-length span inserts before it; 0..L)."""
    length: Tensor
    """(B, K) tokens the span covers."""
    valid: Tensor
    """(B, K) bool; the valid spans of a row are a prefix of its K slots."""


def poisson_spans(batch: int, length: int, n_noise: int, lam: float) -> Spans:
    """Non-overlapping spans covering exactly n_noise of `length` tokens, lengths ~ Poisson(λ) (BART §2.2).

    Like fairseq: draw Poisson lengths until they sum to n_noise (the last one trimmed), then place the spans at
    uniformly random points among the n - n_noise clean tokens (spans may touch; 0-length spans are insertions)."""
    if n_noise <= 0:
        empty = torch.zeros(batch, 0, dtype=torch.long)
        return Spans(empty, empty, empty.bool())
    k = max(8, math.ceil(2 * n_noise / lam) + 8)  # enough draws to reach n_noise in all but freak rows
    draws = torch.poisson(torch.full((batch, k), float(lam)), generator=rng()).long()  # (B, K)
    before = draws.cumsum(1) - draws  # tokens covered by the earlier spans
    valid = before < n_noise
    span_len = torch.where(valid, torch.minimum(draws, n_noise - before), 0)
    # A row whose K draws fall short of n_noise (all K valid) stretches its last span to make up the rest.
    span_len[:, -1] += n_noise - span_len.sum(1)
    n_clean = length - n_noise
    # Span j goes before clean token gap[j]; sorted gaps keep the spans in order and apart.
    gap = torch.randint(0, n_clean + 1, (batch, k), generator=rng()).masked_fill(~valid, n_clean + 1).sort(1).values
    start = gap + span_len.cumsum(1) - span_len
    return Spans(start, span_len, valid)


def infill(vals: Tensor, keep: Tensor, spans: Spans, mask_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Apply spans to a row state: the first token of a covered span becomes <mask>, the rest are dropped.

    vals, keep (B, L) → new vals, keep and inserts (B, L + 1): <mask> tokens to insert before each position."""
    B, L = vals.shape
    cover = spans.valid & (spans.length > 0)
    at = spans.start.clamp(max=L)
    delta = torch.zeros(B, L + 1, dtype=torch.long)
    delta.scatter_add_(1, at, cover.long())
    delta.scatter_add_(1, (spans.start + spans.length).clamp(max=L), -cover.long())
    noise = delta.cumsum(1)[:, :L] > 0  # (B, L) inside a covered span
    first = torch.zeros(B, L + 1, dtype=torch.long).scatter_add_(1, at, cover.long())[:, :L] > 0
    inserts = torch.zeros(B, L + 1, dtype=torch.long).scatter_add_(1, at, (spans.valid & ~cover).long())
    return torch.where(noise, mask_id, vals), torch.where(noise, first, keep), inserts


def emit(vals: Tensor, keep: Tensor, inserts: Tensor, mask_id: int, pad_id: int) -> tuple[Tensor, Tensor]:
    """Rows of kept tokens with inserts[b, p] <mask> tokens before position p → (B, max_len) padded, lengths."""
    L = vals.shape[1]
    dest = (keep.long() + inserts[:, :L]).cumsum(1) - 1  # a kept token lands after its own inserts
    lengths = keep.sum(1) + inserts.sum(1)
    width = max(int(lengths.max()), 1)  # a row everything was deleted from keeps one (masked) slot
    # Slots no kept token lands in, inside a row's length, are exactly the inserted <mask> tokens.
    out = scatter_rows(vals, dest, keep, width, mask_id)
    return out.masked_fill(~lengths_mask(lengths, width), pad_id), lengths


def permute_sentences(x: Tensor, sentence_end: Tensor) -> Tensor:
    """Shuffle the sentences of each row (B, L); a sentence ends after a token with sentence_end[token] True."""
    B, L = x.shape
    ends = sentence_end[x].long()
    sid = ends.cumsum(1) - ends  # (B, L) sentence index of each token; the end token belongs to its sentence
    rank = torch.rand(B, L, generator=rng()).argsort(1).argsort(1)  # a random permutation of sentence slots per row
    key = rank.gather(1, sid) * L + torch.arange(L)  # sort by the sentence's new rank, then by position
    return x.gather(1, key.argsort(1))


def rotate(rows: Tensor, lengths: Tensor, offsets: Tensor, pad_id: int) -> Tensor:
    """Row b rotated left by offsets[b] within its first lengths[b] tokens (BART §2.2 document rotation)."""
    width = rows.shape[1]
    idx = (torch.arange(width)[None, :] + offsets[:, None]) % lengths.clamp(min=1)[:, None]
    return rows.gather(1, idx).masked_fill(~lengths_mask(lengths, width), pad_id)


def sentence_end_table(tokenizer, vocab_size: int) -> Tensor:
    """(vocab_size,) bool: tokens that end a sentence (text ending in . ! ? before closing quotes, and EOS)."""
    n = min(vocab_size, tokenizer.vocab_size)
    texts = tokenizer.decode_batch([[i] for i in range(n)], skip_special_tokens=False)
    table = torch.zeros(vocab_size, dtype=torch.bool)
    table[:n] = torch.tensor([t.rstrip().rstrip(CLOSERS).endswith(SENTENCE_FINAL) for t in texts])
    if tokenizer.eos_id is not None and tokenizer.eos_id < vocab_size:
        table[tokenizer.eos_id] = True
    return table


@OBJECTIVES.register("bart")
class BartDenoising(Objective):
    """BART §2.2 noising; the encoder reads the noised window, the decoder reconstructs the original."""

    name = "bart"
    scores_labels = True
    Options = BartOptions

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        o: BartOptions = self.options
        check_seq2seq_model(cfg.model, self.name)
        for key in ("mask_rate", "delete_rate", "infill_rate", "random_rate"):
            if not 0.0 <= getattr(o, key) <= 1.0:
                raise LMForgeError(f"objective.{key} must be in [0, 1], got {getattr(o, key)}")
        if o.mask_rate + o.delete_rate > 1.0:
            raise LMForgeError(f"objective.mask_rate + objective.delete_rate exceed 1 ({o.mask_rate + o.delete_rate})")
        if o.poisson_lambda <= 0:
            raise LMForgeError(f"objective.poisson_lambda must be positive, got {o.poisson_lambda}")
        self.mask_id = tokenizer.mask_id
        if self.mask_id is None and (o.mask_rate > 0 or o.infill_rate > 0):
            raise LMForgeError(
                f"objective 'bart' masks tokens but the tokenizer (family {tokenizer.family}) has no mask token: "
                "set data.tokenizer_family: bart"
            )
        m = cfg.model
        self.pad_id, self.start_id = m.pad_id, m.decoder_start_id
        # Learned positions end at max_seq_len: a source grown by 0-length spans is cut there.
        self.max_source = m.max_positions
        self.sentence_end = sentence_end_table(tokenizer, m.vocab_size) if o.permute else None
        self.ordinary = ordinary_ids(tokenizer, m.vocab_size) if o.random_rate > 0 else None

    def noise(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Noised source rows (B, S) padded with pad_id, and their lengths (B,), for original rows x (B, L)."""
        o: BartOptions = self.options
        B, L = x.shape
        if o.permute:
            x = permute_sentences(x, self.sentence_end)
        vals, keep = x, torch.ones_like(x, dtype=torch.bool)
        if o.mask_rate > 0 or o.delete_rate > 0:
            u = torch.rand(B, L, generator=rng())
            vals = torch.where(u < o.mask_rate, self.mask_id, x) if o.mask_rate > 0 else x
            keep = ~((u >= o.mask_rate) & (u < o.mask_rate + o.delete_rate))
        inserts = torch.zeros(B, L + 1, dtype=torch.long)
        if o.infill_rate > 0:
            spans = poisson_spans(B, L, round(L * o.infill_rate), o.poisson_lambda)
            vals, keep, inserts = infill(vals, keep, spans, self.mask_id)
        mask_id = self.mask_id if self.mask_id is not None else self.pad_id
        src, lengths = emit(vals, keep, inserts, mask_id, self.pad_id)
        if o.random_rate > 0 and self.mask_id is not None:
            swap = (src == self.mask_id) & (torch.rand(src.shape, generator=rng()) < o.random_rate)
            src = torch.where(swap, random_tokens(src.shape, self.ordinary), src)
        if o.rotate:
            src = rotate(src, lengths, (torch.rand(B, generator=rng()) * lengths).long(), self.pad_id)
        if self.max_source is not None and src.shape[1] > self.max_source:
            src, lengths = src[:, : self.max_source], lengths.clamp(max=self.max_source)
        return src, lengths

    def transform(self, tokens: Tensor) -> dict[str, Tensor]:
        x = tokens[:, :-1]  # (B, T): the extra token of a packed window only serves next-token objectives
        src, src_len = self.noise(x)
        tgt_len = torch.full((x.shape[0],), x.shape[1], dtype=torch.long)
        return seq2seq_batch(src, src_len, x, tgt_len, start_id=self.start_id, pad_id=self.pad_id)

    def eval_transform(self, tokens: Tensor) -> dict[str, Tensor]:
        """Validation batches get fixed noise (a function of the window), so evaluations are comparable."""
        return with_fixed_noise(self.transform, tokens, self.cfg.run.seed)

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        return seq2seq_loss(model, batch)
