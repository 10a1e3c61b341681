"""C4 cleaning rules and MinHash near-duplicate removal on hand-made documents."""

from __future__ import annotations

import random

from lmforge.data.clean import CleanConfig, NearDuplicateIndex, clean_documents, count_sentences, word_ngrams

GOOD = [
    "The river ran quietly past the old mill at dawn.",
    "Nobody in the village could remember when it was built.",
    "Children played on its steps every summer afternoon.",
    "The miller's daughter kept the wheel turning for years.",
    "Now the roof has fallen in and ivy covers the walls.",
]


def _doc(*extra: str) -> str:
    return "\n".join(GOOD + list(extra))


def _words(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(3000)]
    return [rng.choice(vocab) for _ in range(n)]


def test_line_rules_each_remove_what_they_should() -> None:
    doc = _doc(
        "A heading without punctuation",
        "Too short.",
        "function f() { return 1; } is code.",
        "Please enable JavaScript to view this page.",
        'He said, "this line ends with a quote."',
    )
    kept, counts = clean_documents([doc])
    assert kept == [_doc('He said, "this line ends with a quote."')]
    assert counts["lines_no_terminal_punctuation"] == 1
    assert counts["lines_too_few_words"] == 1
    assert counts["lines_curly_bracket"] == 1
    assert counts["lines_javascript"] == 1
    assert counts["docs_in"] == counts["docs_out"] == 1


def test_document_rules() -> None:
    lorem = _doc("Lorem ipsum dolor sit amet, consectetur adipiscing elit.")
    short = "\n".join(GOOD[:4])  # 4 sentences < 5
    kept, counts = clean_documents([lorem, short, _doc()])
    assert kept == [_doc()]
    assert counts["docs_lorem_ipsum"] == 1
    assert counts["docs_too_few_sentences"] == 1
    assert (counts["docs_in"], counts["docs_out"]) == (3, 1)


def test_sentence_count_after_line_filtering_decides() -> None:
    # Five sentences, but two are on lines without terminal punctuation → three remain → dropped.
    doc = "\n".join(GOOD[:3] + ["One more sentence. And another one here", "Trailing words without end"])
    assert count_sentences(doc) == 4
    kept, counts = clean_documents([doc], CleanConfig(min_sentences=4))
    assert kept == [] and counts["docs_too_few_sentences"] == 1


def test_exact_duplicates_removed_whitespace_insensitive() -> None:
    a = _doc()
    b = a.replace(" ", "  ") + "\n\n"
    kept, counts = clean_documents([a, b, a])
    assert kept == [a]
    assert counts["docs_exact_duplicate"] == 2


def test_near_duplicate_caught_distinct_kept() -> None:
    words = _words(400, seed=1)
    edited = list(words)
    for i in (50, 150, 250, 350):  # four single-word edits
        edited[i] = "changed"
    index = NearDuplicateIndex()
    assert index.similarity(" ".join(words), " ".join(edited)) > 0.8
    assert index.add_if_new(" ".join(words))
    assert not index.add_if_new(" ".join(edited))
    for seed in range(2, 12):  # unrelated texts of the same vocabulary are all kept
        assert index.add_if_new(" ".join(_words(400, seed)))
    assert len(index.sigs) == 11


def test_near_duplicate_rule_in_clean_documents() -> None:
    def as_doc(words: list[str]) -> str:
        return "\n".join(" ".join(words[i : i + 20]) + "." for i in range(0, len(words), 20))

    base = _words(300, seed=7)
    edited = base[:100] + ["different"] + base[101:]
    other = _words(300, seed=8)
    kept, counts = clean_documents([as_doc(base), as_doc(edited), as_doc(other)])
    assert kept == [as_doc(base), as_doc(other)]
    assert counts["docs_near_duplicate"] == 1
    assert counts["docs_exact_duplicate"] == 0


def test_minhash_similarity_tracks_jaccard() -> None:
    # Halves share no shingles → similarity near 0; identical → exactly 1.
    index = NearDuplicateIndex()
    a, b = " ".join(_words(300, 21)), " ".join(_words(300, 22))
    assert index.similarity(a, a) == 1.0
    assert index.similarity(a, b) < 0.1


def test_word_ngrams_lowercase_words_only() -> None:
    assert word_ngrams("One of the BEST, films!", 3) == {
        ("one", "of", "the"),
        ("of", "the", "best"),
        ("the", "best", "films"),
    }
    assert word_ngrams("too short", 3) == set()
