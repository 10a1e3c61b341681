"""`lmforge tokenizer train` (a BPE / WordPiece / Unigram tokenizer from text files) and `lmforge tokenizer
encode` (the ids and tokens of a text)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from lmforge.errors import LMForgeError

FAMILY_CHOICES = ["gpt", "bert", "t5", "bart", "llama"]
"""`tokenizers.specials.FAMILIES` written out: importing that package imports torch, which `lmforge --help` avoids
(tests/test_tokenizers_cli.py holds the two equal)."""

if TYPE_CHECKING:
    from lmforge.tokenizers.core import Tokenizer
    from lmforge.tokenizers.kinds import Kind
    from lmforge.tokenizers.specials import Family


def add_parser(sub, name: str) -> None:
    t = sub.add_parser(name, help="train or apply tokenizers").add_subparsers(dest="sub", required=True)
    tt = t.add_parser("train", help="train a BPE / WordPiece / Unigram tokenizer")
    tt.add_argument("inputs", nargs="+", type=Path)
    tt.add_argument("--out", type=Path, required=True)
    tt.add_argument("--kind", choices=["bpe", "wordpiece", "unigram"], default="bpe")
    tt.add_argument("--vocab-size", type=int, default=8192)
    tt.add_argument(
        "--family",
        choices=FAMILY_CHOICES,
        default=None,
        help="default: the kind's usual family",
    )
    tt.add_argument("--min-frequency", type=int, default=2)
    tt.add_argument(
        "--sample-chars", type=int, default=None,
        help="train on a deterministic sample of this many characters (default: unigram 100 per token, at least 500k; "
        "bpe/wordpiece all; 0: all)",
    )  # fmt: skip
    tt.add_argument("--text-field", default="text", help="the field of a .jsonl file's records to train on")
    tt.add_argument("--no-cache", action="store_true", help="train anew even if the same tokenizer is cached")
    tt.set_defaults(fn=_train)
    te = t.add_parser("encode", help="print the ids and tokens of a text")
    te.add_argument("tokenizer", type=Path, help="a tokenizer dir or file, a published one (gpt2), or a run dir")
    te.add_argument("--text")
    te.add_argument("--file", type=Path)
    te.set_defaults(fn=_encode)


def _train(args: argparse.Namespace) -> None:
    cmd_train(args.inputs, args.out, args.kind, args.vocab_size, args.family, args.min_frequency,
              sample_chars=args.sample_chars, text_field=args.text_field, cache=not args.no_cache)  # fmt: skip


def _encode(args: argparse.Namespace) -> None:
    cmd_encode(args.tokenizer, args.text, args.file)


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
    from lmforge.data.corpus.text_files import FileTexts, check_input_file
    from lmforge.tokenizers.train import train_tokenizer

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
        from lmforge.checkpoint.verify import model_checkpoint

        path = model_checkpoint(path)
    return load_tokenizer(str(path) if path.exists() else spec, "tokenizer")


def cmd_encode(tokenizer_path: Path, text: str | None = None, file: Path | None = None) -> list[int]:
    """Encode ``text`` or the contents of ``file`` with a tokenizer (a dir or file, a published one's name, or a run's);
    print the ids and their tokens, return the ids."""
    from lmforge.data.corpus.text_files import check_input_file

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
