"""The compressed variants of a compression report, one builder per name of `variants:` in a compress recipe. Each
builder gets the fine-tuned teacher, its task, the training features and the config, and yields (row name, model)
pairs, every model built from a copy of the teacher; the trained ones are runs in OUT/<run name>."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path

from torch import nn

from lmforge.compress.config import CompressConfig
from lmforge.compress.distill import DistillWeights, init_student_from_teacher
from lmforge.compress.prune import (
    head_importance,
    least_important_heads,
    magnitude_prune,
    make_permanent,
    mask_heads,
    remove_heads,
)
from lmforge.compress.qat import apply_qat, export_int8
from lmforge.compress.quantize import quantize_int8
from lmforge.compress.train import distill_loss, task_loss, train_variant

Rows = Iterator[tuple[str, nn.Module]]


def int8_rows(teacher: nn.Module, task, features: list[dict], cfg: CompressConfig, resume: bool) -> Rows:
    yield "teacher int8 (dynamic)", quantize_int8(teacher, skip=cfg.quantize_skip)


def distill_rows(teacher: nn.Module, task, features: list[dict], cfg: CompressConfig, resume: bool) -> Rows:
    """The student of distill.method and its int8 copy."""
    d, out = cfg.distill, Path(cfg.out)
    if d.method == "tinybert":
        from lmforge.compress.tinybert import distill_tinybert

        student = distill_tinybert(teacher, task, features, d, out, seed=cfg.seed, resume=resume)
        name = "student (TinyBERT)"
    else:
        student = init_student_from_teacher(teacher, d.layers)
        w = DistillWeights(d.soft, d.hard, d.hidden, d.temperature, d.hidden_kind)
        loss = distill_loss(teacher, task, w)
        train_variant("distill", student, loss, task, features, d, out / "distill", seed=cfg.seed, resume=resume)
        teacher.to("cpu")  # distillation ran it where the student trained
        name = "student (distilled)"
    yield name, student
    yield "student int8", quantize_int8(student, skip=cfg.quantize_skip)


def magnitude_rows(teacher: nn.Module, task, features: list[dict], cfg: CompressConfig, resume: bool) -> Rows:
    p = cfg.prune
    pruned = copy.deepcopy(teacher)
    magnitude_prune(pruned, p.sparsity)
    train_variant("prune-magnitude", pruned, task_loss(task), task, features, p, Path(cfg.out) / "prune-magnitude",
                  seed=cfg.seed, resume=resume, section="prune")  # fmt: skip
    make_permanent(pruned)
    yield f"magnitude-pruned {p.sparsity:.0%} + fine-tuned", pruned


def heads_rows(teacher: nn.Module, task, features: list[dict], cfg: CompressConfig, resume: bool) -> Rows:
    p = cfg.prune
    headless = copy.deepcopy(teacher)
    heads = least_important_heads(head_importance(headless), p.heads)
    mask_heads(headless, heads)
    train_variant("prune-heads", headless, task_loss(task), task, features, p, Path(cfg.out) / "prune-heads",
                  seed=cfg.seed, resume=resume, section="prune")  # fmt: skip
    make_permanent(headless)
    remove_heads(headless, heads)
    yield f"{p.heads:.0%} heads removed + fine-tuned", headless


def q8bert_rows(teacher: nn.Module, task, features: list[dict], cfg: CompressConfig, resume: bool) -> Rows:
    """Q8BERT: fake-quantised fine-tuning of a copy of the teacher (OUT/q8bert), then its int8 export."""
    q = cfg.qat
    model = copy.deepcopy(teacher)
    apply_qat(model, q.bits, q.ema_decay, q.skip, q.embeddings)
    train_variant("q8bert", model, task_loss(task), task, features, q, Path(cfg.out) / "q8bert",
                  seed=cfg.seed, resume=resume, section="qat")  # fmt: skip
    yield f"Q8BERT QAT, int{q.bits} export", export_int8(model)


VARIANTS: dict[str, Callable[..., Rows]] = {
    "int8": int8_rows,
    "distill": distill_rows,
    "prune-magnitude": magnitude_rows,
    "prune-heads": heads_rows,
    "q8bert": q8bert_rows,
}
"""Name in a recipe's `variants:` → its builder."""
