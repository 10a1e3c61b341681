"""Where a fine-tuning run starts (`model.init` / `--init`) and how a fine-tuned run is loaded back.

A fine-tuned checkpoint stores the `TaskModel` weights (backbone.* and head.*), the tokenizer (with any task tokens
added), and a config.yaml holding the fine-tuning config plus `backbone` (the model's resolved ModelConfig) and
`labels` (the label set), which is all `load_finetuned` needs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from lmforge.errors import LMForgeError
from lmforge.tasks.config import FinetuneConfig, FtModelConfig, build_finetune_config, finetune_to_dict

FAMILY_BY_ARCH = {"decoder": "gpt", "encoder": "bert", "encoder-decoder": "t5"}
SECTIONS = ("run", "model", "task", "data", "train", "peft")


def _tokenizer_for(cfg: FtModelConfig, arch: str, texts: Callable[[], list[str]]):
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
    tokenizer = _tokenizer_for(cfg, base.arch, texts)
    vocab = tokenizer.vocab_size if not cfg.tokenizer else max(tokenizer.vocab_size, base.vocab_size)
    mc = dataclasses.replace(base, vocab_size=vocab)
    if tokenizer.pad_id is not None:
        mc.pad_id = tokenizer.pad_id
    return Transformer(mc), tokenizer


def is_finetuned(ckpt_config: dict) -> bool:
    return "backbone" in ckpt_config and "task" in ckpt_config


def load_backbone(cfg: FtModelConfig, texts: Callable[[], list[str]]):
    """(backbone, tokenizer) for `model.init`: a preset or "none" (random init), a pretrained run / checkpoint /
    Hugging Face dir (`lmforge.load`), or a fine-tuned run (its backbone, e.g. MNLI before RTE)."""
    from lmforge.registry import MODELS

    init = cfg.init
    if init == "none":
        return random_backbone(cfg.preset, cfg, texts)
    path = Path(init)
    if not path.exists():
        if init in MODELS:
            return random_backbone(init, cfg, texts)
        raise LMForgeError(f"model.init: '{init}' is neither a run/checkpoint/model dir nor a model preset")
    from lmforge.loading import load
    from lmforge.train import checkpoint as ckpt

    if not _is_hf_only(path) and is_finetuned(ckpt.read_config(ckpt.model_checkpoint(path))):
        _, model, tokenizer, _ = load_finetuned(path)
        return model.backbone, tokenizer
    model, tokenizer = load(path)
    if tokenizer is None:
        if not cfg.tokenizer:
            raise LMForgeError(f"{init} has no tokenizer lmforge can read: set model.tokenizer")
        tokenizer = _tokenizer_for(cfg, model.config.arch, texts)
    return model, tokenizer


def _is_hf_only(path: Path) -> bool:
    from lmforge.models.hf import is_hf_dir
    from lmforge.train.checkpoint import CONFIG_FILE

    return is_hf_dir(path) and not (path / CONFIG_FILE).exists()


def task_token_rows(tokenizer) -> list[int]:
    """Embedding rows of the GPT task tokens the tokenizer holds (added by fine-tuning, not in model.init)."""
    from lmforge.tasks.inputs import GPT_TOKENS

    return [i for i in map(tokenizer.token_to_id, GPT_TOKENS) if i is not None]


def checkpoint_config(cfg: FinetuneConfig, backbone, labels: list[str] | None) -> dict:
    """What a fine-tuned checkpoint's config.yaml holds: the fine-tuning config, the backbone's ModelConfig and
    the label set."""
    return {**finetune_to_dict(cfg), "backbone": dataclasses.asdict(backbone.config), "labels": labels}


def load_finetuned(path: str | Path, device: str | torch.device = "cpu"):
    """(task, TaskModel in eval mode, tokenizer, FinetuneConfig) of a fine-tuned run or checkpoint dir. An AdaMix
    model comes back merged (`merge_adamix`): one adapter per site with the experts' averaged weights."""
    from lmforge.adapt.adamix import merge_adamix
    from lmforge.adapt.finetune import AdapterWeights, apply_peft_section
    from lmforge.config import model_config_from_dict
    from lmforge.models import Transformer
    from lmforge.registry import TASKS
    from lmforge.tokenizers import Tokenizer
    from lmforge.train import checkpoint as ckpt

    c = ckpt.model_checkpoint(Path(path))
    raw = ckpt.read_config(c)
    if not is_finetuned(raw):
        raise LMForgeError(f"{c} is not a fine-tuned checkpoint (its config has no task and backbone sections)")
    cfg = build_finetune_config({k: raw[k] for k in SECTIONS if k in raw})
    tokenizer = Tokenizer.load(c)
    if raw.get("adapter_only"):  # the frozen weights are model.init's; the checkpoint holds the adapter + head
        backbone, _ = load_backbone(cfg.model, lambda: [])
    else:
        backbone = Transformer(model_config_from_dict(raw["backbone"]))
    task = TASKS.get(cfg.task.type)(cfg.task.options, tokenizer, raw.get("labels"))
    model = task.build(backbone)
    apply_peft_section(model, cfg.peft)
    ckpt.load_weights(c, AdapterWeights(model, task_token_rows(tokenizer)) if raw.get("adapter_only") else model)
    if cfg.peft.method == "adamix":  # AdaMix §3.3: inference runs one adapter per site, the experts' average
        merge_adamix(model)
    return task, model.to(device).eval(), tokenizer, cfg
