"""Load a trained model and its tokenizer from a run dir, a checkpoint dir or a Hugging Face model dir."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from lmforge.config import model_config_from_dict
from lmforge.errors import LMForgeError
from lmforge.models import Transformer


def load(path: str | Path, device: str | torch.device = "cpu"):
    """(model, tokenizer) from a run dir (its best checkpoint when it selects one, else its latest good one), a
    checkpoint dir, or a Hugging Face model dir (config.json + model.safetensors / pytorch_model.bin). A fine-tuned
    run gives its fine-tuned backbone (a T5 translator, a GPT with the LM head it kept training), which also
    predicts with the run's task head: `model.predict(["a fine film"])` → labels, tags, answers or text. The model
    is in eval mode; the tokenizer is None when the directory holds none that `Tokenizer.load` reads.

    A run that is training may rotate its checkpoints while one is read: a read that fails while the run's set of
    checkpoints changed is made again from the newest one."""
    path = Path(path)
    if not path.exists():
        raise LMForgeError(f"checkpoint path not found: {path}")
    for attempt in range(_ROTATION_RETRIES + 1):
        before = _checkpoint_names(path)
        try:
            return _load(path, device)
        except Exception:  # noqa: BLE001 — whatever a library raised for a file gone from under it
            if attempt == _ROTATION_RETRIES or before is None or _checkpoint_names(path) == before:
                raise
            time.sleep(0.02)  # let the run finish publishing the checkpoint that replaced it


_ROTATION_RETRIES = 20


def _checkpoint_names(path: Path) -> list[str] | None:
    """The names in a run dir's checkpoints/ (None for anything else: a checkpoint dir is read as it is)."""
    from lmforge.train import checkpoint as ckpt

    try:
        return sorted(os.listdir(path / ckpt.CHECKPOINTS_DIR))
    except OSError:
        return None


def _load(path: Path, device: str | torch.device):
    from lmforge.models.hf import import_hf, is_hf_dir
    from lmforge.tokenizers import Tokenizer
    from lmforge.train import checkpoint as ckpt

    if is_hf_dir(path) and not (path / ckpt.CONFIG_FILE).exists():
        model, c = import_hf(path), path
        try:
            tokenizer = Tokenizer.load(c) if (c / "tokenizer.json").is_file() else None
        except LMForgeError:
            tokenizer = None  # e.g. a tokenizer model type lmforge does not wrap
    else:
        from lmforge.tasks.backbone import is_finetuned

        c = ckpt.model_checkpoint(path)
        cfg = ckpt.read_config(c)
        if is_finetuned(cfg):
            model, tokenizer = _finetuned_backbone(c)
        elif "model" not in cfg:
            raise LMForgeError(f"{c}/config.yaml has no model section")
        else:
            model = Transformer(model_config_from_dict(cfg["model"]))
            _load_run_weights(c, model, cfg)
            tokenizer = Tokenizer.load(c) if (c / "tokenizer.json").is_file() else None
        if not c.is_dir():  # rotated away by a live run while it was read: what was read may be part of it
            raise LMForgeError(f"{c} was removed while it was read")
    if tokenizer is not None and tokenizer.vocab_size > model.config.vocab_size:
        raise LMForgeError(
            f"{c}: tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is {model.config.vocab_size}"
        )
    return model.to(device).eval(), tokenizer


def _finetuned_backbone(c: Path):
    """The fine-tuned weights of a `lmforge finetune` checkpoint as a Transformer (LoRA folded into the weights) that
    also predicts with the run's task head (`model.predict(texts)`, tasks/predictor.py), with the run's tokenizer
    (task tokens included)."""
    from lmforge.adapt import merge_and_unload
    from lmforge.tasks.backbone import load_finetuned
    from lmforge.tasks.predictor import FineTunedTransformer

    task, tuned, tokenizer, cfg = load_finetuned(c)
    backbone = merge_and_unload(tuned.backbone) if cfg.peft.method == "lora" else tuned.backbone
    with torch.device("meta"):
        plain = Transformer(backbone.config).state_dict().keys()
    if backbone.state_dict().keys() != plain:  # adapters, prefixes or prompts added to the network
        raise LMForgeError(
            f"{c}: its {cfg.peft.method} modules live inside the fine-tuned network, so there is no plain model to "
            "load (lmforge eval evaluates the run as it is)"
        )
    return FineTunedTransformer.wrap(backbone, task, tuned.head, tuned.fmt), tokenizer


def _load_run_weights(c: Path, model: Transformer, cfg: dict) -> None:
    """Load a checkpoint's weights into `model`. A run that trains several networks (ELECTRA's generator and
    discriminator, PPO's policy and value function) names, as `export_module` (of its objective, or in its
    config.yaml), the one that `config.yaml`'s model section describes and `load` returns; the other networks'
    weights stay in the checkpoint."""
    from torch import nn

    from lmforge.objectives import OBJECTIVES
    from lmforge.train import checkpoint as ckpt

    name = (cfg.get("objective") or {}).get("name")
    prefix = getattr(OBJECTIVES.get(name), "export_module", "") if name in OBJECTIVES else ""
    prefix = cfg.get("export_module") or prefix
    if not prefix:
        ckpt.load_weights(c, model)
        return
    holder = nn.Module()
    holder.add_module(prefix, model)
    missing, _ = ckpt.load_weights(c, holder, strict=False)
    if missing:
        raise LMForgeError(f"checkpoint does not match the model: key '{missing[0]}' is missing from the checkpoint")
