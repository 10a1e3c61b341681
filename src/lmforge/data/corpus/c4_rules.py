"""C4's page rules (Raffel et al. 2020, §2.2), as tensorflow/datasets' c4_utils.clean_page applies them.

Each line is stripped, then, in this order (the order matters: a later rule only sees lines the earlier ones kept):

1. a word longer than ``max_word_length`` (1,000) characters removes the line;
2. Wikipedia-style citation markers (``[12]``, ``[edit]``, ``[citation needed]``) are deleted from the line;
3. a line that does not end in a terminal mark (``.`` ``?`` ``!`` ``"``), or ends in an ellipsis ``...``, is removed;
4. a line of fewer than ``min_words_per_line`` (5) whitespace-separated words is removed;
5. "lorem ipsum" (any case) removes the whole page;
6. "javascript" (any case) removes the line ("JavaScript must be enabled" notices);
7. a curly bracket ``{`` removes the whole page (code);
8. "terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies" remove the line.

A page whose kept lines hold fewer than ``min_sentences`` (3) sentences is removed. The reference counts sentences
with NLTK's English Punkt model, which it downloads at run time; :func:`split_sentences` is a rule-based stand-in
(a run of ``.!?`` and closing quotes followed by a space ends a sentence, except after a common abbreviation or a
single-letter initial), so a count can differ from Punkt's on abbreviations Punkt learned and this list lacks.
"""

from __future__ import annotations

import re

END_MARKS = (".", "?", "!", '"')
"""C4's terminal marks: period, question mark, exclamation mark, (ASCII) double quote."""
ELLIPSIS = "..."
POLICY_SUBSTRINGS = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")

LINE_RULES = (
    "lines_too_long_word",
    "lines_no_terminal_punctuation",
    "lines_too_few_words",
    "lines_javascript",
    "lines_policy",
)
PAGE_RULES = ("docs_lorem_ipsum", "docs_curly_bracket", "docs_too_few_sentences")

_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$)")
# Tokens after which a lone period does not end a sentence (Punkt's English model knows these and more).
_ABBREVIATIONS = frozenset("mr mrs ms dr prof sr jr st mt vs cf fig e.g i.e a.m p.m u.s".split())


def _after_abbreviation(text: str, dot: int) -> bool:
    """Whether the period at ``text[dot]`` closes an abbreviation or an initial rather than a sentence."""
    before = text[:dot].rsplit(None, 1)
    word = before[-1].lstrip("\"'“‘([").lower() if before else ""
    return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``: a run of ``.``, ``!`` or ``?`` (with closing quotes or brackets) followed by white
    space or the end ends one; text after the last end mark is a sentence too (as Punkt counts it)."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        if m.group().rstrip("\"'”’)]") == "." and _after_abbreviation(text, m.start()):
            continue
        piece = text[start : m.end()].strip()
        if piece:
            out.append(piece)
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def count_sentences(text: str) -> int:
    """Sentences of ``text``, counted line by line as C4 counts a page's kept lines."""
    return sum(len(split_sentences(line)) for line in text.splitlines())


def clean_page(
    page: str,
    counts: dict[str, int],
    *,
    min_words_per_line: int = 5,
    min_sentences: int = 3,
    max_word_length: int = 1000,
    end_marks: tuple[str, ...] = END_MARKS,
) -> str | None:
    """``page`` with C4's line rules applied (kept lines joined by newlines), or None when a page rule removes it.
    Each removal adds one to its rule's entry in ``counts`` (citation markers deleted: ``citation_markers``); blank
    lines go uncounted."""
    kept: list[str] = []
    n_sentences = 0
    for line in page.splitlines():
        line = line.strip()
        if not line:
            continue
        if any(len(word) > max_word_length for word in line.split()):
            counts["lines_too_long_word"] += 1
            continue
        line, n_citations = CITATION.subn("", line)
        counts["citation_markers"] += n_citations
        if not line.endswith(end_marks) or line.endswith(ELLIPSIS):
            counts["lines_no_terminal_punctuation"] += 1
            continue
        if len(line.split()) < min_words_per_line:
            counts["lines_too_few_words"] += 1
            continue
        lower = line.lower()
        if "lorem ipsum" in lower:
            counts["docs_lorem_ipsum"] += 1
            return None
        if "javascript" in lower:
            counts["lines_javascript"] += 1
            continue
        if "{" in line:
            counts["docs_curly_bracket"] += 1
            return None
        if any(p in lower for p in POLICY_SUBSTRINGS):
            counts["lines_policy"] += 1
            continue
        n_sentences += len(split_sentences(line))
        kept.append(line)
    if n_sentences < min_sentences:
        counts["docs_too_few_sentences"] += 1
        return None
    return "\n".join(kept)
