"""MinHash signatures of word-shingle sets (Broder 1997), vectorised over shingles and hash functions: the estimated
Jaccard similarity of two texts is the fraction of equal signature entries (``lmforge.data.fetch.mix`` finds
near-duplicate paragraphs with it)."""

from __future__ import annotations

import re
import zlib

import numpy as np

_WORD = re.compile(r"\w+")
_MASK32 = np.uint64(0xFFFFFFFF)
_CHUNK = 8192  # shingles hashed at once: bounds the (num_perm, chunk) uint64 scratch to 8 MiB


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

    def similarity(self, a: str, b: str) -> float:
        """Estimated Jaccard similarity of the shingle sets of two texts."""
        return float(np.mean(self.signature(a) == self.signature(b)))
