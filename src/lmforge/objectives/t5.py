"""T5 span corruption (Raffel et al. 2020 §3.1.4) and the objective variants of its Tables 4, 5 and 7 (§3.3).

Each window's first seq_len tokens are corrupted; the encoder reads the input, the decoder is teacher-forced on
the target; both end with EOS. Styles (option `style`), with "Thank you for inviting me to your party last week.":

- span       Thank you <X> me to your party <Y> week. → <X> for inviting <Y> last   (§3.1.4, §3.3.4: spans of
             mean length `mean_span_length` covering exactly round(noise_density·L) tokens, T5's
             random_spans_noise_mask; a row starts clean and ends inside a span, so no sentinel ends the target)
- iid        as span, but tokens are corrupted i.i.d.; each run of corrupted tokens gets one sentinel (Table 4
             "replace corrupted spans", Table 7 "i.i.d.")
- bert       Thank you <M> <M> me to your party apple week. → the original   (Table 4 "BERT-style": corrupted
             tokens → mask with mask_prob, random token with random_prob, unchanged otherwise)
- mass       Thank you <M> <M> me to your party <M> week. → the original   (Table 4 "MASS-style")
- drop       Thank you me to your party week. → for inviting last   (Table 4 "drop corrupted tokens")
- deshuffle  party me for your to. last fun you inviting week Thank → the original   (Table 3 "deshuffling")
- prefix_lm  Thank you for inviting → me to your party last week.   (Table 3/4 "prefix language modeling"; T5's
             random_prefix_noise_mask: the prefix ends uniformly in [round((1 − 2·noise_density)·L), L − 1], so
             noise_density 0.5 splits uniformly anywhere)
- lm         (EOS only) → the whole text   (Table 2 "Language model" rows for an encoder-decoder: the prefix LM with
             an empty prefix; the decoder alone models the text)

The mask token of bert/mass is the tokenizer's mask token, else the first sentinel (as T5's code does). Target
sentinels are numbered by the span they precede, so <extra_id_j> marks span j in both input and target (T5's code
numbers target sentinels by the clean spans instead, which agrees whenever the text starts clean, as it always does
under random_spans_noise_mask)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput, Objective
from lmforge.objectives.rng import rng, with_fixed_noise
from lmforge.objectives.seq2seq import (
    append,
    check_seq2seq_model,
    compact,
    ordinary_ids,
    random_tokens,
    scatter_rows,
    seq2seq_batch,
    seq2seq_loss,
)
from lmforge.registry import OBJECTIVES

Style = Literal["span", "iid", "bert", "mass", "drop", "deshuffle", "prefix_lm", "lm"]
SENTINEL_STYLES = ("span", "iid")


@dataclass
class T5Options:
    style: Style = "span"
    """Objective variant (see the module docstring); span = T5's final span corruption."""
    noise_density: float = 0.15
    """Fraction of tokens corrupted (T5 Table 6 tries 0.10, 0.15, 0.25, 0.50)."""
    mean_span_length: float = 3.0
    """Mean corrupted-span length of style 'span' (T5 Table 7 tries 2, 3, 5, 10)."""
    mask_prob: float = 0.8
    """Style 'bert': fraction of corrupted tokens replaced by the mask token (T5 itself used 0.9 and no
    unchanged tokens: --objective.mask_prob=0.9 --objective.random_prob=0.1)."""
    random_prob: float = 0.1
    """Style 'bert': fraction of corrupted tokens replaced by a random ordinary token."""


def span_counts(length: int, noise_density: float, mean_span_length: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of T5's random_spans_noise_mask for a row of `length` tokens."""
    length = max(length, 2)
    n_noise = min(max(round(length * noise_density), 1), length - 1)
    n_spans = max(round(n_noise / mean_span_length), 1)
    # Every span, noise or clean, needs at least one token (T5's code assumes this silently).
    return n_noise, min(n_spans, length - n_noise)


def random_segmentation(batch: int, n_items: int, n_segments: int) -> Tensor:
    """(B, n_segments) lengths ≥ 1 of a uniformly random split of n_items items into n_segments runs."""
    cut = torch.zeros(batch, n_items, dtype=torch.long)
    # Segments start at item 0 and at n_segments - 1 distinct random items among 1..n_items-1.
    starts = torch.rand(batch, n_items - 1, generator=rng()).argsort(1)[:, : n_segments - 1] + 1
    cut.scatter_(1, starts, 1)
    seg = cut.cumsum(1)  # (B, n_items) segment id of each item
    return torch.zeros(batch, n_segments, dtype=torch.long).scatter_add_(1, seg, torch.ones_like(seg))


def random_spans_noise_mask(batch: int, length: int, noise_density: float, mean_span_length: float) -> Tensor:
    """(B, L) bool, True = corrupted: T5's random_spans_noise_mask. Every row has exactly the same number of noise
    tokens and spans; rows alternate clean/noise spans and start clean."""
    n_noise, n_spans = span_counts(length, noise_density, mean_span_length)
    noise_len = random_segmentation(batch, n_noise, n_spans)
    clean_len = random_segmentation(batch, max(length, 2) - n_noise, n_spans)
    spans = torch.stack([clean_len, noise_len], dim=2).flatten(1)  # (B, 2m): clean, noise, clean, noise, ...
    starts = spans.cumsum(1)[:, :-1]
    indicator = torch.zeros(batch, max(length, 2), dtype=torch.long).scatter_(1, starts, 1)
    return (indicator.cumsum(1) % 2 == 1)[:, :length]


def iid_noise_mask(batch: int, length: int, noise_density: float) -> Tensor:
    """(B, L) bool: each token corrupted independently with probability noise_density."""
    return torch.rand(batch, length, generator=rng()) < noise_density


def random_prefix_noise_mask(batch: int, length: int, noise_density: float) -> Tensor:
    """(B, L) bool, True after a random prefix: T5's random_prefix_noise_mask (prefix of at least 1 token)."""
    hi = length - 1
    lo = min(hi, max(1, round((1 - 2 * noise_density) * length)))
    n_prefix = torch.randint(lo, hi + 1, (batch, 1), generator=rng())
    return torch.arange(length)[None, :] >= n_prefix


def span_starts(noise: Tensor) -> Tensor:
    """(B, L) bool: the first token of each run of noise."""
    return noise & ~F.pad(noise[:, :-1], (1, 0), value=False)


def sentinel_inputs(x: Tensor, noise: Tensor, sentinels: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """T5 noise_span_to_unique_sentinel: each noise run → its sentinel (<extra_id_0> first), rest of it dropped."""
    start = span_starts(noise)
    span = (start.long().cumsum(1) - 1).clamp(0, len(sentinels) - 1)  # span index of each noise token
    vals = torch.where(start, sentinels[span], x)
    return compact(vals, ~noise | start, pad_id, extra=1)


def sentinel_targets(x: Tensor, noise: Tensor, sentinels: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """Each noise run behind its sentinel: <extra_id_0> run0 <extra_id_1> run1 ... (B, max_len) and lengths."""
    start = span_starts(noise)
    n_start = start.long().cumsum(1)
    span = (n_start - 1).clamp(0, len(sentinels) - 1)
    dest = noise.long().cumsum(1) - 1 + n_start  # a noise token lands after every sentinel up to its own
    lengths = noise.sum(1) + start.sum(1)
    width = int(lengths.max()) + 1
    out = scatter_rows(x, dest, noise, width, pad_id)
    marks = scatter_rows(sentinels[span], dest - 1, start, width, -1)
    return torch.where(marks >= 0, marks, out), lengths


def bert_corrupt(x: Tensor, noise: Tensor, mask_id: int, ordinary: Tensor, mask_prob: float, random_prob: float):
    """Corrupted tokens → mask (mask_prob), a random token (random_prob), or unchanged (the rest)."""
    u = torch.rand(x.shape, generator=rng())
    out = torch.where(noise & (u < mask_prob), mask_id, x)
    rand = noise & (u >= mask_prob) & (u < mask_prob + random_prob)
    return torch.where(rand, random_tokens(x.shape, ordinary), out)


@OBJECTIVES.register("t5")
class T5SpanCorruption(Objective):
    """T5's denoising objectives for encoder-decoders (span corruption by default)."""

    name = "t5"
    scores_labels = True
    Options = T5Options

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        o: T5Options = self.options
        check_seq2seq_model(cfg.model, self.name)
        if not 0.0 < o.noise_density < 1.0:
            raise LMForgeError(f"objective.noise_density must be in (0, 1), got {o.noise_density}")
        if o.mean_span_length < 1.0:
            raise LMForgeError(f"objective.mean_span_length must be >= 1, got {o.mean_span_length}")
        if min(o.mask_prob, o.random_prob) < 0 or o.mask_prob + o.random_prob > 1:
            raise LMForgeError(f"objective.mask_prob + random_prob must lie in [0, 1] ({o.mask_prob}, {o.random_prob})")
        if tokenizer.eos_id is None:
            raise LMForgeError("objective 't5' ends inputs and targets with EOS, but the tokenizer has no eos token")
        self.eos_id, self.pad_id, self.start_id = tokenizer.eos_id, cfg.model.pad_id, cfg.model.decoder_start_id
        n_sent = tokenizer.num_sentinels
        self.sentinels = torch.tensor(tokenizer.sentinel_ids(n_sent), dtype=torch.long)
        if o.style in SENTINEL_STYLES and n_sent == 0:
            raise LMForgeError(
                f"objective 't5' style '{o.style}' needs <extra_id_N> sentinel tokens: set data.tokenizer_family: t5"
            )
        if o.style == "span":
            n_spans = span_counts(cfg.train.seq_len, o.noise_density, o.mean_span_length)[1]
            if n_spans > n_sent:
                raise LMForgeError(
                    f"objective 't5': {n_spans} noise spans per sequence but the tokenizer has {n_sent} sentinels "
                    "(lower train.seq_len or objective.noise_density, or raise objective.mean_span_length)"
                )
        self.mask_id = tokenizer.mask_id
        if self.mask_id is None and n_sent:
            self.mask_id = int(self.sentinels[0])  # T5's code masks with <extra_id_0>
        if o.style in ("bert", "mass") and self.mask_id is None:
            raise LMForgeError(f"objective 't5' style '{o.style}' needs a mask token or a sentinel in the tokenizer")
        self.ordinary = ordinary_ids(tokenizer, cfg.model.vocab_size) if o.style == "bert" else None

    def noise_mask(self, batch: int, length: int) -> Tensor:
        o: T5Options = self.options
        if o.style == "span":
            return random_spans_noise_mask(batch, length, o.noise_density, o.mean_span_length)
        if o.style == "prefix_lm":
            return random_prefix_noise_mask(batch, length, o.noise_density)
        return iid_noise_mask(batch, length, o.noise_density)

    def corrupt(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Original rows x (B, L) → input rows, input lengths, target rows, target lengths (before EOS)."""
        o: T5Options = self.options
        B, L = x.shape
        full = torch.full((B,), L, dtype=torch.long)
        if o.style == "lm":
            return x.new_full((B, 1), self.pad_id), torch.zeros_like(full), x, full
        if o.style == "deshuffle":
            return x.gather(1, torch.rand(B, L, generator=rng()).argsort(1)), full, x, full
        noise = self.noise_mask(B, L)
        if o.style in SENTINEL_STYLES:
            return (*sentinel_inputs(x, noise, self.sentinels, self.pad_id),
                    *sentinel_targets(x, noise, self.sentinels, self.pad_id))  # fmt: skip
        if o.style in ("drop", "prefix_lm"):
            return (*compact(x, ~noise, self.pad_id, extra=1), *compact(x, noise, self.pad_id, extra=1))
        if o.style == "mass":
            return torch.where(noise, self.mask_id, x), full, x, full
        return bert_corrupt(x, noise, self.mask_id, self.ordinary, o.mask_prob, o.random_prob), full, x, full

    @classmethod
    def lengths(cls, options: T5Options, seq_len: int) -> tuple[int, int | None]:
        """(encoder, decoder) tokens of a window of L = seq_len tokens, EOS included; expected values for the styles
        whose lengths vary (iid, drop: Binomial(L, noise_density) corrupted tokens; prefix_lm: a uniform split)."""
        o, L = options, seq_len
        if o.style == "span":
            n_noise, n_spans = span_counts(L, o.noise_density, o.mean_span_length)
            return L - n_noise + n_spans + 1, n_noise + n_spans + 1  # each span a sentinel; EOS at the end
        if o.style in ("iid", "drop"):
            n_noise = o.noise_density * L
            runs = n_noise * (1 - o.noise_density) if o.style == "iid" else 0.0  # a sentinel per corrupted run
            return round(L - n_noise + runs + 1), round(n_noise + runs + 1)
        if o.style == "prefix_lm":
            lo = min(L - 1, max(1, round((1 - 2 * o.noise_density) * L)))
            prefix = (lo + L - 1) / 2
            return round(prefix + 1), round(L - prefix + 1)
        if o.style == "lm":
            return 1, L + 1
        return L + 1, L + 1  # bert, mass, deshuffle: the whole (corrupted) window in, the original out

    def transform(self, tokens: Tensor) -> dict[str, Tensor]:
        x = tokens[:, :-1]  # (B, T): the extra token of a packed window only serves next-token objectives
        src, src_len, tgt, tgt_len = self.corrupt(x)
        src, src_len = append(src, src_len, self.eos_id, self.pad_id)
        tgt, tgt_len = append(tgt, tgt_len, self.eos_id, self.pad_id)
        return seq2seq_batch(src, src_len, tgt, tgt_len, start_id=self.start_id, pad_id=self.pad_id)

    def eval_transform(self, tokens: Tensor) -> dict[str, Tensor]:
        """Validation batches get fixed noise (a function of the window), so evaluations are comparable."""
        return with_fixed_noise(self.transform, tokens, self.cfg.run.seed)

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        return seq2seq_loss(model, batch)
