"""The tokenizer kinds (BPE, WordPiece, Unigram): one table entry per kind with everything that differs between them,
from the untrained pipeline and its trainer to how a token marks the start of a word."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import tokenizers

from lmforge.tokenizers.sample import CHARS_PER_TOKEN, MIN_SAMPLE_CHARS
from lmforge.tokenizers.specials import Family, FamilySpec

Kind = Literal["bpe", "wordpiece", "unigram"]
"""The keys of `TOKENIZER_KINDS`, for type checkers."""

UNIGRAM_OPTIONS = {"shrinking_factor": 0.75, "n_sub_iterations": 2, "max_piece_length": 16}
"""SentencePiece's defaults (Kudo 2018's unigram EM, pruning 25% of the pieces per round), stated so a cached or saved
tokenizer records them; the speed comes from training on a sample (`lmforge.tokenizers.sample`)."""

# Byte-level BPE spells a leading space / newline / tab / carriage return as these characters (GPT-2's byte map).
_BYTE_LEVEL_SPACE = ("\u0120", "\u010a", "\u0109", "\u010d")
_METASPACE = "\u2581"  # SentencePiece's '▁'


@dataclass(frozen=True)
class TokenizerKind:
    """What a tokenizer of one kind is made of and how it is trained."""

    family: Family
    """The family the kind is usually paired with, used when no family is given."""
    pipeline: Callable[[FamilySpec], tokenizers.Tokenizer]
    """An untrained tokenizer: its model, normalizer, pre-tokenizer and decoder."""
    trainer: Callable[[int, list[tokenizers.AddedToken], FamilySpec, int, bool], tokenizers.trainers.Trainer]
    """(learned vocabulary size, leading special tokens, spec, min_frequency, show_progress) -> its trainer."""
    word_starts: Callable[[tokenizers.Tokenizer], list[int]]
    """The ids of the tokens that begin a word."""
    byte_level: bool = False
    """BPE over bytes: every string is encodable without unk, the vocabulary holds the 256 byte tokens, and the
    post-processor starts with the ByteLevel step."""
    ids_by_text: bool = False
    """The learned tokens are renumbered in the order of their text after training (WordPiece's trainer numbers
    them differently in every process)."""
    frequency_knob: bool = True
    """min_frequency bounds what training learns (Unigram prunes by likelihood instead)."""
    fixed_options: dict = field(default_factory=dict)
    """Trainer options recorded with the vocabulary besides min_frequency."""
    samples: bool = False
    """Trains on a bounded sample of the text by default (`lmforge.tokenizers.sample`) instead of all of it."""

    @property
    def needs_unk(self) -> bool:
        """Whether the vocabulary needs an unk token (byte-level BPE encodes every string without one)."""
        return not self.byte_level

    def options(self, min_frequency: int) -> dict:
        """The trainer options that shape the vocabulary, as recorded with it and in its cache key ("ids" sets
        WordPiece tokenizers apart from those cached before their ids were numbered by text)."""
        frequency = {"min_frequency": min_frequency} if self.frequency_knob else {}
        return {**frequency, **self.fixed_options, **({"ids": "by text"} if self.ids_by_text else {})}

    def default_sample_chars(self, vocab_size: int) -> int:
        """Characters trained on by default: a bounded sample when the kind `samples` (Unigram), else all (0):
        BPE and WordPiece train in seconds on the same text."""
        return max(MIN_SAMPLE_CHARS, CHARS_PER_TOKEN * vocab_size) if self.samples else 0


def _bpe_pipeline(spec: FamilySpec) -> tokenizers.Tokenizer:
    # GPT-2 (Radford et al. 2019 §2.2): BPE over bytes, so every string is encodable without unk.
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    return tok


def _wordpiece_pipeline(spec: FamilySpec) -> tokenizers.Tokenizer:
    # BERT (Devlin et al. 2019): lowercased, split on whitespace and punctuation, "##" continuations.
    tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token=spec.roles["unk"]))
    tok.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    return tok


def _unigram_pipeline(spec: FamilySpec) -> tokenizers.Tokenizer:
    # SentencePiece unigram LM (Kudo 2018) as in T5: spaces become "▁", prepended to the first word.
    tok = tokenizers.Tokenizer(tokenizers.models.Unigram())
    tok.normalizer = tokenizers.normalizers.NFKC()
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(replacement=_METASPACE, prepend_scheme="always")
    tok.decoder = tokenizers.decoders.Metaspace(replacement=_METASPACE, prepend_scheme="always")
    return tok


def _bpe_trainer(learned, specials, spec, min_frequency, show_progress) -> tokenizers.trainers.Trainer:
    return tokenizers.trainers.BpeTrainer(
        vocab_size=learned,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen or not
        show_progress=show_progress,
    )


def _wordpiece_trainer(learned, specials, spec, min_frequency, show_progress) -> tokenizers.trainers.Trainer:
    return tokenizers.trainers.WordPieceTrainer(
        vocab_size=learned,
        min_frequency=min_frequency,
        special_tokens=specials,
        continuing_subword_prefix="##",
        show_progress=show_progress,
    )


def _unigram_trainer(learned, specials, spec, min_frequency, show_progress) -> tokenizers.trainers.Trainer:
    return tokenizers.trainers.UnigramTrainer(
        vocab_size=learned,
        special_tokens=specials,
        unk_token=spec.roles["unk"],
        show_progress=show_progress,
        **UNIGRAM_OPTIONS,
    )


def _unprefixed_starts(backend: tokenizers.Tokenizer) -> list[int]:
    """WordPiece: tokens without the continuation prefix ('##')."""
    prefix = getattr(backend.model, "continuing_subword_prefix", "##") or "##"
    return [i for t, i in backend.get_vocab(with_added_tokens=True).items() if not t.startswith(prefix)]


def _space_marked_starts(backend: tokenizers.Tokenizer) -> list[int]:
    """SentencePiece / Metaspace: tokens starting with '▁', when any does; else byte-level BPE: tokens whose first
    byte is a space, newline, tab or CR ('Ġ', 'Ċ', ...)."""
    vocab = backend.get_vocab(with_added_tokens=True)
    marks = _METASPACE if any(t.startswith(_METASPACE) for t in vocab) else _BYTE_LEVEL_SPACE
    return [i for t, i in vocab.items() if t.startswith(marks)]


TOKENIZER_KINDS: dict[str, TokenizerKind] = {
    "bpe": TokenizerKind("gpt", _bpe_pipeline, _bpe_trainer, _space_marked_starts, byte_level=True),
    "wordpiece": TokenizerKind("bert", _wordpiece_pipeline, _wordpiece_trainer, _unprefixed_starts, ids_by_text=True),
    "unigram": TokenizerKind(
        "t5",
        _unigram_pipeline,
        _unigram_trainer,
        _space_marked_starts,
        frequency_knob=False,
        fixed_options=UNIGRAM_OPTIONS,
        samples=True,
    ),
}
KINDS: tuple[str, ...] = tuple(TOKENIZER_KINDS)
