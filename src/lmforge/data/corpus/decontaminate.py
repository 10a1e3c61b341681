"""Test-set decontamination for `lmforge data prepare --decontaminate SET`: drop every paragraph of a pretraining
document that shares a lower-cased word n-gram (default 8) with the dev or test split of a labelled set.

A SET is a bundled labelled set (`sentiment`), a set built by `lmforge data fetch NAME` (`hedge`, `spam`, ...) or a
labelled-set directory (`meta.json` + `train/dev/test.jsonl`). Every text of an example counts (both texts of a pair,
a context, choices, a target); the train split does not. A paragraph is a block between blank lines, or each line
of a document that has no blank line; a document with no paragraph left is dropped. The filter is a function of the
document's text alone, so both passes of prepare apply it alike."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from lmforge.data.ngrams import word_ngrams
from lmforge.errors import LMForgeError, did_you_mean

HELD_OUT_SPLITS = ("dev", "test")
_PARAGRAPH_BREAK = re.compile(r"(\n(?:[^\S\n]*\n)+)")  # a line break and one or more blank lines
_LINE_BREAK = re.compile(r"(\n)")


def load_set(name: str) -> tuple[str, dict]:
    """(what the meta calls it, split name → Dataset) of a labelled set named or given as a directory; one
    `LMForgeError` line for an unknown name or a set not fetched yet."""
    from lmforge.data.labelled.readers import bundled_names, load_bundled, load_fetched, load_labelled_dir

    path = Path(name).expanduser()
    if path.is_dir():
        return str(path.resolve()), load_labelled_dir(path)
    if name in bundled_names():
        return name, load_bundled(name)
    from lmforge.data.fetch.build import FETCHERS, LABELLED

    if name in LABELLED:
        return name, load_fetched(name)  # not fetched yet: one line naming `lmforge data fetch NAME`
    if name in FETCHERS:
        raise LMForgeError(f"--decontaminate: '{name}' is a corpus, not a labelled set (it has no dev or test split)")
    known = sorted(set(bundled_names()) | set(LABELLED.names()))
    tip = did_you_mean(name, known, f"known: {', '.join(known)}; or a labelled-set directory")
    raise LMForgeError(f"--decontaminate: unknown labelled set '{name}'{tip}")


class Decontaminator:
    """The held-out n-grams of `sets` and the paragraph filter; `counts` tallies what `filter` dropped."""

    def __init__(self, sets: Sequence[str], n: int = 8) -> None:
        from lmforge.data.labelled.examples import example_texts

        if n < 1:
            raise LMForgeError(f"--decontaminate-n must be at least 1, got {n}")
        self.n = n
        self.sets: list[str] = []
        self.held: set[tuple[str, ...]] = set()
        for name in sets:
            label, splits = load_set(name)
            self.sets.append(label)
            for text in example_texts([splits[s] for s in HELD_OUT_SPLITS if s in splits]):
                self.held |= word_ngrams(text, n)
        self.counts = {"paragraphs_dropped": 0, "docs_dropped": 0}

    def apply(self, doc: str) -> tuple[str | None, int]:
        """(`doc` without its paragraphs that share a held-out n-gram, None when none is left; paragraphs dropped).
        A document sharing none comes back unchanged."""
        if self.held.isdisjoint(word_ngrams(doc, self.n)):
            return doc, 0
        pieces = (_PARAGRAPH_BREAK if _PARAGRAPH_BREAK.search(doc) else _LINE_BREAK).split(doc)
        kept: list[str] = []  # paragraphs, each followed by the break after it
        dropped = 0
        for i in range(0, len(pieces), 2):
            if self.held.isdisjoint(word_ngrams(pieces[i], self.n)):
                kept += pieces[i : i + 2]
            else:
                dropped += 1
        if not dropped:  # only an n-gram across a paragraph break
            return doc, 0
        text = "".join(kept).strip()
        return (text or None), dropped

    def filter(self, doc: str) -> str | None:
        """`apply`, counted in `counts`."""
        text, dropped = self.apply(doc)
        self.counts["paragraphs_dropped"] += dropped
        self.counts["docs_dropped"] += text is None
        return text

    def summary(self) -> dict:
        """The meta.json entry: sets, n, held-out n-grams, paragraphs and documents dropped."""
        return {"sets": self.sets, "n": self.n, "held_out_ngrams": len(self.held), **self.counts}
