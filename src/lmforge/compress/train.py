"""Training of compressed task models: fine-tuning after pruning and distillation into a student, over the
fine-tuning tasks' features (`lmforge.tasks`) with AdamW and a linear warmup + decay."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from lmforge.compress.distill import DistillWeights, distillation_loss
from lmforge.config import TrainConfig
from lmforge.errors import LMForgeError
from lmforge.train.optim import build_optimizer, build_scheduler


def _batches(task, features: list[dict], batch_size: int, seed: int, device: torch.device):
    from lmforge.tasks.inputs import batches, collate

    epoch = 0
    while True:
        gen = torch.Generator().manual_seed(seed * 1000 + epoch)
        for chunk in batches(features, batch_size, gen):
            yield {k: v.to(device) for k, v in collate(chunk, task.pad_id).items()}
        epoch += 1


def train_steps(
    model: nn.Module,
    loss_fn: Callable[[dict[str, Tensor]], Tensor],
    task,
    features: list[dict],
    *,
    steps: int,
    lr: float,
    batch_size: int = 32,
    seed: int = 0,
    warmup_ratio: float = 0.1,
) -> list[float]:
    """`steps` AdamW steps of loss_fn(batch) over shuffled task features; returns the loss of every step."""
    if steps <= 0:
        return []
    if not features:
        raise LMForgeError("no training features")
    sched = TrainConfig(
        max_steps=steps, lr=lr, schedule="linear", min_lr_ratio=0.0, warmup_steps=max(1, round(warmup_ratio * steps)),
        weight_decay=0.01, beta2=0.999,
    )  # fmt: skip
    device = next(model.parameters()).device
    opt = build_optimizer(model, sched, device)
    scheduler = build_scheduler(opt, sched)
    params = [p for p in model.parameters() if p.requires_grad]
    data = _batches(task, features, batch_size, seed, device)
    losses = []
    model.train()
    for _ in range(steps):
        loss = loss_fn(next(data))
        if not torch.isfinite(loss):
            raise LMForgeError("the loss became non-finite (lower the learning rate)")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        scheduler.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def finetune(model: nn.Module, task, features: list[dict], **kw) -> list[float]:
    """Fine-tune a (pruned) task model with the task's own loss; pruning masks stay applied throughout."""
    return train_steps(model, lambda b: task.loss(model, b).loss, task, features, **kw)


def distill(
    student: nn.Module, teacher: nn.Module, task, features: list[dict], weights: DistillWeights, **kw
) -> list[float]:
    """Train a student task model on the teacher's soft class distribution, the gold labels and (DistilBERT) the
    teacher's last hidden states over real tokens (student and teacher of the same width)."""
    teacher.eval()

    def loss_fn(batch: dict[str, Tensor]) -> Tensor:
        with torch.no_grad():
            t = teacher(batch)
        s = student(batch)
        label = batch.get("label")
        if not isinstance(s.logits, Tensor) or label is None or label.dtype != torch.long:
            raise LMForgeError(f"distillation needs a classification-style task, got '{task.name}'")
        loss, _ = distillation_loss(s.logits, t.logits, batch["label"], weights, s.hidden, t.hidden, s.mask)
        return loss

    return train_steps(student, loss_fn, task, features, **kw)
