"""Training of compressed task models — fine-tuning after pruning, distillation into a student — over the
fine-tuning tasks' features (`lmforge.tasks`), each as an ordinary run of the one loop in its own run dir, so a
killed report resumes exactly (`lmforge compress report --resume`)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from lmforge.compress.config import CompressTrain
from lmforge.compress.distill import DistillWeights, distillation_loss
from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput
from lmforge.train import checkpoint as ckpt
from lmforge.train.distributed import DistInfo
from lmforge.train.finetune import FeatureBatches
from lmforge.train.loop import Loop, LoopSpec, Saved
from lmforge.train.metrics import MetricsLogger
from lmforge.train.resume import resume_checkpoint
from lmforge.train.rundir import lock_run_dir


def train_variant(
    name: str, model: nn.Module, loss_fn, task, features: list[dict], cfg: CompressTrain, run_dir: Path,
    *, seed: int = 0, resume: bool = False,
) -> dict:  # fmt: skip
    """Train `model` (in place, on the CPU) with `loss_fn(model, batch) -> LossOutput` for cfg.max_steps steps in
    `run_dir`; a run already finished there (with `resume`) only has its weights loaded."""
    if not features:
        raise LMForgeError("no training features")
    run_dir = Path(run_dir)
    dist, device = DistInfo(), torch.device("cpu")
    lock = lock_run_dir(run_dir, dist)
    try:
        start = resume_checkpoint(run_dir, {"variant": {"name": name}}, resume, frozen=("variant",))
        torch.manual_seed(seed)
        spec = LoopSpec(saved=lambda: Saved(model, {"variant": {"name": name}}), progress_every=10)
        batches = FeatureBatches(features, cfg.batch_size, dist, seed, task.pad_id)
        loop = Loop(model, loss_fn, batches, cfg, run_dir, spec, dist=dist, device=device, log=None)
        if start is not None:
            loop.restore(start)
        with MetricsLogger(run_dir, resume_step=loop.step) as log:
            loop.log = log
            loop.run()
        model.eval()
        return {"steps": loop.step, "checkpoint": str(ckpt.latest_checkpoint(run_dir))}
    finally:
        lock.release()


def task_loss(task):
    """The task's own loss (fine-tuning a pruned model; pruning masks stay applied throughout)."""
    return lambda model, batch: task.loss(model, batch)


def distill_loss(teacher: nn.Module, task, weights: DistillWeights):
    """Train a student task model on the teacher's soft class distribution, the gold labels and (DistilBERT) the
    teacher's last hidden states over real tokens (student and teacher of the same width)."""
    teacher.eval()

    def loss_fn(student: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        with torch.no_grad():
            t = teacher(batch)
        s = student(batch)
        label = batch.get("label")
        if not isinstance(s.logits, Tensor) or label is None or label.dtype != torch.long:
            raise LMForgeError(f"distillation needs a classification-style task, got '{task.name}'")
        loss, parts = distillation_loss(s.logits, t.logits, batch["label"], weights, s.hidden, t.hidden, s.mask)
        return LossOutput(loss, len(label), parts)

    return loss_fn
