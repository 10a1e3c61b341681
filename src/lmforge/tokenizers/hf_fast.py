"""lmforge's `Tokenizer` as a `transformers` fast tokenizer: `to_transformers` wraps the same trained `tokenizers`
backend in a `PreTrainedTokenizerFast` with the special tokens by their roles, the model's context as
model_max_length, the padding side and, for decoders, a chat template; `tokenizer_config` is the
tokenizer_config.json entries that make `AutoTokenizer.from_pretrained(dir)` build the same one.

The chat template renders lmforge's "chat" format (align/templates.py, the one `lmforge align` SFT trains on): the
family's BOS where it differs from EOS, then per message `<|role|>`, a newline, the content and EOS; the generation
prompt is `<|assistant|>` and a newline. Byte-level BPE (GPT) tokenizers give the same ids as the align template,
which tokenizes each piece apart; a Metaspace (Llama, T5) tokenizer marks word starts differently inside one text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from lmforge.errors import LMForgeError
from lmforge.files import loads_json

CHAT_TEMPLATE = (
    "{% if bos_token and bos_token != eos_token %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""Jinja chat template of lmforge's "chat" format (module docstring)."""

DECODER_FAMILIES = ("gpt", "llama")
"""Tokenizer families trained for decoders (`specials.FAMILY_BY_ARCH`): they get the chat template by default."""

TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
_HF_UNBOUNDED = 10**18  # transformers' "no limit" model_max_length is 1e30: read as none


def model_input_names(tokenizer) -> list[str]:
    """What a batch of this tokenizer holds: BERT's segment ids besides ids and mask (HF BertTokenizer's)."""
    if tokenizer.family == "bert":
        return ["input_ids", "token_type_ids", "attention_mask"]
    return ["input_ids", "attention_mask"]


def special_tokens(tokenizer) -> dict[str, Any]:
    """HF's special-token arguments (`eos_token`, ..., T5's sentinels as additional_special_tokens)."""
    out: dict[str, Any] = {f"{role}_token": text for role, text in tokenizer.special_tokens.items()}
    sentinels = [tokenizer.id_to_token(i) for i in tokenizer.sentinel_ids(tokenizer.num_sentinels)]
    if sentinels:
        out["additional_special_tokens"] = sentinels
    return out


def tokenizer_config(tokenizer) -> dict[str, Any]:
    """tokenizer_config.json of `tokenizer` (an lmforge `Tokenizer`), as `to_transformers` builds it."""
    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_input_names": model_input_names(tokenizer),
        "padding_side": tokenizer.padding_side,
        "truncation_side": tokenizer.truncation_side,
        "clean_up_tokenization_spaces": False,
        **special_tokens(tokenizer),
    }
    if tokenizer.model_max_length is not None:
        cfg["model_max_length"] = tokenizer.model_max_length
    if tokenizer.chat_template is not None:
        cfg["chat_template"] = tokenizer.chat_template
    return cfg


def write_tokenizer_config(tokenizer, out: Path, **overrides: Any) -> None:
    """tokenizer_config.json and special_tokens_map.json of `tokenizer` in `out` (`overrides` win; one that is None
    leaves its entry out)."""
    cfg = {k: v for k, v in {**tokenizer_config(tokenizer), **overrides}.items() if v is not None}
    specials = {k: v for k, v in cfg.items() if k.endswith("_token") or k == "additional_special_tokens"}
    for name, data in ((TOKENIZER_CONFIG, cfg), (SPECIAL_TOKENS_MAP, specials)):
        (Path(out) / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def to_transformers(tokenizer):
    """A `transformers.PreTrainedTokenizerFast` over a copy of `tokenizer`'s backend, with its special tokens,
    model_max_length, padding and truncation sides and chat template."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError as e:
        raise LMForgeError("a transformers tokenizer needs transformers: pip install -e '.[hf]'") from e
    cfg = tokenizer_config(tokenizer)
    cfg.pop("tokenizer_class")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend, **cfg)


def read_context(directory: Path) -> dict[str, Any]:
    """What a tokenizer saved in `directory` should know of the model it serves: model_max_length, chat_template
    and padding_side from a tokenizer_config.json there, else the model's max_seq_len and (for a decoder) the chat
    template from the config.yaml of an lmforge checkpoint or run there; {} when neither file is there."""
    hf = directory / TOKENIZER_CONFIG
    if hf.is_file():
        try:
            cfg = loads_json(hf.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise LMForgeError(f"cannot load tokenizer: {hf} is not valid JSON ({e})") from e
        if not isinstance(cfg, dict):
            raise LMForgeError(f"cannot load tokenizer: {hf} does not hold a mapping")
        out = {k: cfg[k] for k in ("model_max_length", "chat_template", "padding_side") if k in cfg}
        length = out.get("model_max_length")
        if not isinstance(length, int) or length >= _HF_UNBOUNDED:
            out.pop("model_max_length", None)
        return out
    model = _model_section(directory / "config.yaml")
    if model is None:
        return {}
    out = {"chat_template": CHAT_TEMPLATE if model.get("arch", "decoder") == "decoder" else None}
    if isinstance(model.get("max_seq_len"), int):
        out["model_max_length"] = model["max_seq_len"]
    return out


def _model_section(path: Path) -> dict | None:
    """The model section of an lmforge config.yaml (a fine-tuned run's backbone), or None."""
    if not path.is_file():
        return None
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return None  # the checkpoint reader reports a broken config.yaml; the tokenizer itself is readable
    if not isinstance(config, dict):
        return None
    for section in ("backbone", "model"):
        if isinstance(config.get(section), dict) and "arch" in config[section]:
            return config[section]
    return None
