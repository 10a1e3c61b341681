"""What a fine-tuning run starts from when `model.init` names a preset (a random backbone and its tokenizer), and what
its checkpoints hold: the `TaskModel` weights (backbone.* and head.*), the tokenizer (with any task tokens added), and
a config.yaml with the fine-tuning config plus `backbone` (the model's resolved ModelConfig) and `labels` (the label
set), which is all `lmforge.loading.load_finetuned` needs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from lmforge.tasks.config import FinetuneConfig, FtModelConfig, finetune_to_dict
from lmforge.tokenizers.specials import FAMILY_BY_ARCH

SECTIONS = ("run", "model", "task", "data", "train", "peft")


def backbone_tokenizer(cfg: FtModelConfig, arch: str, texts: Callable[[], list[str]]):
    """`model.tokenizer` (a path or a published name), or one trained on the task's texts for a model of `arch`."""
    from lmforge.tokenizers import train_tokenizer
    from lmforge.tokenizers.published import load_tokenizer

    if cfg.tokenizer:  # a path, or a published tokenizer by name
        return load_tokenizer(cfg.tokenizer, "model.tokenizer")
    return train_tokenizer(texts(), cfg.tokenizer_kind, cfg.vocab_size, family=FAMILY_BY_ARCH[arch],
                           size_key="model.vocab_size", frequency_key=None)  # fmt: skip


def random_backbone(preset: str, cfg: FtModelConfig, texts: Callable[[], list[str]]):
    """A randomly initialised preset and a tokenizer (`model.tokenizer`, or one trained on the task's texts)."""
    from lmforge.models import Transformer, get_preset

    base = get_preset(preset)
    tokenizer = backbone_tokenizer(cfg, base.arch, texts)
    vocab = tokenizer.vocab_size if not cfg.tokenizer else max(tokenizer.vocab_size, base.vocab_size)
    mc = dataclasses.replace(base, vocab_size=vocab)
    if tokenizer.pad_id is not None:
        mc.pad_id = tokenizer.pad_id
    return Transformer(mc), tokenizer


def task_token_rows(tokenizer) -> list[int]:
    """Embedding rows of the GPT task tokens the tokenizer holds (added by fine-tuning, not in model.init)."""
    from lmforge.tasks.inputs import GPT_TOKENS

    return [i for i in map(tokenizer.token_to_id, GPT_TOKENS) if i is not None]


def checkpoint_config(cfg: FinetuneConfig, backbone, labels: list[str] | None) -> dict:
    """What a fine-tuned checkpoint's config.yaml holds: the fine-tuning config, the backbone's ModelConfig and
    the label set."""
    return {**finetune_to_dict(cfg), "backbone": dataclasses.asdict(backbone.config), "labels": labels}
