"""The texts of input files for training a tokenizer: a file checked to be a readable text file (`fetched:NAME`: a
fetched corpus's docs.jsonl), its lines or JSON Lines field (compressed files too), and `FileTexts`, the texts of
some files readable more than once."""

from __future__ import annotations

import io
import json
import lzma
from collections.abc import Iterator, Sequence
from pathlib import Path

from lmforge.errors import LMForgeError
from lmforge.files import loads_json


def check_input_file(path: Path | str) -> Path:
    """``path`` as a Path (``fetched:NAME``: that corpus's docs.jsonl), or an LMForgeError when it is missing or not
    a regular file."""
    from lmforge.data.corpus.readers import FETCHED, input_path

    fetched = str(path).startswith(FETCHED)
    path = input_path(path)
    if fetched and (path / "docs.jsonl").is_file():
        path = path / "docs.jsonl"
    if not path.exists():
        raise LMForgeError(f"input file not found: {path}")
    if path.is_dir():
        raise LMForgeError(f"input {path} is a directory, expected a text file")
    if not path.is_file():
        raise LMForgeError(f"input {path} is not a regular file")
    return path


def iter_texts(path: Path, text_field: str = "text") -> Iterator[str]:
    """Texts of a file: lines of plain text, or the `text_field` of each JSON line of a ``.jsonl`` file; ``.gz``,
    ``.xz`` and ``.bz2`` files are decompressed first, and a file that is not text is refused rather than learned
    from.

    Bytes that are not valid UTF-8 become U+FFFD rather than stopping the run, and so do lone surrogates (an
    unpaired JSON escape such as \\ud800).
    """
    from lmforge.data.corpus.readers import check_text
    from lmforge.data.labelled.readers import open_binary
    from lmforge.data.surrogates import replace_surrogates

    jsonl = [s.lower() for s in path.suffixes if s.lower() not in (".gz", ".xz", ".bz2")][-1:] == [".jsonl"]
    try:
        with open_binary(path) as raw:
            check_text(raw.peek(1 << 16)[: 1 << 16], path)  # what is buffered: enough to tell text from binary
            # newline="" keeps "\r\n" and "\n" as written, so the vocabulary sees the real line endings.
            fh = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
            if not jsonl:
                yield from fh
                return
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    record = loads_json(line)
                except json.JSONDecodeError as e:
                    raise LMForgeError(f"{path}:{lineno}: invalid JSON ({e.msg})") from e
                text = record.get(text_field) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise LMForgeError(f"{path}:{lineno}: expected an object with a string '{text_field}' field")
                # An unpaired \ud800 escape becomes U+FFFD, as bytes that are not UTF-8 do.
                yield replace_surrogates(text)[0] if "\\u" in line else text
    except (EOFError, lzma.LZMAError, OSError) as e:  # a truncated or corrupt archive, an unreadable file
        raise LMForgeError(f"{path}: cannot read ({e})") from e


class FileTexts:
    """The texts of some files (`iter_texts`), readable more than once: the first pass can hash them for the
    tokenizer cache, the second trains on them. `chars` counts the characters of the last pass."""

    def __init__(self, files: Sequence[Path], text_field: str = "text") -> None:
        self.files, self.text_field, self.chars = list(files), text_field, 0

    def __iter__(self) -> Iterator[str]:
        self.chars = 0
        for f in self.files:
            for text in iter_texts(f, self.text_field):
                self.chars += len(text)
                yield text
