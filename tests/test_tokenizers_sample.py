"""The bounded text sample tokenizer training reads (lmforge.tokenizers.sample)."""

from __future__ import annotations

import random

from lmforge.tokenizers.kinds import TOKENIZER_KINDS
from lmforge.tokenizers.sample import sample_texts, units

TEXTS = [f"Paragraph {i} of text {j}: " + "words and more words " * (i % 7 + 1) for j in range(40) for i in range(9)]
DOCS = ["\n\n".join(TEXTS[k : k + 9]) for k in range(0, len(TEXTS), 9)]


def test_units_are_whole_paragraphs_within_the_limit() -> None:
    long = "\n\n".join(["a" * 30, "b " * 40, "c" * 25])
    pieces = list(units(long, limit=50))
    assert all(len(p) <= 50 for p in pieces)
    assert "".join(pieces).replace("\n", "").replace(" ", "") == long.replace("\n", "").replace(" ", "")
    assert pieces[0] == "a" * 30


def test_sample_respects_the_budget_and_ignores_input_order() -> None:
    total = sum(map(len, DOCS))
    s = sample_texts(DOCS, budget=total // 4)
    assert s.sampled and s.chars_seen == total
    assert total // 4 - 400 < s.chars_used <= total // 4  # full up to one unit
    shuffled = DOCS[:]
    random.Random(1).shuffle(shuffled)
    assert sorted(sample_texts(shuffled, budget=total // 4).texts) == sorted(s.texts)
    assert sorted(sample_texts(DOCS, budget=total // 4, seed=1).texts) != sorted(s.texts)


def test_text_that_fits_is_used_unchanged() -> None:
    s = sample_texts(DOCS, budget=10**9)
    assert not s.sampled and s.texts == DOCS


def test_default_bounds_only_unigram() -> None:
    bpe, wordpiece, unigram = (TOKENIZER_KINDS[k] for k in ("bpe", "wordpiece", "unigram"))
    assert bpe.default_sample_chars(512) == 0 and wordpiece.default_sample_chars(512) == 0
    assert unigram.default_sample_chars(512) == 500_000
    assert unigram.default_sample_chars(32000) == 3_200_000
