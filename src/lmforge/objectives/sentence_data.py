"""Sentence-level examples from prepared token data: BERT's sentence pairs (NSP / ALBERT's SOP) and RoBERTa's
DOC-SENTENCES inputs.

Sentences are found in token space, so any prepared data dir works: a sentence ends after a token made only of
punctuation that contains '.', '!' or '?' (e.g. '.', '?"', '...'; abbreviations such as "Mr." end one too), or
at the end of its document; a sentence longer than an example's text budget is cut into pieces of that budget.
Consecutive sentences of one document are packed greedily into chunks of at most `max_tokens` (BERT's
create_pretraining_data accumulates sentences up to the target length the same way). Both loaders below then
turn chunks into examples.

Batching follows TokenLoader: epoch e visits the chunks in `default_rng(seed + e).permutation` order; global
batch i is chunks perm[i*B*W : (i+1)*B*W] and rank r takes rows [r*B, (r+1)*B). Every random choice of global
batch i (split points, labels, random documents) is drawn for the whole global batch from
`default_rng([seed, epoch, i])`, so examples do not depend on the world size, and a (epoch, batch) position
resumes exactly without replaying data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from lmforge.data.corpus.loader import open_tokens, rank_batches, rank_rows, read_doc_index, read_meta, resume_position
from lmforge.errors import LMForgeError

_FINAL = set(".!?")
_WORD_MARKS = ("##", "\u0120", "\u010a", "\u2581")  # WordPiece continuation, byte-level space/newline, '▁'


def sentence_end_ids(tokenizer) -> np.ndarray:
    """Ids of tokens that end a sentence: punctuation only (after word markers), holding '.', '!' or '?'."""
    out = []
    for text, i in tokenizer.backend.get_vocab(with_added_tokens=False).items():
        core = text
        for mark in _WORD_MARKS:
            core = core.removeprefix(mark)
        if core and _FINAL & set(core) and not any(c.isalnum() or c.isspace() for c in core):
            out.append(i)
    return np.array(sorted(out), dtype=np.int64)


class SentenceIndex:
    """Sentences (units) and greedy chunks of one split, as flat numpy arrays (positions in the split's tokens)."""

    def __init__(
        self, tokens: np.ndarray, doc_starts: np.ndarray, end_ids: np.ndarray, max_tokens: int, min_tokens: int = 1
    ) -> None:
        n, n_docs = len(tokens), len(doc_starts)
        doc_eos = np.append(doc_starts[1:], n) - 1  # each document's EOS position (excluded from its text)
        start = np.zeros(n, dtype=bool)  # only boolean arrays of the split's length: ~2 bytes per token
        start[1:] = np.isin(tokens[:-1], end_ids)
        start[doc_starts] = True
        start[doc_eos] = False
        sent_start = np.flatnonzero(start)  # (K,)
        sent_doc = np.searchsorted(doc_starts, sent_start, side="right") - 1
        sent_end = np.minimum(np.append(sent_start[1:], n), doc_eos[sent_doc])  # exclusive
        # Units: sentences, those longer than max_tokens cut into pieces of max_tokens.
        pieces = -(-(sent_end - sent_start) // max_tokens)  # (K,) >= 1
        first_piece = np.repeat(np.cumsum(pieces) - pieces, pieces)
        self.unit_start = np.repeat(sent_start, pieces) + (np.arange(pieces.sum()) - first_piece) * max_tokens
        self.unit_doc = np.repeat(sent_doc, pieces)
        self.unit_end = np.minimum(self.unit_start + max_tokens, np.repeat(sent_end, pieces))
        docs = np.arange(n_docs)
        self.doc_first = np.searchsorted(self.unit_doc, docs, side="left")  # first unit of each document
        self.doc_stop = np.searchsorted(self.unit_doc, docs, side="right")  # one past its last unit
        self.docs_with_text = np.flatnonzero(self.doc_stop > self.doc_first)
        self.doc_end = doc_eos
        first, stop = self._pack(max_tokens)
        long_enough = self.unit_end[stop - 1] - self.unit_start[first] >= min_tokens
        self.chunk_first, self.chunk_stop = first[long_enough], stop[long_enough]

    def _pack(self, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """Greedy chunks of whole units, at most max_tokens long, never crossing a document.

        Each round advances every document by one chunk (vectorised over documents), so the number of rounds
        is the largest number of chunks in one document."""
        cur = self.doc_first[self.docs_with_text].copy()
        stop = self.doc_stop[self.docs_with_text]
        firsts, stops = [], []
        while len(cur):
            limit = self.unit_start[cur] + max_tokens
            nxt = np.searchsorted(self.unit_end, limit, side="right")  # first unit ending after the limit
            nxt = np.clip(nxt, cur + 1, stop)  # at least one unit (a unit is at most max_tokens long)
            firsts.append(cur)
            stops.append(nxt)
            keep = nxt < stop
            cur, stop = nxt[keep], stop[keep]
        if not firsts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        first, last = np.concatenate(firsts), np.concatenate(stops)
        order = np.argsort(first, kind="stable")  # stream order
        return first[order], last[order]

    @property
    def chunk_start(self) -> np.ndarray:
        return self.unit_start[self.chunk_first]

    @property
    def chunk_end(self) -> np.ndarray:
        return self.unit_end[self.chunk_stop - 1]


class ChunkLoader:
    """Shared batching of the sentence loaders: shuffled epochs, rank slices, exact resume, eval passes."""

    def __init__(self, data_dir: Path, split: str, seq_len: int, batch_size: int, *, rank: int, world_size: int,
                 seed: int, max_tokens: int, end_ids: np.ndarray, min_tokens: int = 1) -> None:  # fmt: skip
        if seq_len < 5 or batch_size < 1:
            raise LMForgeError(f"seq_len must be at least 5 and batch_size positive, got {seq_len} and {batch_size}")
        if not 0 <= rank < world_size:
            raise LMForgeError(f"rank {rank} is outside world_size {world_size}")
        self.data_dir, self.split = Path(data_dir), split
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.rank, self.world_size = rank, world_size
        meta = read_meta(self.data_dir)
        self.tokens = open_tokens(self.data_dir, split, meta)  # type: ignore[arg-type]
        doc_starts = read_doc_index(self.data_dir, split, len(self.tokens), meta)
        if len(self.tokens) == 0 or len(doc_starts) == 0:
            raise LMForgeError(f"{self.data_dir} {split} split is empty")
        self.index = SentenceIndex(np.asarray(self.tokens), doc_starts, end_ids, max_tokens, min_tokens)
        self.n_examples = len(self.index.chunk_first)
        self.global_batch = batch_size * world_size
        self.batches_per_epoch = self.n_examples // self.global_batch
        self.max_tokens = max_tokens
        if self.batches_per_epoch == 0 and split == "train":  # validation scores what there is (`eval_global`)
            raise LMForgeError(self._too_small())
        self.epoch = self.batch = 0
        self._perm: np.ndarray | None = None

    def examples(self, chunks: np.ndarray, rng: np.random.Generator) -> dict[str, torch.Tensor] | torch.Tensor:
        """The batch built from chunk ids (n,), drawing every random choice from rng."""
        raise NotImplementedError

    def _rows(self, chunks: np.ndarray, rng: np.random.Generator, mine: slice):
        full = self.examples(chunks, rng)  # the whole global batch: identical on every rank
        return full[mine] if isinstance(full, torch.Tensor) else {k: v[mine] for k, v in full.items()}

    def __iter__(self) -> ChunkLoader:
        return self

    def _too_small(self) -> str:
        return (f"{self.data_dir} {self.split} split has {self.n_examples} sentence chunks of at most "
                f"{self.max_tokens} tokens, need at least batch_size*world_size = {self.global_batch}")  # fmt: skip

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.batches_per_epoch == 0:
            raise LMForgeError(self._too_small())
        if self._perm is None:
            self._perm = np.random.default_rng(self.seed + self.epoch).permutation(self.n_examples)
        lo = self.batch * self.global_batch
        rng = np.random.default_rng([self.seed, self.epoch, self.batch])
        mine = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        out = self._rows(self._perm[lo : lo + self.global_batch], rng, mine)
        self.batch += 1
        if self.batch == self.batches_per_epoch:  # drop the incomplete tail, roll over
            self.epoch, self.batch, self._perm = self.epoch + 1, 0, None
        return out

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch, "batch": self.batch, "seed": self.seed, "seq_len": self.seq_len,
            "global_batch": self.global_batch, "n_examples": self.n_examples,
        }  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        """Resume exactly where `state` was taken (the world size may change, the global batch not)."""
        self.epoch, self.batch = resume_position(self, state, ("seed", "seq_len", "global_batch", "n_examples"))
        self._perm = None

    def eval_global(self, max_batches: int | None = None) -> Iterator[tuple[dict[str, torch.Tensor], slice]]:
        """Chunks in stream order, a global batch at a time (the same examples on every rank and every call), with
        the slice of its rows that is this rank's (possibly empty in the last batch)."""
        n_global = -(-self.n_examples // self.global_batch)
        if max_batches is not None:
            n_global = min(n_global, max_batches)
        for i in range(n_global):
            lo, hi = i * self.global_batch, min((i + 1) * self.global_batch, self.n_examples)
            rng = np.random.default_rng([self.seed, 1 << 30, i])
            yield self.examples(np.arange(lo, hi), rng), rank_rows(hi - lo, self.rank, self.world_size)

    def eval_batches(self, max_batches: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's rows of `eval_global`'s batches."""
        return rank_batches(self.eval_global(max_batches))


def gather_rows(tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int, fill: int) -> np.ndarray:
    """(n, width) rows: tokens[starts[i] : starts[i] + lengths[i]] then `fill`, in one fancy-index read."""
    j = np.arange(width)[None, :]
    inside = j < lengths[:, None]
    idx = np.where(inside, starts[:, None] + j, 0)
    return np.where(inside, tokens[idx], fill).astype(np.int64)


class DocChunkLoader(ChunkLoader):
    """RoBERTa §4.2 DOC-SENTENCES: whole sentences of one document (never crossing a document boundary) up to
    seq_len - 2 tokens, yielded like TokenLoader windows, (B, seq_len + 1), right-padded with pad_id; the
    objective's framing adds [CLS]/[SEP] and the attention mask. (RoBERTa also raises the batch size for the
    shorter inputs near document ends; here the batch size stays fixed.)"""

    def __init__(self, data_dir: Path, split: str, seq_len: int, batch_size: int, *, pad_id: int, **kw) -> None:
        self.pad_id = pad_id
        super().__init__(data_dir, split, seq_len, batch_size, max_tokens=seq_len - 2, **kw)

    def examples(self, chunks: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
        ix = self.index
        start, end = ix.chunk_start[chunks], ix.chunk_end[chunks]
        return torch.from_numpy(gather_rows(self.tokens, start, end - start, self.seq_len + 1, self.pad_id))


class SentencePairLoader(ChunkLoader):
    """BERT §3.1 Task #2 inputs "[CLS] A [SEP] B [SEP]" (segment ids 0 for [CLS] A [SEP], 1 for B [SEP]).

    A is the first 1..n-1 sentences of a chunk (a chunk of one sentence is split at a random token). NSP: with
    probability 1/2 B is the rest of the chunk (IsNext, label 0), else text of a random other document starting
    at a random sentence (NotNext, label 1). SOP (ALBERT §4.1, `task="sop"`): B is always the rest of the chunk
    and with probability 1/2 the two segments are swapped (label 1). Chunks hold at most seq_len - 3 tokens and a
    random B is cut to the room A leaves, so pairs always fit and no truncation is needed."""

    def __init__(self, data_dir: Path, split: str, seq_len: int, batch_size: int, *, cls_id: int, sep_id: int,
                 pad_id: int, task: Literal["nsp", "sop"] = "nsp", **kw) -> None:  # fmt: skip
        if task not in ("nsp", "sop"):
            raise LMForgeError(f"sentence-pair task must be 'nsp' or 'sop', got {task!r}")
        self.cls_id, self.sep_id, self.pad_id, self.task = cls_id, sep_id, pad_id, task
        super().__init__(data_dir, split, seq_len, batch_size, max_tokens=seq_len - 3, min_tokens=2, **kw)
        if task == "nsp" and len(self.index.docs_with_text) < 2:
            raise LMForgeError(
                f"{self.data_dir} {split} split has fewer than 2 documents, and NSP draws NotNext segments from "
                "other documents (use more documents, a larger data.val_fraction, or sentence-order prediction: "
                "objective.name=albert)"
            )

    def examples(self, chunks: np.ndarray, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        return self.pairs(chunks, rng)

    def pairs(
        self, chunks: np.ndarray, rng: np.random.Generator, negatives: np.ndarray | None = None
    ) -> dict[str, torch.Tensor]:
        """Pairs of the chunks; `negatives` (n,) bool: rows that may get a negative (default: all)."""
        ix, n = self.index, len(chunks)
        first, stop = ix.chunk_first[chunks], ix.chunk_stop[chunks]
        c_start, c_end = ix.unit_start[first], ix.unit_end[stop - 1]
        u = rng.random((4, n))
        units = stop - first
        split_unit = np.minimum(first + 1 + (u[0] * (units - 1)).astype(np.int64), len(ix.unit_start) - 1)
        split_tok = c_start + 1 + (u[0] * (c_end - c_start - 1)).astype(np.int64)
        split = np.where(units >= 2, ix.unit_start[split_unit], split_tok)
        a_start, a_len = c_start, split - c_start
        b_start, b_len = split, c_end - split
        label = (u[1] < 0.5).astype(np.int64)
        if negatives is not None:
            label = label * negatives
        if self.task == "sop":  # swapped segments are the negatives
            swap = label.astype(bool)
            a_start, b_start = np.where(swap, b_start, a_start), np.where(swap, a_start, b_start)
            a_len, b_len = np.where(swap, b_len, a_len), np.where(swap, a_len, b_len)
        else:  # NSP: negatives take B from a random other document
            r_start, r_len = self._random_segments(chunks, u[2], u[3], self.seq_len - 3 - a_len)
            b_start, b_len = np.where(label == 1, r_start, b_start), np.where(label == 1, r_len, b_len)
        return self._assemble(a_start, a_len, b_start, b_len, label)

    def _random_segments(self, chunks: np.ndarray, u_doc: np.ndarray, u_unit: np.ndarray, room: np.ndarray):
        """(start, length) of text from a random other document, from a random sentence, at most `room` long."""
        ix = self.index
        docs = ix.docs_with_text
        own = np.searchsorted(docs, ix.unit_doc[ix.chunk_first[chunks]])
        other = docs[(own + 1 + (u_doc * (len(docs) - 1)).astype(np.int64)) % len(docs)]
        unit = ix.doc_first[other] + (u_unit * (ix.doc_stop[other] - ix.doc_first[other])).astype(np.int64)
        start = ix.unit_start[unit]
        return start, np.minimum(room, ix.doc_end[other] - start)

    def _assemble(self, a_start, a_len, b_start, b_len, label) -> dict[str, torch.Tensor]:
        """Index arithmetic to (n, seq_len) rows "[CLS] A [SEP] B [SEP] [PAD]..." in one gather."""
        j = np.arange(self.seq_len)[None, :]
        a_len, b_len = a_len[:, None], b_len[:, None]
        in_a = (j >= 1) & (j <= a_len)
        in_b = (j >= a_len + 2) & (j <= a_len + b_len + 1)
        idx = np.where(in_a, a_start[:, None] + j - 1, np.where(in_b, b_start[:, None] + j - a_len - 2, 0))
        ids = np.where(in_a | in_b, self.tokens[idx], self.pad_id).astype(np.int64)
        ids = np.where((j == a_len + 1) | (j == a_len + b_len + 2), self.sep_id, ids)
        ids[:, 0] = self.cls_id
        return {
            "input_ids": torch.from_numpy(ids),
            "token_type_ids": torch.from_numpy(((j >= a_len + 2) & (j <= a_len + b_len + 2)).astype(np.int64)),
            "attention_mask": torch.from_numpy((j <= a_len + b_len + 2).astype(np.int64)),
            "sentence_label": torch.from_numpy(label),
        }
