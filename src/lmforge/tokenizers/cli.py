"""Functions behind ``lmforge tokenizer train`` and ``lmforge tokenizer encode``."""

from __future__ import annotations

import io
import json
import lzma
from collections.abc import Iterator, Sequence
from pathlib import Path

from lmforge.errors import LMForgeError
from lmforge.tokenizers.core import Tokenizer
from lmforge.tokenizers.specials import Family, Kind
from lmforge.tokenizers.train import train_tokenizer


def check_input_file(path: Path | str) -> Path:
    """``path`` as a Path (``fetched:NAME``: that corpus's docs.jsonl), or an LMForgeError when it is missing or not
    a regular file."""
    from lmforge.data.readers import FETCHED, input_path

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

    Bytes that are not valid UTF-8 become U+FFFD rather than stopping the run.
    """
    from lmforge.data.labelled_readers import open_binary
    from lmforge.data.readers import check_text

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
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise LMForgeError(f"{path}:{lineno}: invalid JSON ({e.msg})") from e
                text = record.get(text_field) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise LMForgeError(f"{path}:{lineno}: expected an object with a string '{text_field}' field")
                yield text
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


def cmd_train(
    inputs: Sequence[Path],
    out: Path,
    kind: Kind,
    vocab_size: int,
    family: Family | None = None,
    min_frequency: int = 2,
    *,
    sample_chars: int | None = None,
    text_field: str = "text",
    cache: bool = True,
) -> dict:
    """Train a tokenizer on text files, save it to ``out`` and print and return a summary. ``sample_chars``: train
    on a sample of this many characters (None: the kind's default; 0: all); ``cache``: reuse a tokenizer trained
    before on the same text and settings."""
    if not inputs:
        raise LMForgeError("no input files given")
    files = [check_input_file(p) for p in inputs]
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise LMForgeError(f"output {out} is a file, expected a directory")
    texts = FileTexts(files, text_field)
    if next((t for t in texts if t), None) is None:  # fail before training when every file is empty
        raise LMForgeError(f"no text in the input files: {', '.join(map(str, files))}")
    tok = train_tokenizer(
        texts, kind, vocab_size, family, min_frequency,
        size_key="--vocab-size", frequency_key="--min-frequency", sample_chars=sample_chars, cache=cache,
    )  # fmt: skip
    tok.save(out)
    training = tok.training or {}
    summary = {
        "out": str(out),
        "kind": tok.kind,
        "family": tok.family,
        "vocab_size": tok.vocab_size,
        "files": len(files),
        "chars": training.get("chars_seen", texts.chars),
        "trained_on_chars": training.get("chars_used", training.get("chars_seen", texts.chars)),
        "special_tokens": tok.special_tokens,
    }
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    return summary


def _tokenizer_of(spec: str) -> Tokenizer:
    """A tokenizer dir or file, a published tokenizer's name (gpt2), or the tokenizer of a run or checkpoint dir."""
    from lmforge.tokenizers.published import load_tokenizer

    path = Path(spec)
    if path.is_dir() and not (path / "tokenizer.json").is_file() and (path / "checkpoints").is_dir():
        from lmforge.train.checkpoint import model_checkpoint

        path = model_checkpoint(path)
    return load_tokenizer(str(path) if path.exists() else spec, "tokenizer")


def cmd_encode(tokenizer_path: Path, text: str | None = None, file: Path | None = None) -> list[int]:
    """Encode ``text`` or the contents of ``file`` with a tokenizer (a dir or file, a published one's name, or a run's);
    print the ids and their tokens, return the ids."""
    if (text is None) == (file is None):
        raise LMForgeError("give exactly one of a text or --file to encode")
    if file is not None:
        path = check_input_file(file)
        text = path.read_bytes().decode("utf-8", errors="replace")
        if not text:
            raise LMForgeError(f"nothing to encode: {path} is empty")
    elif not text:
        raise LMForgeError("nothing to encode: the text is empty")
    tok = _tokenizer_of(str(tokenizer_path))
    ids = tok.encode(text)
    print("ids:", " ".join(map(str, ids)))
    print("tokens:", json.dumps([tok.id_to_token(i) for i in ids], ensure_ascii=False))
    return ids
