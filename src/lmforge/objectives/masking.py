"""Vectorised corruption for encoder objectives: random draws, word starts, token / whole-word / span selection,
the 80/10/10 replacement and [CLS] ... [SEP] framing of packed windows.

Every function works on a whole batch at once (no Python loops over tokens or rows)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.objectives.rng import rng
from lmforge.tokenizers.kinds import TOKENIZER_KINDS

IGNORE = -100
"""Label of positions that are not predicted (cross_entropy's default ignore_index)."""


def labelled_index(labels: Tensor, batch: dict[str, Tensor] | None = None) -> Tensor:
    """The flat positions of `labels` that are predicted (row-major). A transform calls it on the CPU and stores the
    result as the batch's `mlm_index`, which a loss then takes from `batch`: found on the device instead, the
    positions (a data-dependent shape) would make the host wait for the GPU."""
    if batch is not None and "mlm_index" in batch:
        return batch["mlm_index"]
    return (labels != IGNORE).flatten().nonzero().squeeze(1)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser over a uint64 array (wrapping arithmetic): a cheap, well-mixed hash."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def row_keys(rows: Tensor, seed: int) -> np.ndarray:
    """A 64-bit key per row (B,) that depends only on the row's tokens (B, L) and the seed."""
    x = rows.detach().cpu().numpy().astype(np.uint64)
    pos = np.arange(x.shape[1], dtype=np.uint64)
    mixed = _splitmix64(x * _MIX1 + pos * _GOLDEN + np.uint64(seed & 0xFFFFFFFF))  # (B, L)
    return _splitmix64(np.bitwise_xor.reduce(mixed, axis=1) if x.shape[1] else np.zeros(len(x), np.uint64))


class Draws:
    """Uniform numbers in [0, 1) for one batch of masking decisions.

    Dynamic (keys None): the batch source's generator (`objectives.rng`), so an example gets new masks each time
    it is seen and a resumed run replays exactly (the loop checkpoints that generator). Static: a counter-based
    hash of each row's key and the draw's position, so an example's masks depend only on its tokens, the seed and
    the copy (BERT's create_pretraining_data masks each of its dupe_factor copies of the data its own way), whatever
    batch or process it lands in."""

    def __init__(self, keys: np.ndarray | None = None) -> None:
        self.keys = keys
        self._stream = 0

    @classmethod
    def static(cls, rows: Tensor, seed: int, copy: int = 0) -> Draws:
        """The static draws of copy `copy` of each row (B, L); copy 0 is keyed by the row and seed alone."""
        keys = row_keys(rows, seed)
        if copy:
            keys = _splitmix64(keys ^ _splitmix64(np.full(len(keys), copy, dtype=np.uint64)))
        return cls(keys)

    def uniform(self, n_rows: int, width: int) -> Tensor:
        """(n_rows, width) float64 uniforms; successive calls give independent draws."""
        self._stream += 1
        if self.keys is None:
            return torch.rand(n_rows, width, dtype=torch.float64, generator=rng())
        counter = np.arange(width, dtype=np.uint64) + np.uint64(self._stream) * np.uint64(1 << 32)
        h = _splitmix64(self.keys[:, None] ^ _splitmix64(counter)[None, :])  # (B, width)
        return torch.from_numpy((h >> np.uint64(11)).astype(np.float64) * 2.0**-53)


class EpochNoting:
    """A training loader that notes the epoch of the batch it handed out last (`epoch_out`; 0 before the first):
    static masks with dupe_factor copies mask a batch of epoch e with copy e mod dupe_factor. The epoch is the
    loader's own — the same on every rank and restored on resume — so the copy depends neither on the number of
    processes nor on where a run was resumed. Everything else (state, validation passes) is the wrapped loader's."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self.epoch_out = 0

    def __iter__(self) -> EpochNoting:
        return self

    def __next__(self):
        epoch = self.loader.epoch  # the loader rolls its epoch over after an epoch's last batch, not before
        out = next(self.loader)
        self.epoch_out = epoch
        return out

    def __getattr__(self, name: str):
        if name == "loader":  # not set yet (a copy being built): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.loader, name)


# --- vocabulary tables ------------------------------------------------------------------------------------------


def special_ids(tokenizer) -> list[int]:
    """Ids that are never masked nor drawn as random replacements: role tokens and added special tokens."""
    ids = {i for i in (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id, tokenizer.unk_id, tokenizer.mask_id,
                       tokenizer.cls_id, tokenizer.sep_id) if i is not None}  # fmt: skip
    ids |= {i for i, tok in tokenizer.backend.get_added_tokens_decoder().items() if tok.special}
    return sorted(ids)


def word_start_table(tokenizer) -> Tensor:
    """(vocab_size,) bool: does the token begin a word?

    As the tokenizer's kind marks word starts (`lmforge.tokenizers.kinds`): WordPiece: tokens without the continuation
    prefix ('##'); byte-level BPE: tokens whose first byte is a space, newline, tab or CR ('Ġ', 'Ċ', ...);
    SentencePiece / Metaspace: tokens starting with '▁'. Special tokens start words. Positions right after a special
    token (or at a row start) also start words; see `word_starts`."""
    table = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
    starts = TOKENIZER_KINDS[tokenizer.kind].word_starts(tokenizer.backend)
    table[torch.tensor(starts, dtype=torch.long)] = True
    table[torch.tensor(special_ids(tokenizer), dtype=torch.long)] = True
    return table


def word_starts(ids: Tensor, candidates: Tensor, table: Tensor | None) -> Tensor:
    """(B, L) bool word starts: table lookups (None: every token is a word), plus every non-candidate position,
    the position after it and the first column, so a word never spans a special token."""
    starts = torch.ones_like(candidates) if table is None else table[ids]
    starts = starts | ~candidates
    starts[:, 1:] |= ~candidates[:, :-1]
    starts[:, 0] = True
    return starts


def stochastic_round(x: Tensor, u: Tensor) -> Tensor:
    """floor(x + u) for u ~ U[0,1): an integer whose expectation is x (fairseq's mask-count rounding)."""
    return torch.floor(x + u).long()


# --- selection --------------------------------------------------------------------------------------------------


def select_words(candidates: Tensor, starts: Tensor, rate: float, draws: Draws) -> Tensor:
    """Select whole words covering `rate` of each row's candidate tokens → (B, L) bool.

    Words are taken in a random order while the running token count stays under the budget (midpoint rule:
    a word is taken when the budget reaches its middle, so the expected count equals the budget). With every
    token its own word this selects exactly round(rate * n) tokens per row (BERT §3.1)."""
    B, L = candidates.shape
    wid = torch.cumsum(starts.long(), 1) - 1  # (B, L) word index of each token
    wlen = torch.zeros(B, L, dtype=torch.float64).scatter_add_(1, wid, torch.ones(B, L, dtype=torch.float64))
    wcand = torch.zeros(B, L, dtype=torch.bool).scatter_(1, wid, candidates)  # words are all-candidate or none
    budget = stochastic_round(rate * candidates.sum(1).double(), draws.uniform(B, 1)[:, 0])  # (B,)
    score = draws.uniform(B, L).masked_fill(~wcand, 2.0)  # non-words and non-candidates sort last
    order = torch.argsort(score, dim=1)
    slen = torch.gather(wlen, 1, order)
    before = torch.cumsum(slen, 1) - slen  # tokens already taken when a word's turn comes
    take = (before + slen / 2 < budget[:, None]) & torch.gather(wcand, 1, order)
    chosen = torch.zeros(B, L, dtype=torch.bool).scatter_(1, order, take)  # back to word order
    return torch.gather(chosen, 1, wid) & candidates


def geometric_length_probs(p: float, max_len: int) -> Tensor:
    """P(ℓ) ∝ p(1-p)^(ℓ-1) for ℓ = 1..max_len (SpanBERT §3.1: p = 0.2, ℓ_max = 10, mean 3.8)."""
    lengths = torch.arange(1, max_len + 1, dtype=torch.float64)
    w = p * (1 - p) ** (lengths - 1)
    return w / w.sum()


def ngram_length_probs(max_n: int) -> Tensor:
    """P(n) ∝ 1/n for n = 1..max_n (ALBERT §4.1 n-gram masking: max_n = 3, P = 6/11, 3/11, 2/11)."""
    w = 1.0 / torch.arange(1, max_n + 1, dtype=torch.float64)
    return w / w.sum()


def _draw_lengths(weights: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF draws of lengths 1..len(weights) with P(ℓ) ∝ weights[ℓ - 1]; u (B, S) uniforms."""
    cdf = torch.cumsum(weights, 0) / weights.sum()
    return torch.searchsorted(cdf, u.contiguous() * (1 - 1e-12)) + 1


def select_spans(
    candidates: Tensor, starts: Tensor, rate: float, length_probs: Tensor, draws: Draws
) -> tuple[Tensor, Tensor]:
    """Mask spans of complete words (SpanBERT §3.1) → (selected (B, L) bool, span id (B, L), -1 = none).

    Lengths ℓ (in words) are drawn i.i.d. from `length_probs` and read as a renewal process started at a random
    offset s from its equilibrium distribution (s = U · L*, L* size-biased); the spans starting before the budget
    rate × (candidate words) are kept. Keeping span j then depends only on the spans before it, so kept lengths
    follow `length_probs` exactly and the expected masked count equals the budget. The kept spans and the
    remaining words are laid out in a uniformly random order, so each span starts at a uniformly random word
    start and spans never overlap. Non-candidate tokens are skipped over (never masked)."""
    B, L = candidates.shape
    cstart = starts & candidates
    W = cstart.sum(1)  # (B,) candidate words per row
    ell, n_spans = _kept_lengths(rate * W.double(), W, length_probs, draws)
    word_span = _lay_out(ell, n_spans, W, L, draws)  # (B, L) span id of each candidate word
    cwid = torch.cumsum(cstart.long(), 1) - 1  # (B, L) candidate-word index of each candidate token
    span = torch.gather(word_span, 1, cwid.clamp(min=0)).masked_fill(~candidates, -1)
    return span >= 0, span


def _kept_lengths(budget: Tensor, W: Tensor, length_probs: Tensor, draws: Draws) -> tuple[Tensor, Tensor]:
    """(lengths (B, S), number kept (B,)): the kept spans are a prefix of the drawn lengths."""
    B = len(budget)
    n_max = int(budget.max()) + 1  # span j starts at >= j words, so at most ceil(budget) spans start in it
    ell = _draw_lengths(length_probs, draws.uniform(B, n_max))  # (B, S)
    lengths = torch.arange(1, len(length_probs) + 1, dtype=torch.float64)
    size_biased = _draw_lengths(length_probs * lengths, draws.uniform(B, 1))[:, 0]
    offset = draws.uniform(B, 1)[:, 0] * size_biased  # (B,) equilibrium residual of the renewal process
    cum = torch.cumsum(ell, 1)
    keep = (offset[:, None] + cum - ell < budget[:, None]) & (cum <= W[:, None])
    return ell, keep.sum(1)


def _lay_out(ell: Tensor, n_spans: Tensor, W: Tensor, L: int, draws: Draws) -> Tensor:
    """Span id (B, L) of each of the W words of a row (-1 = not masked), the n_spans spans of lengths ell placed
    among the unmasked words in a uniformly random order."""
    B, S = ell.shape
    total = (ell * (torch.arange(S)[None, :] < n_spans[:, None])).sum(1)
    n_items = W - total + n_spans  # (B,) items = kept spans + unmasked words
    slots = max(int(n_items.max()), 1)
    unused = torch.arange(slots)[None, :] >= n_items[:, None]
    # A random n_spans-subset of the item slots are spans: the n_spans lowest of random scores.
    order = torch.argsort(draws.uniform(B, slots).masked_fill(unused, 2.0), 1)
    rank = torch.empty(B, slots, dtype=torch.long).scatter_(1, order, torch.arange(slots).expand(B, -1).contiguous())
    is_span = rank < n_spans[:, None]
    span_idx = (torch.cumsum(is_span.long(), 1) - 1).clamp(min=0, max=S - 1)  # (B, slots) which drawn length
    item_len = torch.where(is_span, torch.gather(ell, 1, span_idx), torch.ones_like(span_idx)).masked_fill(unused, 0)
    item_end = torch.cumsum(item_len, 1)  # (B, slots) words covered up to and including each item
    words = torch.arange(L).expand(B, -1).contiguous()
    item_of_word = torch.searchsorted(item_end, words, right=True).clamp(max=slots - 1)  # (B, L)
    return torch.where(torch.gather(is_span, 1, item_of_word), torch.gather(span_idx, 1, item_of_word), -1)


# --- corruption ---------------------------------------------------------------------------------------------------


def corrupt(
    ids: Tensor,
    selected: Tensor,
    *,
    mask_id: int,
    random_ids: Tensor,
    mask_frac: float,
    random_frac: float,
    draws: Draws,
    groups: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT §3.1's replacement of the selected tokens → (inputs, labels).

    Each selected token becomes [MASK] with probability mask_frac, a random token from `random_ids` with
    probability random_frac, else stays; with `groups` (B, L) span ids, every token of a span gets the same
    choice (SpanBERT §3.1). Labels hold the original token at selected positions, IGNORE elsewhere."""
    B, L = ids.shape
    u = draws.uniform(B, L)
    if groups is not None:
        u = torch.gather(u, 1, groups.clamp(min=0))  # one draw per span id (span ids < L)
    to_mask = selected & (u < mask_frac)
    to_random = selected & (u >= mask_frac) & (u < mask_frac + random_frac)
    pick = (draws.uniform(B, L) * len(random_ids)).long().clamp(max=len(random_ids) - 1)
    out = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    out = torch.where(to_random, random_ids[pick], out)
    labels = torch.where(selected, ids, torch.full_like(ids, IGNORE))
    return out, labels


# --- framing ------------------------------------------------------------------------------------------------------


def frame(tokens: Tensor, cls_id: int | None, sep_id: int | None, pad_id: int | None) -> dict[str, Tensor]:
    """Packed windows (B, T + 1) → {"input_ids": (B, T) "[CLS] text [SEP]", "attention_mask" when padded}.

    A window keeps its first T - 2 tokens (documents inside it stay separated by the tokenizer's EOS, which is
    [SEP] / </s> for the bert and bart families: RoBERTa §4.2's FULL-SENTENCES). Rows padded at the end with
    pad_id (document-bounded chunks) get [SEP] right after their text and an attention mask."""
    if cls_id is None or sep_id is None:
        return {"input_ids": tokens[:, :-1]}  # no framing tokens in this vocabulary: the window as it is
    B, T = tokens.shape[0], tokens.shape[1] - 1
    if T < 3:
        raise LMForgeError(f"train.seq_len={T} is too short for [CLS] text [SEP] inputs (need at least 3)")
    text = tokens[:, : T - 2]
    padded = pad_id is not None and pad_id not in (cls_id, sep_id) and bool((text == pad_id).any())
    if not padded:
        cls = torch.full((B, 1), cls_id, dtype=tokens.dtype)
        sep = torch.full((B, 1), sep_id, dtype=tokens.dtype)
        return {"input_ids": torch.cat([cls, text, sep], 1)}
    n = (text != pad_id).sum(1)  # (B,) text length: padding is only at the end
    out = torch.full((B, T), pad_id, dtype=tokens.dtype)
    out[:, 0] = cls_id
    out[:, 1 : T - 1] = text
    out[torch.arange(B), n + 1] = sep_id
    mask = (torch.arange(T)[None, :] < (n + 2)[:, None]).long()
    return {"input_ids": out, "attention_mask": mask}
