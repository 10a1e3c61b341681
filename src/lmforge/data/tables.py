"""Strict CSV/TSV records, shared by the pretraining corpus reader and the labelled-table readers."""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from lmforge.errors import LMForgeError

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # documents can be far longer than the 128 KiB default


def csv_records(
    lines: Iterable[str], path: Path | str, delimiter: str = ",", header: bool = True
) -> Iterator[tuple[int, list[str]]]:
    """(line where the record starts, cells) of each non-blank record of a CSV text: RFC 4180 quoting, strict (a stray
    quote is an error, not a field that swallows the rest of the file), and every record as wide as the first, the
    header (a ragged row is refused, never padded or dropped). Read by pretraining corpora and labelled tables."""
    kind, first = ("TSV" if delimiter == "\t" else "CSV"), ("the header" if header else "the first row")
    reader = csv.reader(lines, delimiter=delimiter, strict=True)
    width, line = None, 1
    try:
        while True:
            line = reader.line_num + 1
            row = next(reader, None)
            if row is None:
                return
            if not row:
                continue
            if width is None:
                width = len(row)
            elif len(row) != width:
                raise LMForgeError(f"{path}:{line}: expected {width} {kind} columns (as {first}), found {len(row)}")
            yield line, row
    except (csv.Error, UnicodeDecodeError) as e:
        raise LMForgeError(f"{path}:{line}: malformed {kind} ({e})") from None
