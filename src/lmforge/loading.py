"""Reading any run back: a trained model and its tokenizer from a run dir, a checkpoint dir or a Hugging Face model
dir (`load`); a fine-tuned run as its task, task model and config (`load_finetuned`); the backbone a fine-tuning run
starts from (`load_backbone`: a preset, a pretrained or fine-tuned run, a Hugging Face dir)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from lmforge.adapt import merge_and_unload
from lmforge.adapt.adamix import merge_adamix
from lmforge.adapt.finetune import AdapterWeights, apply_peft_section
from lmforge.checkpoint.layout import CHECKPOINTS_DIR
from lmforge.checkpoint.read import is_finetuned, load_weights, read_config
from lmforge.checkpoint.verify import model_checkpoint
from lmforge.errors import LMForgeError
from lmforge.extras import available
from lmforge.models import Transformer
from lmforge.models.hf_training import GENERATION_CONFIG, read_generation_config
from lmforge.models.presets import model_config_from_dict
from lmforge.models.pretrained import find_pretrained, is_hf_only, read_pretrained
from lmforge.registry import MODELS, TASKS
from lmforge.tasks.backbone import SECTIONS, backbone_tokenizer, random_backbone, task_token_rows
from lmforge.tasks.config import FtModelConfig, build_finetune_config
from lmforge.tasks.predictor import FineTunedTransformer
from lmforge.tokenizers import Tokenizer


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
    try:
        return sorted(os.listdir(path / CHECKPOINTS_DIR))
    except OSError:
        return None


def _load(path: Path, device: str | torch.device):
    c, cfg = find_pretrained(path)
    if cfg is not None and is_finetuned(cfg):
        model, tokenizer = _finetuned_backbone(c)
    else:
        model = read_pretrained(c, cfg, Transformer)
        tokenizer = _tokenizer(c, hf_dir=cfg is None)
    if cfg is not None and not c.is_dir():  # rotated away by a live run while it was read: it may be part of it
        raise LMForgeError(f"{c} was removed while it was read")
    _check_finite(model, c)
    if tokenizer is not None and tokenizer.vocab_size > model.config.vocab_size:
        raise LMForgeError(
            f"{c}: tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is {model.config.vocab_size}"
        )
    _generation_config(model, c, tokenizer)
    return model.to(device).eval(), tokenizer


def _generation_config(model: Transformer, c: Path, tokenizer: Tokenizer | None) -> None:
    """The generation config `generate` reads: a saved generation_config.json (its bos / eos / pad ids, when unset
    there, from the tokenizer saved beside it), else the bos / eos / pad ids of the tokenizer loaded with the model.
    Without transformers (the `hf` extra) the model has no generation config and this does nothing."""
    if not available("transformers"):
        return
    if (c / GENERATION_CONFIG).is_file():
        read_generation_config(model, c)
    elif tokenizer is not None:
        model.set_generation_tokens(tokenizer)


def _check_finite(model: torch.nn.Module, where: Path) -> None:
    """One line when weights hold NaN or infinity (a checkpoint a diverging run saved): generation would fail deep
    in sampling, and evaluation print a NaN loss."""
    bad = [n for n, t in model.state_dict().items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise LMForgeError(
            f"{where}: {len(bad)} weight tensor(s) hold NaN or infinity (first: {bad[0]}): the run had diverged "
            "when it saved them; use an earlier checkpoint"
        )


def _tokenizer(c: Path, hf_dir: bool) -> Tokenizer | None:
    """The tokenizer saved beside a model, or None; a Hugging Face dir's that lmforge does not wrap is None too."""
    if not (c / "tokenizer.json").is_file():
        return None
    try:
        return Tokenizer.load(c)
    except LMForgeError:
        if not hf_dir:
            raise
        return None  # e.g. a tokenizer model type lmforge does not wrap


def _finetuned_backbone(c: Path):
    """The fine-tuned weights of a `lmforge finetune` checkpoint as a Transformer (LoRA folded into the weights) that
    also predicts with the run's task head (`model.predict(texts)`, tasks/predictor.py), with the run's tokenizer
    (task tokens included)."""
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


def load_backbone(cfg: FtModelConfig, texts: Callable[[], list[str]]):
    """(backbone, tokenizer) for `model.init`: a preset or "none" (random init), a pretrained run / checkpoint /
    Hugging Face dir (`lmforge.load`), or a fine-tuned run (its backbone, e.g. MNLI before RTE)."""
    init = cfg.init
    if init == "none":
        return random_backbone(cfg.preset, cfg, texts)
    path = Path(init)
    if not path.exists():
        if init in MODELS:
            return random_backbone(init, cfg, texts)
        raise LMForgeError(f"model.init: '{init}' is neither a run/checkpoint/model dir nor a model preset")

    if not is_hf_only(path) and is_finetuned(read_config(model_checkpoint(path))):
        _, model, tokenizer, _ = load_finetuned(path)
        return model.backbone, tokenizer
    model, tokenizer = load(path)
    if tokenizer is None:
        if not cfg.tokenizer:
            raise LMForgeError(f"{init} has no tokenizer lmforge can read: set model.tokenizer")
        tokenizer = backbone_tokenizer(cfg, model.config.arch, texts)
    return model, tokenizer


def load_finetuned(path: str | Path, device: str | torch.device = "cpu"):
    """(task, TaskModel in eval mode, tokenizer, FinetuneConfig) of a fine-tuned run or checkpoint dir. An AdaMix
    model comes back merged (`merge_adamix`): one adapter per site with the experts' averaged weights."""
    c = model_checkpoint(Path(path))
    raw = read_config(c)
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
    load_weights(c, AdapterWeights(model, task_token_rows(tokenizer)) if raw.get("adapter_only") else model)
    if cfg.peft.method == "adamix":  # AdaMix §3.3: inference runs one adapter per site, the experts' average
        merge_adamix(model)
    return task, model.to(device).eval(), tokenizer, cfg
