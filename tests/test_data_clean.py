"""Cleaning's building blocks: the sentence splitter, span deduplication's guarantee on a random corpus, word n-grams
and MinHash (the C4 rules themselves: tests/test_c4_clean.py)."""

from __future__ import annotations

import random

import pytest

from lmforge.data.corpus.c4_dedup import Deduplicator
from lmforge.data.corpus.c4_rules import count_sentences, split_sentences
from lmforge.data.corpus.clean import CleanConfig, Cleaner
from lmforge.data.fetch.minhash import MinHasher
from lmforge.data.ngrams import word_ngrams


def _words(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(3000)]
    return [rng.choice(vocab) for _ in range(n)]


def test_sentences_end_at_end_marks_but_not_after_abbreviations_or_initials() -> None:
    text = 'Mr. Smith met Dr. J. Watson at 5 p.m. on Baker Street. "Who are you?" he asked. Nobody knew! A tail'
    assert split_sentences(text) == [
        "Mr. Smith met Dr. J. Watson at 5 p.m. on Baker Street.",
        '"Who are you?"',  # Punkt ends a sentence at ? and ! before any word, as here
        "he asked.",
        "Nobody knew!",
        "A tail",  # text after the last end mark is a sentence, as Punkt counts it
    ]
    assert split_sentences("Version 2.5 is out. It fixes e.g. the loader.") == [
        "Version 2.5 is out.",
        "It fixes e.g. the loader.",
    ]
    assert split_sentences("   ") == []
    assert count_sentences("One line. Two sentences.\nA third one!\n\n") == 3


def test_no_three_sentence_span_occurs_twice_in_the_kept_text() -> None:
    """Pages drawn from a pool of 12 sentences repeat spans often; after deduplication every window of three
    consecutive kept sentences is unique across the whole output, and a page with no repeated span is untouched."""
    pool = [f"Sentence number {i} says something about topic {i}." for i in range(12)]
    rng = random.Random(0)
    pages = ["\n".join(rng.choice(pool) for _ in range(rng.randint(3, 9))) for _ in range(300)]
    dedup = Deduplicator("spans")
    windows: list[tuple[str, ...]] = []
    kept_pages = 0
    for text in pages:
        lines, removed = dedup.dedup(text.split("\n"))
        sentences = [s for line in lines for s in split_sentences(line)]
        assert removed == count_sentences(text) - len(sentences)
        if len(sentences) >= 3:
            dedup.keep()
            kept_pages += 1
            windows += [tuple(sentences[j : j + 3]) for j in range(len(sentences) - 2)]
    assert len(windows) == len(set(windows)) > 50 and kept_pages > 20
    fresh = Deduplicator("spans")
    assert fresh.dedup(pool[:6]) == (pool[:6], 0)


def test_dedup_off_and_bad_settings() -> None:
    page = "\n".join(f"Line {i} of the page says the same thing again." for i in range(5))
    cleaner = Cleaner(CleanConfig(english=False, bad_words=False, dedup="none"))
    assert cleaner.clean(page) == cleaner.clean(page) == page
    assert "sentences_duplicate" not in cleaner.counts and cleaner.counts["docs_out"] == 2
    with pytest.raises(ValueError, match="dedup unit must be"):
        Deduplicator("pages")  # type: ignore[arg-type]


def test_minhash_similarity_tracks_jaccard() -> None:
    hasher = MinHasher(num_perm=128, shingle_words=5, seed=0)
    words = _words(400, seed=1)
    edited = list(words)
    for i in (50, 150, 250, 350):  # four single-word edits
        edited[i] = "changed"
    a, b = " ".join(_words(300, 21)), " ".join(_words(300, 22))
    assert hasher.similarity(" ".join(words), " ".join(edited)) > 0.8
    assert hasher.similarity(a, a) == 1.0
    assert hasher.similarity(a, b) < 0.1


def test_word_ngrams_lowercase_words_only() -> None:
    assert word_ngrams("One of the BEST, films!", 3) == {
        ("one", "of", "the"),
        ("of", "the", "best"),
        ("the", "best", "films"),
    }
    assert word_ngrams("too short", 3) == set()
