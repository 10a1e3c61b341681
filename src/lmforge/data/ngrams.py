"""Word n-grams for overlap checks between texts, shared by the corpus pipeline (decontamination) and the fetch
recipes (a corpus built without the sentences of a labelled set's held-out splits)."""

from __future__ import annotations

import re

_WORD = re.compile(r"\w+")


def word_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """The lower-cased word n-grams of ``text`` (words: runs of letters and digits), for overlap checks of a
    pretraining corpus against held-out evaluation texts (as GPT-3's 13-gram decontamination, with any n)."""
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}
