"""Tokenizer files of an exported Hugging Face dir, so that `AutoTokenizer.from_pretrained(dir)` works."""

from __future__ import annotations

from pathlib import Path

from lmforge.models.config import ModelConfig
from lmforge.tokenizers.hf_fast import CHAT_TEMPLATE, SPECIAL_TOKENS_MAP, TOKENIZER_CONFIG, write_tokenizer_config

__all__ = ["SPECIAL_TOKENS_MAP", "TOKENIZER_CONFIG", "write_hf_tokenizer"]


def write_hf_tokenizer(tokenizer, out: Path, cfg: ModelConfig) -> None:
    """tokenizer.json (+ lmforge's role file) plus tokenizer_config.json and special_tokens_map.json.

    `tokenizer` is an `lmforge.tokenizers.Tokenizer`; its special-token roles become HF's *_token entries, the
    model's max_seq_len its model_max_length, and a decoder's tokenizer gets lmforge's chat template.
    """
    tokenizer.save(out)
    # Only BERT-style encoders take segment ids.
    inputs = (
        ["input_ids", "token_type_ids", "attention_mask"] if cfg.type_vocab_size else ["input_ids", "attention_mask"]
    )
    chat = CHAT_TEMPLATE if cfg.is_decoder and tokenizer.eos_id is not None else None
    write_tokenizer_config(
        tokenizer, Path(out), model_max_length=cfg.max_seq_len, model_input_names=inputs, chat_template=chat
    )
