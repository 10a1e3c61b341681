"""Lone surrogates in text read from user files: code points U+D800-U+DFFF, halves of UTF-16 pairs that are no
character. json.loads makes one of an unpaired escape (``"caf\\ud800"``, as JSON written by JavaScript that cut a
string inside a pair holds), and surrogateescape one of each byte that is not UTF-8 on a command line or stdin; no
UTF-8 encoder takes it, a tokenizer's neither. The corpus readers replace each with U+FFFD and count it, as they do
bytes that are not UTF-8; readers that refuse such bytes (labelled sets, predict inputs) refuse it with its line."""

from __future__ import annotations

import re

from lmforge.errors import LMForgeError

_SURROGATE = re.compile("[\ud800-\udfff]")
# A \uD800-\uDFFF escape of JSON text (after an even run of backslashes): a high one with its low partner (a pair,
# one character) or alone, or a low one alone.
_SURROGATE_ESCAPE = re.compile(
    r"(?<!\\)(?:\\\\)*\\u(d[89ab][0-9a-f]{2})(\\ud[c-f][0-9a-f]{2})?|(?<!\\)(?:\\\\)*\\u(d[c-f][0-9a-f]{2})", re.I
)


def replace_surrogates(text: str) -> tuple[str, int]:
    """Replace each lone surrogate (what json.loads makes of an unpaired escape such as \\ud800: a str no UTF-8
    encoder, a tokenizer's included, accepts) with U+FFFD; return (text, surrogates replaced)."""
    return _SURROGATE.subn("\ufffd", text)


def lone_surrogate(text: str, json_text: bool = False) -> tuple[int, str] | None:
    """(position, as written) of the first lone surrogate of `text`: a character U+D800-U+DFFF (surrogateescape
    makes one of each byte that is not UTF-8 in a command line or stdin), or in JSON text an unpaired \\uD800-
    \\uDFFF escape, which json.loads decodes into one. None when there is none."""
    found = []
    if m := _SURROGATE.search(text):
        found.append((m.start(), f"\\u{ord(m.group()):04x}"))
    if json_text and "\\u" in text:
        for e in _SURROGATE_ESCAPE.finditer(text):
            if e.group(3) or not e.group(2):
                found.append((e.end() - 6, e.group()[-6:]))
                break
    return min(found) if found else None


def surrogate_error(where: str, shown: str) -> LMForgeError:
    """The line for a lone surrogate `shown` (as `lone_surrogate` gives it) at `where` (`file:line`)."""
    return LMForgeError(f"{where}: not UTF-8 text ({shown} is a lone surrogate: half of a UTF-16 pair, no character)")


def check_surrogates(text: str, where: str, json_text: bool = False) -> None:
    """Refuse `text` (from `where`, e.g. `file:line`) holding a lone surrogate (`lone_surrogate`), as the readers
    that refuse bytes that are not UTF-8 do."""
    if (hit := lone_surrogate(text, json_text)) is not None:
        raise surrogate_error(where, hit[1])
