"""C4's deduplication, streaming: the first occurrence is kept, later ones are removed.

``spans`` (the paper, Raffel et al. 2020 §2.2: "we discarded all but one of any three-sentence span occurring more
than once in the data set"): a page is split into sentences (across its lines) and every window of three consecutive
sentences is hashed (lower-cased, white space collapsed); a window seen on an earlier kept page, or earlier on the
same page, removes its three sentences. The sentences either side of a cut form new windows, checked the same way
until none repeats: no three-sentence span occurs twice in the kept text. ``lines`` (what tensorflow/datasets'
c4_utils ``remove_duplicate_text`` does): a line (stripped, lower-cased) kept on an earlier page, or earlier on the
same page, is removed. The reference chooses which copy stays by a hash of the page URLs; a stream keeps the first.

Memory is one 64-bit hash per kept window (or line) in a set: a page's hashes join it only when the page is kept, so
a pass over only the kept pages, in order, rebuilds the same set and removes the same text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Literal

from lmforge.data.corpus.c4_rules import split_sentences

DedupUnit = Literal["spans", "lines", "none"]


def _digest(keys: Iterable[str]) -> int:
    """64-bit hash of normalised (lower-cased, single-spaced) texts."""
    key = "\n".join(keys)
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


class Deduplicator:
    """Removes text seen on earlier kept pages. ``dedup(lines)`` proposes a page's surviving lines; ``keep()`` commits
    the proposal's hashes once the caller keeps the page (a page dropped later adds nothing to the index)."""

    def __init__(self, unit: DedupUnit = "spans", span: int = 3) -> None:
        if unit not in ("spans", "lines", "none"):
            raise ValueError(f"dedup unit must be 'spans', 'lines' or 'none', not {unit!r}")
        if span < 1:
            raise ValueError(f"span must be at least 1 sentence, not {span}")
        self.unit, self.span = unit, span
        self.seen: set[int] = set()
        self._pending: list[int] = []

    def dedup(self, lines: list[str]) -> tuple[list[str], int]:
        """(the page's lines with duplicates removed, the number of sentences or lines removed)."""
        if self.unit == "spans":
            return self._spans(lines)
        if self.unit == "lines":
            return self._lines(lines)
        self._pending = []
        return lines, 0

    def keep(self) -> None:
        """Remember the last proposed page's text: later copies of it will be removed."""
        self.seen.update(self._pending)
        self._pending = []

    def _spans(self, lines: list[str]) -> tuple[list[str], int]:
        sentences = [(i, s) for i, line in enumerate(lines) for s in split_sentences(line)]
        keys = [" ".join(s.lower().split()) for _, s in sentences]
        k = self.span
        alive = list(range(len(sentences)))
        while True:
            # Cutting a span joins the sentences around it into new spans: check again until none repeats, so that
            # no span of the kept text is one seen before, and every span of it is remembered.
            hashes = [_digest(keys[a] for a in alive[j : j + k]) for j in range(len(alive) - k + 1)]
            removed = bytearray(len(alive))
            on_page: set[int] = set()
            for j, h in enumerate(hashes):
                if h in self.seen or h in on_page:
                    removed[j : j + k] = b"\x01" * k
                else:
                    on_page.add(h)
            if not any(removed):
                break
            alive = [a for a, r in zip(alive, removed) if not r]
        self._pending = hashes
        rebuilt: list[list[str]] = [[] for _ in lines]
        for a in alive:
            i, s = sentences[a]
            rebuilt[i].append(s)
        return [" ".join(parts) for parts in rebuilt if parts], len(sentences) - len(alive)

    def _lines(self, lines: list[str]) -> tuple[list[str], int]:
        kept, pending = [], set()
        for line in lines:
            h = _digest([" ".join(line.lower().split())])
            if h in self.seen or h in pending:
                continue
            pending.add(h)
            kept.append(line)
        self._pending = list(pending)
        return kept, len(lines) - len(kept)
