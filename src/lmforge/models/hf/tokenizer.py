"""Tokenizer files of an exported Hugging Face dir, so that `AutoTokenizer.from_pretrained(dir)` works."""

from __future__ import annotations

import json
from pathlib import Path

from lmforge.models.config import ModelConfig

TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"


def write_hf_tokenizer(tokenizer, out: Path, cfg: ModelConfig) -> None:
    """tokenizer.json (+ lmforge's role file) plus tokenizer_config.json and special_tokens_map.json.

    `tokenizer` is an `lmforge.tokenizers.Tokenizer`; its special-token roles become HF's *_token entries.
    """
    tokenizer.save(out)
    specials = {f"{role}_token": text for role, text in tokenizer.special_tokens.items()}
    # Only BERT-style encoders take segment ids.
    inputs = (
        ["input_ids", "token_type_ids", "attention_mask"] if cfg.type_vocab_size else ["input_ids", "attention_mask"]
    )
    extra = [tokenizer.id_to_token(i) for i in tokenizer.sentinel_ids(tokenizer.num_sentinels)]
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": cfg.max_seq_len,
        "model_input_names": inputs,
        "clean_up_tokenization_spaces": False,
        **specials,
    }
    special_map = dict(specials)
    if extra:  # T5 sentinels <extra_id_N>
        tok_cfg["additional_special_tokens"] = special_map["additional_special_tokens"] = extra
    for name, data in ((TOKENIZER_CONFIG, tok_cfg), (SPECIAL_TOKENS_MAP, special_map)):
        (Path(out) / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
