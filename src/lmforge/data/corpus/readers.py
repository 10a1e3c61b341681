"""Read documents from text files: .txt, .jsonl, .csv/.tsv, .parquet, optionally .gz/.xz compressed.

One document per .txt file, per JSONL line (``text_field``), per CSV row (column ``text_field``) or per
Parquet row; one longer than ``DOC_CHARS`` (32k characters), whatever its format, is cut at paragraphs into several.
Bytes that are not valid UTF-8 are replaced with U+FFFD and counted (``DocumentStream.replaced_bytes``), and so is
each lone surrogate a JSON escape makes (``"\\ud800"``: text no UTF-8 encoder takes, damaged the same way); every bad
input raises ``LMForgeError`` with one line.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import re
import zlib
from collections.abc import Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import BinaryIO

from lmforge.data.surrogates import replace_surrogates
from lmforge.data.tables import csv_records
from lmforge.errors import LMForgeError
from lmforge.extras import require
from lmforge.files import loads_json

TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", "")
TABLE_SUFFIXES = {".csv": ",", ".tsv": "\t"}
JSONL_SUFFIXES = (".jsonl", ".ndjson")
COMPRESSED = (".gz", ".xz")
READABLE = "*.txt, *.md, *.rst, *.jsonl, *.csv, *.tsv, *.parquet, optionally .gz/.xz compressed"

_SAMPLE = 1 << 16  # bytes inspected to tell text from binary
_MAX_NON_TEXT = 0.30  # fraction of control / invalid bytes above which a file counts as binary
_ESCAPED = re.compile("[\udc80-\udcff]")  # bytes that surrogateescape could not decode
_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\r\x0b\x0c\x08") + b"\x7f"
# What reading a damaged file raises: gzip's bad CRC or truncation (OSError, EOFError), bad deflate data (zlib.error,
# not an OSError), corrupt xz.
_READ_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)


def decode_counting(data: bytes) -> tuple[str, int]:
    """Decode UTF-8, replacing each undecodable byte with U+FFFD; return (text, bytes replaced)."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        # surrogateescape maps each bad byte to one lone surrogate, so the count is exact per byte.
        return _ESCAPED.subn("\ufffd", data.decode("utf-8", "surrogateescape"))


def _split_name(path: Path) -> tuple[str, str]:
    """(format suffix, compression suffix) of a file name, e.g. 'a.jsonl.gz' → ('.jsonl', '.gz')."""
    suffixes = [s.lower() for s in path.suffixes]
    comp = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSED else ""
    return (suffixes[-1] if suffixes else ""), comp


def _kind(path: Path, in_dir: bool = False) -> str | None:
    """Reader for ``path``, or None if unsupported; directory scans skip suffix-less files."""
    fmt, comp = _split_name(path)
    if fmt == ".parquet":
        return None if comp else "parquet"
    if fmt in JSONL_SUFFIXES:
        return "jsonl"
    if fmt in TABLE_SUFFIXES:
        return "table"
    if fmt == "" and in_dir:
        return None
    return "text" if fmt in TEXT_SUFFIXES else None


def _open(path: Path) -> BinaryIO:
    comp = _split_name(path)[1]
    if comp == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if comp == ".xz":
        return lzma.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _read_all(path: Path) -> bytes:
    try:
        with _open(path) as f:
            return f.read()
    except _READ_ERRORS as e:
        raise LMForgeError(f"{path}: cannot read ({e})") from e


def check_text(data: bytes, path: Path) -> None:
    """Raise if ``data`` (a file or its start) looks binary: any NUL byte, or a mostly non-text start."""
    if b"\x00" in data:
        raise LMForgeError(f"{path}: binary file (contains NUL bytes; text must be UTF-8)")
    sample = data[:_SAMPLE]
    if not sample:
        return
    bad = len(sample) - len(sample.translate(None, _CONTROL))
    bad += decode_counting(sample[:-3] if len(sample) == _SAMPLE else sample)[1]
    if bad / len(sample) > _MAX_NON_TEXT:
        raise LMForgeError(f"{path}: binary file ({bad / len(sample):.0%} of its first bytes are not text)")


FETCHED = "fetched:"
"""Prefix of an input that names a corpus `lmforge data fetch` built (`fetched:all-english`), wherever the cache is."""


def input_path(p: Path | str) -> Path:
    """An input as a path: `fetched:NAME` → the cache's `data/NAME` dir (which must exist) and `fetched:NAME/FILE` a
    file in it (a labelled set's `train.jsonl`, say), `~` expanded; a bare NAME that is no file or directory here but
    a fetched corpus's name → that corpus."""
    from lmforge.files import cache_root

    if str(p).startswith(FETCHED):
        name = str(p)[len(FETCHED) :]
        path = cache_root() / "data" / name
        corpus = name.split("/", 1)[0]
        if not corpus or not (cache_root() / "data" / corpus).is_dir():
            raise LMForgeError(f"{p}: not fetched yet (run: lmforge data fetch {corpus or 'NAME'}; looked in {path})")
        if not path.exists():
            raise LMForgeError(f"{p}: no such file in the fetched {corpus} ({path})")
        return path
    path = Path(p).expanduser()
    name = str(p)
    if not path.exists() and name and "/" not in name and "\\" not in name:
        fetched = cache_root() / "data" / name
        if (fetched / "docs.jsonl").is_file():
            return fetched
        from lmforge.data.fetch.build import list_fetchers

        if name in list_fetchers():
            raise LMForgeError(
                f"{p}: no such file or directory, and corpus {name} is not fetched yet (run: lmforge data fetch "
                f"{name}; then name it {name} or fetched:{name})"
            )
    return path


def _scan(p: Path) -> list[Path]:
    """The readable files of directory `p` (sorted, hidden ones skipped)."""
    found = [
        f
        for f in sorted(p.rglob("*"))
        if f.is_file()
        and not any(part.startswith(".") for part in f.relative_to(p).parts)
        and _kind(f, in_dir=True) is not None
    ]
    if not found:
        raise LMForgeError(f"{p}: directory has no readable files ({READABLE}), nor is it a save_to_disk dataset")
    return found


def resolve_sources(inputs: Sequence) -> list:
    """Inputs as what is read: files (directories expanded into their readable files), and `DatasetInput`s for
    `datasets` objects, save_to_disk dirs and `hf:NAME`s; checks existence."""
    from lmforge.data.hf_datasets import HF_PREFIX, DatasetInput, is_dataset, is_saved_dataset

    out: list = []
    for item in inputs:
        if isinstance(item, DatasetInput):
            out.append(item)
            continue
        if is_dataset(item) or str(item).startswith(HF_PREFIX):
            out.append(DatasetInput(item))
            continue
        p = input_path(item)
        if is_saved_dataset(p):
            out.append(DatasetInput(p))
        elif p.is_dir():
            out += _scan(p)
        elif p.is_file():
            if _kind(p) is None:
                raise LMForgeError(f"{p}: unsupported file type ({READABLE})")
            out.append(p)
        else:
            raise LMForgeError(f"{p}: no such file or directory")
    if not out:
        raise LMForgeError("no input files given")
    return list(dict.fromkeys(out))  # the same file named twice is read once


def resolve_files(paths: Sequence[Path | str]) -> list[Path]:
    """Expand directories into their readable files (sorted, hidden files skipped); check existence."""
    files = resolve_sources(paths)
    if not all(isinstance(f, Path) for f in files):
        raise LMForgeError("this command reads files only, not Hugging Face datasets")
    return files


def describe_input(item) -> str:
    """An input as meta.json's `sources` records it."""
    from lmforge.data.hf_datasets import DatasetInput, is_dataset

    return str(DatasetInput(item)) if is_dataset(item) else str(item)


DOC_CHARS = 1 << 15
"""A document of any format longer than this (32k characters, ~8k tokens) is read as several: a long .txt file is a
corpus, not one document, and the tokenizer holds ~150 bytes a character of each text it is encoding, in each of its
threads (a 50 MB JSONL line took 6.5 GB in one piece; 1M-character pieces still took 2 GB with 16 threads)."""
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")


def split_text(text: str, limit: int = DOC_CHARS) -> list[str]:
    """`text` as documents: itself when it is short, else runs of whole blank-line paragraphs of up to `limit`
    characters (a paragraph longer than that is cut at line ends, a line longer than that at `limit`), so a single
    large text file splits into many documents for the train/validation split."""
    if len(text) <= limit:
        return [text]
    docs: list[str] = []
    current: list[str] = []
    size = 0
    for para in _pieces(_BLANK_LINE.split(text), limit, "\n"):
        if size and size + len(para) > limit:
            docs.append("\n\n".join(current))
            current, size = [], 0
        current.append(para)
        size += len(para) + 2
    if current:
        docs.append("\n\n".join(current))
    return docs


def _pieces(parts: list[str], limit: int, joiner: str) -> Iterator[str]:
    """The non-blank parts, each longer than `limit` cut into pieces of at most `limit` characters."""
    for part in parts:
        if not part.strip():
            continue
        if len(part) <= limit:
            yield part
        elif joiner:  # a long paragraph: whole lines, then hard cuts
            chunk: list[str] = []
            size = 0  # characters of `chunk` joined, plus the joiner before the next line
            for line in _pieces(part.split(joiner), limit, ""):
                if chunk and size + len(line) > limit:
                    yield joiner.join(chunk)
                    chunk, size = [], 0
                chunk.append(line)
                size += len(line) + len(joiner)
            if chunk:
                yield joiner.join(chunk)
        else:
            yield from (part[i : i + limit] for i in range(0, len(part), limit))


class DocumentStream(Iterator[str]):
    """An iterator over the documents of some files; counts replaced (non-UTF-8) bytes as it goes."""

    def __init__(self, paths: Sequence, text_field: str = "text") -> None:
        self.files = resolve_sources(paths)  # fails early, before any reading
        self.text_field = text_field
        self.replaced_bytes = 0
        self.n_docs = 0
        self._it = self._generate()

    def __next__(self) -> str:
        doc = next(self._it)
        self.n_docs += 1
        return doc

    def _decode(self, data: bytes) -> str:
        text, n = decode_counting(data)
        self.replaced_bytes += n
        return text

    def _generate(self) -> Iterator[str]:
        readers = {"text": self._text, "jsonl": self._jsonl, "table": self._table, "parquet": self._parquet}
        for path in self.files:
            n = 0
            docs = self._dataset(path) if not isinstance(path, Path) else readers[_kind(path)](path)  # type: ignore[index]
            for doc in docs:
                # Every format's documents pass the same cut, so no input hands the tokenizer an unbounded string.
                for piece in split_text(doc, DOC_CHARS):
                    n += 1
                    yield piece
            if n == 0:
                raise LMForgeError(f"{path}: empty file (no documents)")

    def _dataset(self, source) -> Iterator[str]:
        return (text for text in source.texts(self.text_field) if text and text.strip())

    def _text(self, path: Path) -> Iterator[str]:
        data = _read_all(path)
        check_text(data, path)
        text = self._decode(data).removeprefix("\ufeff")
        if text.strip():
            yield text

    def _jsonl(self, path: Path) -> Iterator[str]:
        try:
            with _open(path) as f:
                head = f.read(_SAMPLE)
                check_text(head, path)
                # Finish the line cut by the sample, then stream the rest line by line.
                for lineno, raw in enumerate(chain(io.BytesIO(head + f.readline()), f), start=1):
                    doc = self._json_doc(raw, path, lineno)
                    if doc:
                        yield doc
        except _READ_ERRORS as e:
            raise LMForgeError(f"{path}: cannot read ({e})") from e

    def _json_doc(self, raw: bytes, path: Path, lineno: int) -> str | None:
        line = self._decode(raw).strip().removeprefix("\ufeff")
        if not line:
            return None
        try:
            obj = loads_json(line)
        except json.JSONDecodeError as e:
            raise LMForgeError(f"{path}:{lineno}: malformed JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(obj, dict):
            raise LMForgeError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        if self.text_field not in obj:
            keys = ", ".join(map(str, list(obj)[:8])) or "none"
            raise LMForgeError(f"{path}:{lineno}: no field '{self.text_field}' (fields: {keys})")
        value = obj[self.text_field]
        if not isinstance(value, str):
            raise LMForgeError(
                f"{path}:{lineno}: field '{self.text_field}' is {type(value).__name__}, expected a string"
            )
        if "\\u" in line:  # an unpaired \ud800 escape: replaced and counted like a byte that is not UTF-8
            value, n = replace_surrogates(value)
            self.replaced_bytes += n
        return value if value.strip() else None

    def _table(self, path: Path) -> Iterator[str]:
        data = _read_all(path)
        check_text(data, path)
        text = self._decode(data).removeprefix("\ufeff")
        records = csv_records(io.StringIO(text, newline=""), path, TABLE_SUFFIXES[_split_name(path)[0]])
        header = next(records, (0, None))[1]
        if header is None:
            return
        if self.text_field not in header:
            raise LMForgeError(f"{path}: no column '{self.text_field}' (columns: {', '.join(header[:8])})")
        col = header.index(self.text_field)
        for _, row in records:
            if row[col].strip():
                yield row[col]

    def _parquet(self, path: Path) -> Iterator[str]:
        pa = require("pyarrow", "reading Parquet files")
        pq = require("pyarrow.parquet", "reading Parquet files")

        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as e:
            raise LMForgeError(f"{path}: not a valid Parquet file ({str(e).splitlines()[0]})") from None
        names = pf.schema_arrow.names
        if self.text_field not in names:
            raise LMForgeError(f"{path}: no column '{self.text_field}' (columns: {', '.join(names[:8])})")
        col_type = pf.schema_arrow.field(self.text_field).type
        is_binary = pa.types.is_binary(col_type) or pa.types.is_large_binary(col_type)
        if not (is_binary or pa.types.is_string(col_type) or pa.types.is_large_string(col_type)):
            raise LMForgeError(f"{path}: column '{self.text_field}' has type {col_type}, expected string")
        batches = pf.iter_batches(columns=[self.text_field], batch_size=1024)
        while True:
            try:  # damaged pages fail here: bad compressed data, thrift headers, dictionary indices
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as e:
                raise LMForgeError(f"{path}: corrupt Parquet data ({str(e).splitlines()[0]})") from None
            if batch is None:
                return
            # As bytes: Parquet does not check that strings are UTF-8, and bad bytes are replaced and counted.
            column = batch.column(0).cast(pa.large_binary())
            for value in column.to_pylist():
                text = None if value is None else self._decode(value)
                if text and text.strip():
                    yield text


def read_documents(paths: Sequence, text_field: str = "text") -> DocumentStream:
    """Iterate over the documents in ``paths`` (files or directories; `datasets` objects, save_to_disk dirs and
    ``hf:NAME``s: the column ``text_field``).

    The returned stream's ``replaced_bytes`` holds how many non-UTF-8 bytes were replaced so far.
    """
    return DocumentStream(paths, text_field)
