"""Tokenizers: train BPE/WordPiece/Unigram vocabularies, load GPT-2's published BPE, encode and decode."""

from lmforge.tokenizers.core import Tokenizer
from lmforge.tokenizers.gpt2 import fetch_gpt2_bpe, load_gpt2_bpe
from lmforge.tokenizers.kinds import KINDS, Kind
from lmforge.tokenizers.specials import FAMILIES, ROLES, Family
from lmforge.tokenizers.train import train_tokenizer

__all__ = [
    "FAMILIES",
    "KINDS",
    "ROLES",
    "Family",
    "Kind",
    "Tokenizer",
    "fetch_gpt2_bpe",
    "load_gpt2_bpe",
    "train_tokenizer",
]
