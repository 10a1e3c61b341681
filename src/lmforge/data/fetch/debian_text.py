"""English text from two Debian packages: The Debian Administrator's Handbook (`debian-handbook`, DocBook HTML)
and the fortune-cookie collections of `fortunes` (quotations, jokes and aphorisms, `%`-separated)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

from lmforge.data.fetch.sources import Record, normalize_text
from lmforge.errors import LMForgeError

HANDBOOK_HTML = "usr/share/doc/debian-handbook/html/en-US"
FORTUNES_DIR = "usr/share/games/fortunes"
FORTUNES_SKIPPED = ("art", "ascii-art", "translate-me")  # pictures drawn in characters, a translators' note


class _ProseParser(HTMLParser):
    """Collects the prose paragraphs (`div.para`, `p`) and section titles (`h1`-`h4`) of a DocBook HTML page; code
    blocks (`pre`), scripts, navigation and tables of contents are left out."""

    VOID = {"br", "img", "meta", "hr", "input", "link", "col", "area", "base", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self.stack: list[tuple[str, bool, bool]] = []  # (tag, skipped subtree, starts a paragraph)
        self.buf: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.VOID:
            return
        classes = (dict(attrs).get("class") or "").split()
        skip = tag in ("pre", "script", "style") or bool({"navheader", "navfooter", "toc", "docnav"} & set(classes))
        inside = any(block for _, _, block in self.stack)
        block = not inside and (tag in ("h1", "h2", "h3", "h4", "p") or classes[:1] == ["para"])
        if block:
            self.buf = []
        self.stack.append((tag, skip, block))

    def handle_endtag(self, tag: str) -> None:
        if not any(t == tag for t, _, _ in self.stack):
            return
        while self.stack:
            open_tag, _, block = self.stack.pop()
            if block:
                text = " ".join("".join(self.buf).split())
                if text:
                    self.paragraphs.append(text)
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if any(block for _, _, block in self.stack) and not any(skip for _, skip, _ in self.stack):
            self.buf.append(data)


def html_paragraphs(markup: str) -> list[str]:
    """The prose paragraphs and titles of one DocBook HTML page, in order."""
    parser = _ProseParser()
    parser.feed(markup)
    parser.close()
    return parser.paragraphs


def handbook_records(package_root: Path, min_words: int = 30) -> Iterator[Record]:
    """One record per English page of The Debian Administrator's Handbook (pages under `min_words` words, such as
    the index and tables of contents, are left out)."""
    pages = sorted((package_root / HANDBOOK_HTML).glob("*.html"))
    if not pages:
        raise LMForgeError(f"{package_root}: no {HANDBOOK_HTML}/*.html (not debian-handbook?)")
    for page in pages:
        text = normalize_text("\n\n".join(html_paragraphs(page.read_text(encoding="utf-8", errors="replace"))))
        if len(text.split()) >= min_words:
            yield {"text": text, "source": f"debian-handbook/{page.stem}"}


def fortune_records(package_root: Path) -> Iterator[Record]:
    """One record per fortune collection (its UTF-8 `.u8` file), each fortune a paragraph (its own blank lines
    closed up so that paragraph boundaries stay fortune boundaries)."""
    files = sorted((package_root / FORTUNES_DIR).glob("*.u8"))
    if not files:
        raise LMForgeError(f"{package_root}: no {FORTUNES_DIR}/*.u8 (not the fortunes package?)")
    for path in files:
        name = path.name.removesuffix(".u8")
        if name in FORTUNES_SKIPPED:
            continue
        raw = path.read_text(encoding="utf-8", errors="replace")
        items = [re.sub(r"\n\s*\n", "\n", normalize_text(f)) for f in re.split(r"(?m)^%\s*$", raw)]
        text = "\n\n".join(f for f in items if f)
        if text:
            yield {"text": text, "source": f"fortunes/{name}"}
