"""A bounded, deterministic sample of training text for tokenizer training.

Unigram training (Kudo 2018) in `tokenizers` runs EM over every distinct word of its input, once per pruning round
(about 25 rounds for a 512-token vocabulary), so its time grows with the text: the 9M characters of the bundled corpus
took ~6 minutes and 700 MB at 512 tokens. A sample of a hundred characters per vocabulary entry learns the same
kind of vocabulary in seconds (SentencePiece samples its input the same way, `input_sentence_size`).

The sample is a bottom-k sample by content hash: the text is cut into units of whole paragraphs of up to
`UNIT_CHARS` characters, each unit gets the key blake2b(seed, unit), and the units with the smallest keys are kept
until the character budget is full. It is read in one pass with memory bounded by the budget, does not depend on the
order of the input, and the same input always gives the same sample (so a trained tokenizer can be cached by it).
"""

from __future__ import annotations

import hashlib
import heapq
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

UNIT_CHARS = 4096
"""Longest sampled unit: whole blank-line paragraphs up to this many characters (a longer one is cut at spaces)."""
CHARS_PER_TOKEN = 100
"""Default unigram sample: this many characters per vocabulary entry ..."""
MIN_SAMPLE_CHARS = 500_000
"""... and at least this many. On the bundled corpus at 512 tokens, samples of 0.3M, 0.5M and 1M characters give
2.23, 2.30 and 2.31 characters a token on held-out chapters, and training time grows with the sample."""
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")


def units(text: str, limit: int = UNIT_CHARS) -> Iterator[str]:
    """`text` as runs of whole blank-line paragraphs of at most `limit` characters (a paragraph longer than that is
    cut at the last space before the limit, or at the limit)."""
    if len(text) <= limit:
        if text.strip():
            yield text
        return
    run: list[str] = []
    size = 0
    for para in _BLANK_LINE.split(text):
        if run and len(para) > limit:
            yield "\n\n".join(run)
            run, size = [], 0
        while len(para) > limit:
            cut = para.rfind(" ", 0, limit) + 1 or limit
            yield para[:cut]
            para = para[cut:]
        if run and size + len(para) > limit:
            yield "\n\n".join(run)
            run, size = [], 0
        if para.strip():
            run.append(para)
            size += len(para) + 2
    if run:
        yield "\n\n".join(run)


@dataclass
class TextSample:
    """The texts to train on and how they were chosen (recorded with the tokenizer)."""

    texts: list[str]
    chars_seen: int = 0
    """Characters of the whole input."""
    chars_used: int = 0
    """Characters of `texts`."""
    budget: int = 0
    """Character budget (0: no sampling)."""
    seed: int = 0
    sampled: bool = False
    """False when the whole input fit the budget and `texts` are the input's texts unchanged."""
    _heap: list = field(default_factory=list, repr=False)

    def info(self) -> dict:
        """What a tokenizer's metadata records about its training text."""
        return {"chars_seen": self.chars_seen, "chars_used": self.chars_used, "sample_chars": self.budget,
                "sample_seed": self.seed, "sampled": self.sampled, "unit_chars": UNIT_CHARS}  # fmt: skip


def sample_texts(texts: Iterable[str], budget: int, seed: int = 0, on_text=None) -> TextSample:
    """Read `texts` once and keep at most `budget` characters of them (see the module docstring); the texts
    unchanged when they fit. `on_text(n_chars)` is called after each text (progress)."""
    out = TextSample([], budget=budget, seed=seed)
    whole: list[str] | None = []  # the input as given, while it fits the budget
    heap: list[tuple[int, int, str]] = []  # max-heap of kept units by key: (-key, -order, unit)
    prefix = seed.to_bytes(8, "little", signed=False)
    kept, order = 0, 0
    for text in texts:
        out.chars_seen += len(text)
        if whole is not None:
            whole.append(text)
            if out.chars_seen > budget:
                whole = None
        for unit in units(text):
            digest = hashlib.blake2b(prefix + unit.encode("utf-8", "surrogatepass"), digest_size=8).digest()
            key = int.from_bytes(digest, "little")
            order += 1
            if kept + len(unit) > budget and heap and -heap[0][0] <= key:
                continue  # larger than every kept key while the budget is full: never kept
            heapq.heappush(heap, (-key, -order, unit))
            kept += len(unit)
            while kept > budget:
                kept -= len(heapq.heappop(heap)[2])
        if on_text is not None:
            on_text(len(text))
    if whole is not None:
        out.texts, out.chars_used = whole, out.chars_seen
    else:
        out.texts = [u for _, _, u in sorted(heap, key=lambda e: -e[1])]  # input order
        out.chars_used, out.sampled = kept, True
    return out
