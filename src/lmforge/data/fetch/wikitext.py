"""Plain text from MediaWiki dumps (`pages-articles` XML with wikitext), for the Wikipedia sample that PyPI
`gensim` ships in its test data (2016 revisions of ~100 English articles).

The markup is stripped the way WikiExtractor-style cleaners do it: templates `{{...}}` and tables `{|...|}` (nested)
are removed with their contents, as are comments, `<ref>` citations, files, images and categories; links keep their
label (`[[target|label]]` → label, `[[target]]` → target, `[url label]` → label); bold/italic quotes and other tags
are dropped; headings become their own paragraph; sections that are lists of links (See also, References, External
links, Further reading, Notes, Bibliography) are cut off.
"""

from __future__ import annotations

import bz2
import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator

_TRAILING_SECTIONS = re.compile(
    r"^==+\s*(See also|References|External links|Further reading|Notes|Bibliography|Sources|Footnotes)\s*==+\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_COMMENT = re.compile(r"(?s)<!--.*?-->")
_REF = re.compile(r"(?is)<ref\b[^>/]*/>|<ref\b[^>]*>.*?</ref\s*>")
_BLOCK_TAGS = re.compile(r"(?is)<(gallery|math|timeline|syntaxhighlight|source|pre|score|imagemap)\b.*?</\1\s*>")
_FILE_LINK = re.compile(r"\[\[(?:File|Image|Category|Media):", re.IGNORECASE)
_LINK = re.compile(r"\[\[([^\[\]|]*)(?:\|([^\[\]]*))?\]\]")
_EXTERNAL = re.compile(r"\[(?:https?:)?//[^\s\]]+(?:\s+([^\]]*))?\]")
_TAG = re.compile(r"<[^>]+>")
_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$", re.MULTILINE)


def _drop_nested(text: str, open_: str, close: str) -> str:
    """`text` without the (possibly nested) spans from `open_` to the matching `close`."""
    out, depth, i = [], 0, 0
    start = 0
    while i < len(text):
        if text.startswith(open_, i):
            if depth == 0:
                out.append(text[start:i])
            depth += 1
            i += len(open_)
        elif depth and text.startswith(close, i):
            depth -= 1
            i += len(close)
            start = i
        else:
            i += 1
    if depth == 0:
        out.append(text[start:])
    return "".join(out)


def _drop_file_links(text: str) -> str:
    """Remove [[File:...]] / [[Category:...]] links, whose captions may contain nested links."""
    while m := _FILE_LINK.search(text):
        depth, i = 0, m.start()
        while i < len(text):
            if text.startswith("[[", i):
                depth, i = depth + 1, i + 2
            elif text.startswith("]]", i):
                depth, i = depth - 1, i + 2
                if depth == 0:
                    break
            else:
                i += 1
        text = text[: m.start()] + text[i:]
    return text


def wikitext_to_text(markup: str) -> str:
    """Readable plain text of one article's wikitext (see the module docstring for what is kept)."""
    cut = _TRAILING_SECTIONS.search(markup)
    text = markup[: cut.start()] if cut else markup
    text = _REF.sub("", _COMMENT.sub("", text))
    text = _BLOCK_TAGS.sub("", text)
    text = _drop_nested(_drop_nested(text, "{{", "}}"), "{|", "|}")
    text = _drop_file_links(text)
    text = _LINK.sub(lambda m: m.group(2) if m.group(2) is not None else m.group(1), text)
    text = _EXTERNAL.sub(lambda m: m.group(1) or "", text)
    text = re.sub(r"'{2,}", "", _TAG.sub("", text))
    text = _HEADING.sub(lambda m: f"\n{m.group(2)}\n", html.unescape(text))
    lines = []
    for line in text.splitlines():
        line = re.sub(r"^[*#:;]+\s*", "", line).strip()  # list and indent markers
        lines.append(" ".join(line.split()))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def dump_articles(xml_bz2: bytes) -> Iterator[tuple[str, str]]:
    """(title, wikitext) of each main-namespace, non-redirect page of a bz2-compressed pages-articles dump."""
    root = ET.fromstring(bz2.decompress(xml_bz2))
    ns = root.tag.partition("}")[0] + "}" if root.tag.startswith("{") else ""
    for page in root.iter(f"{ns}page"):
        if page.findtext(f"{ns}ns") != "0" or page.find(f"{ns}redirect") is not None:
            continue
        text = page.findtext(f"{ns}revision/{ns}text") or ""
        if text.lstrip().upper().startswith("#REDIRECT"):
            continue
        yield page.findtext(f"{ns}title") or "", text
