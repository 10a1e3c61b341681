"""Training of compressed task models — fine-tuning after pruning, distillation into a student — over the
fine-tuning tasks' features (`lmforge.tasks`), each as an ordinary run of the one loop in its own run dir, so a
killed report resumes exactly (`lmforge compress report --resume`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import Tensor, nn

from lmforge.checkpoint.verify import latest_checkpoint
from lmforge.compress.config import CompressTrain
from lmforge.compress.distill import DistillWeights, distillation_loss
from lmforge.errors import LMForgeError
from lmforge.finetuning.run import FeatureBatches
from lmforge.objectives.base import LossOutput
from lmforge.train.loop_spec import LoopSpec, Saved
from lmforge.train.session import RunSession


def train_variant(
    name: str, model: nn.Module, loss_fn, task, features: list[dict], cfg: CompressTrain, run_dir: Path,
    *, seed: int = 0, resume: bool = False, section: str = "distill",
) -> dict:  # fmt: skip
    """Train `model` (in place, on cfg.device; back on the CPU afterwards, where the report measures it) with
    `loss_fn(model, batch) -> LossOutput` for cfg.max_steps steps in `run_dir`, logging to cfg.log_to as well;
    a run already finished there (with `resume`) only has its weights loaded. `section`: the config section of
    `cfg` (distill, prune), for error lines."""
    if not features:
        raise LMForgeError("no training features")
    # One process (the report's); the variant's own config goes to the sinks, its checkpoints name the variant.
    session = RunSession(run_dir, cfg, seed=seed, distributed=False, section=section)
    variant = {"variant": {"name": name}}
    with session.closing():
        session.find_resume(variant, resume, frozen=("variant",))
        spec = LoopSpec(saved=lambda: Saved(model, variant), progress_every=10)
        batches = FeatureBatches(features, cfg.batch_size, session.dist, seed, task.pad_id)
        config = variant | {section: dataclasses.asdict(cfg)}
        loop = session.start(model.to(session.device), loss_fn, batches, spec, config=config, save_config=False)
        loop.run()
        model.to("cpu").eval()
        return {"steps": loop.step, "checkpoint": str(latest_checkpoint(session.dir))}


def task_loss(task):
    """The task's own loss (fine-tuning a pruned model; pruning masks stay applied throughout)."""
    return lambda model, batch: task.loss(model, batch)


def distill_loss(teacher: nn.Module, task, weights: DistillWeights):
    """Train a student task model on the teacher's soft class distribution, the gold labels and (DistilBERT) the
    teacher's last hidden states over real tokens (student and teacher of the same width)."""
    teacher.eval()

    def loss_fn(student: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        teacher.to(next(iter(batch.values())).device)  # where the student trains (a no-op once there)
        with torch.no_grad():
            t = teacher(batch)
        s = student(batch)
        label = batch.get("label")
        if not isinstance(s.logits, Tensor) or label is None or label.dtype != torch.long:
            raise LMForgeError(f"distillation needs a classification-style task, got '{task.name}'")
        loss, parts = distillation_loss(s.logits, t.logits, batch["label"], weights, s.hidden, t.hidden, s.mask)
        return LossOutput(loss, len(label), parts)

    return loss_fn
