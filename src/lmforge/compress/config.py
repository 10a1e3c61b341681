"""Compression report configuration: typed sections loaded from YAML recipes in `recipes/compress/` with
dotted CLI overrides, validated by `lmforge.config`'s helpers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lmforge.config import all_keys, build_dataclass, recipe_dict
from lmforge.errors import LMForgeError


@dataclass
class TeacherConfig:
    run: str | None = None
    """A fine-tuned run dir (`lmforge finetune ...`) to compress; None = fine-tune one first with `recipe`."""
    recipe: str = "sst2-gpt"
    """Fine-tuning recipe (recipes/finetune/ name or path) for the teacher when `run` is None."""
    overrides: list[str] = field(default_factory=list)
    """Dotted overrides of that fine-tuning, e.g. ["--train.epochs=1", "--data.max_train=2000"]."""
    max_eval: int | None = None
    """Use only the first N dev examples for the accuracy column (None = all)."""


@dataclass
class DistillSection:
    layers: list[int] | None = None
    """Teacher layers the student keeps (None = every other layer: 0, 2, 4, ...)."""
    steps: int = 300
    lr: float = 1e-4
    batch_size: int = 32
    temperature: float = 2.0
    soft: float = 0.5
    """Weight of the T²-scaled soft-target KL (Hinton et al. 2015)."""
    hard: float = 0.5
    """Weight of the cross-entropy with the gold labels."""
    hidden: float = 1.0
    """Weight of the hidden-state loss (DistilBERT's cosine loss)."""
    hidden_kind: Literal["cosine", "mse"] = "cosine"


@dataclass
class PruneSection:
    sparsity: float = 0.5
    """Global magnitude pruning: the fraction of the blocks' linear weights set to zero."""
    heads: float = 0.5
    """Head pruning: the fraction of self-attention heads removed (lowest output-projection norm first)."""
    steps: int = 200
    """Fine-tuning steps after each kind of pruning."""
    lr: float = 5e-5
    batch_size: int = 32


@dataclass
class BenchSection:
    runs: int = 10
    """Timed forward passes per batch size (the median is reported)."""
    warmup: int = 2
    threads: int = 1
    """CPU threads during the whole report (1 = comparable numbers on a shared machine)."""
    eval_batch_size: int = 64


@dataclass
class CompressConfig:
    out: str = "runs/compress"
    """Where report.md and report.json go (and the teacher's fine-tuning run when it is trained here)."""
    seed: int = 0
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    distill: DistillSection = field(default_factory=DistillSection)
    prune: PruneSection = field(default_factory=PruneSection)
    bench: BenchSection = field(default_factory=BenchSection)
    quantize_skip: list[str] = field(default_factory=list)
    """Linear layers left in float32 by int8 quantisation (qualified names or their last parts, e.g. lm_head)."""


def build_compress_config(raw: dict) -> CompressConfig:
    cfg = build_dataclass(CompressConfig, raw, "", all_keys(CompressConfig))
    if not 0 <= cfg.prune.sparsity < 1:
        raise LMForgeError(f"prune.sparsity must be in [0, 1), got {cfg.prune.sparsity}")
    if not 0 <= cfg.prune.heads < 1:
        raise LMForgeError(f"prune.heads must be in [0, 1), got {cfg.prune.heads}")
    if cfg.distill.temperature <= 0:
        raise LMForgeError(f"distill.temperature must be positive, got {cfg.distill.temperature}")
    for name in ("runs", "threads", "eval_batch_size"):
        if getattr(cfg.bench, name) <= 0:
            raise LMForgeError(f"bench.{name} must be positive, got {getattr(cfg.bench, name)}")
    return cfg


def load_compress_config(
    recipe: str | Path | None = None, overrides: list[str] | dict | None = None, teacher: str | None = None
) -> CompressConfig:
    """Recipe (path or bundled name in recipes/compress/) + dotted overrides (+ `--teacher RUN`)."""
    extra = {"teacher": {"run": teacher}} if teacher is not None else None
    return build_compress_config(recipe_dict(recipe, "compress", overrides, extra))
