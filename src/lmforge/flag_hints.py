"""Flags users bring from other trainers (Hugging Face `Trainer`, litgpt, nanoGPT) → lmforge's own names, each
said in one line: `--lr 3e-4` is refused with "use --train.lr=VALUE", not taken for an unknown section; and the
names a mistyped or shortened name most likely means (`gpt2` → the gpt2-* presets)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from difflib import get_close_matches

_RUN_DIR = "--run.dir=DIR (the run directory: config, checkpoints, metrics)"
_LR = "--train.lr=VALUE (the peak learning rate)"
_STEPS = "--train.max_steps=N (optimizer steps)"
_EPOCHS = "--train.epochs=N (fine-tuning and alignment; pretraining counts --train.max_steps=N)"
_BATCH = "--train.batch_size=N (sequences per process and step; --train.grad_accum=N multiplies it)"
_ACCUM = "--train.grad_accum=N"
_SEQ = "--train.seq_len=N (pretraining; the model's context is --model.max_seq_len=N)"
_INIT = "--init=RUN (finetune, align: the model to start from) or --run.init=RUN (continued pretraining)"
_DATA = "--data.inputs=[FILE,...] (pretraining text) or --data.train=FILE (fine-tuning examples)"
_TOKENIZER = "--data.tokenizer=DIR|NAME (pretraining) or --model.tokenizer=DIR|NAME (fine-tuning)"
_PRECISION = "--train.precision=bf16 (auto, fp32 or bf16)"

FOREIGN_FLAGS: dict[str, str] = {
    "output_dir": _RUN_DIR, "out_dir": _RUN_DIR, "save_dir": _RUN_DIR, "logging_dir": _RUN_DIR,
    "lr": _LR, "learning_rate": _LR,
    "max_steps": _STEPS, "max_iters": _STEPS, "num_steps": _STEPS, "train_steps": _STEPS, "max_tokens": _STEPS,
    "num_train_epochs": _EPOCHS, "epochs": _EPOCHS, "max_epochs": _EPOCHS,
    "per_device_train_batch_size": _BATCH, "batch_size": _BATCH, "train_batch_size": _BATCH,
    "micro_batch_size": _BATCH, "global_batch_size": _BATCH,
    "per_device_eval_batch_size": "--train.eval_batch_size=N (fine-tuning)",
    "gradient_accumulation_steps": _ACCUM, "gradient_accumulation_iters": _ACCUM, "grad_accum": _ACCUM,
    "warmup_steps": "--train.warmup_steps=N", "lr_warmup_steps": "--train.warmup_steps=N",
    "warmup_ratio": "--train.warmup_ratio=F", "weight_decay": "--train.weight_decay=F",
    "seed": "--run.seed=N (experiments: --seeds=0,1,...)",
    "bf16": _PRECISION, "fp16": _PRECISION, "precision": _PRECISION, "mixed_precision": _PRECISION,
    "max_grad_norm": "--train.grad_clip=F", "grad_clip": "--train.grad_clip=F",
    "lr_scheduler_type": "--train.schedule=cosine|linear|constant|wsd",
    "adam_beta1": "--train.beta1=F", "adam_beta2": "--train.beta2=F", "adam_epsilon": "--train.eps=F",
    "optim": "--train.optimizer=adamw|muon", "optimizer": "--train.optimizer=adamw|muon",
    "min_lr": "--train.min_lr_ratio=F (the final learning rate as a fraction of train.lr)",
    "logging_steps": "--train.log_every=N", "log_interval": "--train.log_every=N",
    "eval_steps": "--train.eval_every=N", "eval_interval": "--train.eval_every=N",
    "save_steps": "--train.save_every=N", "save_interval": "--train.save_every=N",
    "save_total_limit": "--train.keep_last=N",
    "max_seq_length": _SEQ, "block_size": _SEQ, "max_length": _SEQ, "seq_length": _SEQ, "seq_len": _SEQ,
    "model_name_or_path": _INIT, "checkpoint_dir": _INIT, "init_from": _INIT, "pretrained": _INIT,
    "resume_from_checkpoint": "--resume (with --run.dir=RUN)",
    "torch_compile": "--train.compile", "compile": "--train.compile",
    "gradient_checkpointing": "--train.activation_checkpointing",
    "dropout": "--model.dropout=F", "device": "--train.device=cpu|cuda|auto",
    "train_file": _DATA, "dataset": _DATA, "dataset_name": _DATA, "data_dir": _DATA, "data_path": _DATA,
    "tokenizer": _TOKENIZER, "tokenizer_name": _TOKENIZER,
    "report_to": "--train.log_to=[tensorboard]", "wandb_log": "--train.log_to=[tensorboard]",
}  # fmt: skip
"""Normalised flag name (lower case, '-' as '_') → lmforge's way to say it."""


def foreign_name(key: str) -> str | None:
    """How lmforge says a flag name of another trainer (`learning_rate` → "--train.lr=VALUE (...)"), or None."""
    return None if "." in key else FOREIGN_FLAGS.get(key.lower().replace("-", "_"))


def foreign_hint(arg: str) -> str | None:
    """The one-line hint for a flag from another trainer (`--learning_rate=3e-4`), or None for lmforge's own."""
    key = arg[2:].partition("=")[0] if arg.startswith("--") else ""
    use = foreign_name(key) if key else None
    return None if use is None else f"unknown option --{key}: lmforge's name for it is {use}"


def _natural(name: str) -> list[tuple]:
    """A sort key that orders sizes by value: gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b (M and B parameters)."""
    key: list[tuple] = []
    for part in re.split(r"(\d+(?:\.\d+)?[mb]?)", name.lower()):
        size = re.fullmatch(r"(\d+(?:\.\d+)?)([mb]?)", part)
        key.append((0, float(size[1]) * (1000 if size[2] == "b" else 1), "") if size else (1, 0.0, part))
    return key


def close_names(name: str, choices: Iterable[str], n: int = 4) -> list[str]:
    """The names of `choices` a user most likely meant by `name`: those that start with it, then those that contain
    it (each smallest size first), else difflib's closest. `gpt2` → gpt2-124m, gpt2-350m, ... (not gpt1)."""
    names, low = list(choices), name.lower()
    starts = sorted((c for c in names if c.lower().startswith(low)), key=_natural)
    contains = sorted((c for c in names if low in c.lower() and c not in starts), key=_natural)
    found = starts + contains
    return found[:n] if found else get_close_matches(name, names, n=1)


def suggest(name: str, choices: Iterable[str], n: int = 4) -> str:
    """The tail of an "unknown name" error: " — did you mean 'gpt2-124m'? (or gpt2-350m, gpt2-774m, gpt2-1.5b)",
    or "" when nothing is close."""
    found = close_names(name, choices, n)
    if not found:
        return ""
    more = f" (or {', '.join(found[1:])})" if len(found) > 1 else ""
    return f" — did you mean '{found[0]}'?{more}"
