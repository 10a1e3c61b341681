"""Mixes of fetched corpora, deduplicated across corpora paragraph by paragraph.

A paragraph (a block of text between blank lines) is dropped when it repeats a kept paragraph exactly (after
lower-casing and ignoring punctuation and spacing) or nearly: MinHash over word 5-shingles with LSH banding
(Broder 1997), estimated Jaccard similarity >= 0.8, for paragraphs of at least `min_near_words` words (shorter
ones carry too few shingles for the estimate to mean much). The first copy is kept, in the order the corpora
are given. A document left without paragraphs is dropped; the others keep their remaining paragraphs, so
sources shared by two packages (State of the Union sentences in nlp-corpus, say) appear once.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lmforge.data.fetch.minhash import MinHasher
from lmforge.data.fetch.sources import Record
from lmforge.progress import progress, status

_WORD = re.compile(r"\w+")
_PARAGRAPH = re.compile(r"\n\s*\n")


@dataclass
class ParagraphDeduper:
    """Exact and near-duplicate paragraph filter with a compact LSH index (one 64-bit key per band)."""

    threshold: float = 0.8
    num_perm: int = 64
    bands: int = 16
    """16 bands of 4 rows: a pair with Jaccard 0.8 becomes a candidate with probability 1 - (1 - 0.8^4)^16 > 0.999."""
    min_near_words: int = 10
    counts: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.hasher = MinHasher(self.num_perm, 5, seed=0)
        self.rows = self.num_perm // self.bands
        self.exact: set[bytes] = set()
        self.buckets: dict[int, int] = {}  # band key → index of the first paragraph that had it
        self.sigs: list[np.ndarray] = []

    def keep(self, paragraph: str) -> bool:
        """True for a paragraph seen for the first time (it is then indexed), False for a duplicate."""
        words = _WORD.findall(paragraph.lower())
        if not words:
            self.counts["empty"] += 1
            return False
        digest = hashlib.blake2b(" ".join(words).encode(), digest_size=12).digest()
        if digest in self.exact:
            self.counts["exact_duplicate"] += 1
            return False
        self.exact.add(digest)
        if len(words) < self.min_near_words:
            self.counts["kept"] += 1
            return True
        sig = self.hasher.signature(paragraph)
        keys = [hash((b, sig[b * self.rows : (b + 1) * self.rows].tobytes())) for b in range(self.bands)]
        for i in dict.fromkeys(self.buckets[k] for k in keys if k in self.buckets):
            if np.mean(self.sigs[i] == sig) >= self.threshold:
                self.counts["near_duplicate"] += 1
                return False
        n = len(self.sigs)
        self.sigs.append(sig)
        for k in keys:
            self.buckets.setdefault(k, n)
        self.counts["kept"] += 1
        return True


def read_fetched(directory: Path) -> Iterator[Record]:
    """The records of a fetched corpus directory (`docs.jsonl`)."""
    with open(directory / "docs.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def mix_records(corpora: list[tuple[str, Path]], deduper: ParagraphDeduper | None = None) -> Iterator[Record]:
    """The documents of each (name, fetched dir), in order, with duplicate paragraphs removed; sources become
    "<name>/<source>". Per-corpus counts of kept and dropped paragraphs go to a status line at the end."""
    dedup = deduper or ParagraphDeduper()
    per_corpus: dict[str, Counter] = {}
    for name, directory in corpora:
        before = Counter(dedup.counts)
        n_docs = sum(1 for _ in open(directory / "docs.jsonl", encoding="utf-8"))
        for record in progress(read_fetched(directory), total=n_docs, desc=f"deduplicating {name}", unit=" docs"):
            kept = [p.strip() for p in _PARAGRAPH.split(record["text"]) if dedup.keep(p.strip())]
            if kept:
                yield {"text": "\n\n".join(kept), "source": f"{name}/{record['source']}"}
        per_corpus[name] = dedup.counts - before
    for name, c in per_corpus.items():
        dropped = c["exact_duplicate"] + c["near_duplicate"]
        status(f"  {name}: kept {c['kept']:,} paragraphs, dropped {dropped:,} duplicates "
               f"({c['exact_duplicate']:,} exact, {c['near_duplicate']:,} near)")  # fmt: skip
