"""Heuristic web-text cleaning after C4 (Raffel et al. 2020, §2.2) plus exact and near-duplicate removal.

Line rules (a line is removed by the first rule that matches): a curly bracket (code), the word
"javascript", no terminal punctuation at the end, fewer than ``min_words_per_line`` words.
Document rules: "lorem ipsum" anywhere, fewer than ``min_sentences`` sentences after line filtering,
an exact duplicate of a kept document, or a near duplicate (MinHash LSH over word shingles, Broder
1997; estimated Jaccard similarity >= ``near_dup_threshold``) of a kept document. The first copy is kept.

Differences from C4: C4 drops the whole page for a curly bracket; here only the line goes (prose
pages that quote one line of code survive). The bad-words list is not applied. C4 deduplicates
three-sentence spans; here whole documents are deduplicated.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$)")
_WORD = re.compile(r"\w+")
_MASK32 = np.uint64(0xFFFFFFFF)
_CHUNK = 8192  # shingles hashed at once: bounds the (num_perm, chunk) uint64 scratch to 8 MiB


@dataclass(frozen=True)
class CleanConfig:
    """Thresholds of the cleaning rules (defaults follow C4)."""

    min_words_per_line: int = 3
    """Lines with fewer whitespace-separated words are removed."""
    min_sentences: int = 5
    """Documents with fewer sentences (after line filtering) are removed."""
    terminal_punctuation: tuple[str, ...] = (".", "!", "?", '"', "'", "”", "’")
    """A kept line must end with one of these."""
    near_dup_threshold: float = 0.8
    """Estimated Jaccard similarity of word shingles at or above which a document is a near duplicate."""
    shingle_words: int = 5
    """Words per shingle."""
    num_perm: int = 128
    """MinHash signature length."""
    bands: int = 16
    """LSH bands of num_perm / bands rows; 16 x 8 makes a pair of Jaccard 0.8 a candidate 95% of the time."""
    seed: int = 0
    """Seed of the MinHash hash functions."""


RULES = (
    "lines_curly_bracket",
    "lines_javascript",
    "lines_no_terminal_punctuation",
    "lines_too_few_words",
    "docs_lorem_ipsum",
    "docs_too_few_sentences",
    "docs_exact_duplicate",
    "docs_near_duplicate",
)


def count_sentences(text: str) -> int:
    """Number of sentence ends (runs of . ! ? followed by optional closing quotes, then space or end)."""
    return len(_SENTENCE_END.findall(text))


def word_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """The lower-cased word n-grams of ``text`` (words: runs of letters and digits), for overlap checks of a
    pretraining corpus against held-out evaluation texts (as GPT-3's 13-gram decontamination, with any n)."""
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def clean_lines(doc: str, cfg: CleanConfig, counts: dict[str, int]) -> str:
    """Apply the C4 line rules to ``doc``; blank lines are dropped without being counted."""
    kept = []
    for line in doc.splitlines():
        line = line.strip()
        if not line:
            continue
        if "{" in line:
            counts["lines_curly_bracket"] += 1
        elif "javascript" in line.lower():
            counts["lines_javascript"] += 1
        elif not line.endswith(cfg.terminal_punctuation):
            counts["lines_no_terminal_punctuation"] += 1
        elif len(line.split()) < cfg.min_words_per_line:
            counts["lines_too_few_words"] += 1
        else:
            kept.append(line)
    return "\n".join(kept)


class MinHasher:
    """MinHash signatures of word-shingle sets, vectorised over shingles and hash functions."""

    def __init__(self, num_perm: int = 128, shingle_words: int = 5, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        # Multiply-add-shift hashing mod 2^64 (Dietzfelbinger 1996); odd multipliers, top 32 bits kept.
        self.a = rng.integers(1, 2**63, size=(num_perm, 1), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self.b = rng.integers(0, 2**63, size=(num_perm, 1), dtype=np.uint64)
        self.mix = rng.integers(1, 2**63, size=shingle_words, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self.k = shingle_words

    def shingles(self, text: str) -> np.ndarray:
        """Unique 64-bit hashes of the word k-shingles of ``text`` (lower-cased, punctuation ignored)."""
        words = _WORD.findall(text.lower())
        w = np.fromiter((zlib.crc32(x.encode()) for x in words), dtype=np.uint64, count=len(words))
        if len(w) == 0:
            return w
        k = min(self.k, len(w))
        n = len(w) - k + 1
        h = np.zeros(n, dtype=np.uint64)
        with np.errstate(over="ignore"):  # wrap-around mod 2^64 is intended
            for j in range(k):  # k (= 5) vectorised passes, not a loop over words
                h = h * np.uint64(0x100000001B3) + w[j : j + n] * self.mix[j]
        return np.unique(h)

    def signature(self, text: str) -> np.ndarray:
        """(num_perm,) uint32 MinHash signature; all-ones for a text without words."""
        x = self.shingles(text)
        sig = np.full(self.a.shape[0], 0xFFFFFFFF, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for i in range(0, len(x), _CHUNK):
                hv = (self.a * x[None, i : i + _CHUNK] + self.b) >> np.uint64(32)  # (num_perm, chunk)
                sig = np.minimum(sig, hv.min(axis=1))
        return (sig & _MASK32).astype(np.uint32)


class NearDuplicateIndex:
    """LSH index over MinHash signatures: ``add_if_new`` keeps a text unless it near-duplicates a kept one."""

    def __init__(self, cfg: CleanConfig | None = None) -> None:
        self.cfg = cfg or CleanConfig()
        if self.cfg.num_perm % self.cfg.bands:
            raise ValueError("num_perm must be a multiple of bands")
        self.hasher = MinHasher(self.cfg.num_perm, self.cfg.shingle_words, self.cfg.seed)
        self.rows = self.cfg.num_perm // self.cfg.bands
        self.buckets: dict[bytes, list[int]] = {}
        self.sigs: list[np.ndarray] = []

    def similarity(self, a: str, b: str) -> float:
        """Estimated Jaccard similarity of the shingle sets of two texts."""
        return float(np.mean(self.hasher.signature(a) == self.hasher.signature(b)))

    def add_if_new(self, text: str) -> bool:
        """Index ``text`` and return True, or return False if a kept text is a near duplicate."""
        sig = self.hasher.signature(text)
        r = self.rows
        keys = [bytes([b]) + sig[b * r : (b + 1) * r].tobytes() for b in range(self.cfg.bands)]
        candidates = {i for key in keys for i in self.buckets.get(key, ())}
        for i in sorted(candidates):
            if np.mean(self.sigs[i] == sig) >= self.cfg.near_dup_threshold:
                return False
        for key in keys:
            self.buckets.setdefault(key, []).append(len(self.sigs))
        self.sigs.append(sig)
        return True


class Cleaner:
    """The cleaning rules applied one document at a time (streaming): `clean(doc)` is the cleaned text, or None when
    a rule removes the document; `counts` holds removals per rule and docs_in / docs_out. Remembers a hash and a
    MinHash signature of each kept document (for the duplicate rules), not the documents."""

    def __init__(self, cfg: CleanConfig | None = None) -> None:
        self.cfg = cfg or CleanConfig()
        self.counts = dict.fromkeys(RULES, 0) | {"docs_in": 0, "docs_out": 0}
        self.seen: set[bytes] = set()
        self.near = NearDuplicateIndex(self.cfg)

    def clean(self, doc: str) -> str | None:
        counts = self.counts
        counts["docs_in"] += 1
        if "lorem ipsum" in doc.lower():
            counts["docs_lorem_ipsum"] += 1
            return None
        text = clean_lines(doc, self.cfg, counts)
        if count_sentences(text) < self.cfg.min_sentences:
            counts["docs_too_few_sentences"] += 1
            return None
        digest = hashlib.blake2b(" ".join(text.split()).encode(), digest_size=16).digest()
        if digest in self.seen:
            counts["docs_exact_duplicate"] += 1
            return None
        self.seen.add(digest)
        if not self.near.add_if_new(text):
            counts["docs_near_duplicate"] += 1
            return None
        counts["docs_out"] += 1
        return text


def clean_documents(docs: Iterable[str], cfg: CleanConfig | None = None) -> tuple[list[str], dict[str, int]]:
    """Clean ``docs`` with the C4 rules and deduplicate; return (kept docs, removals per rule).

    The counts also hold ``docs_in`` and ``docs_out``.
    """
    cleaner = Cleaner(cfg)
    kept = [text for text in map(cleaner.clean, docs) if text is not None]
    return kept, cleaner.counts
