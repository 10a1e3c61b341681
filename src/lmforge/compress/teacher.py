"""The teacher of a compression report: a fine-tuned classification run, loaded or fine-tuned here."""

from __future__ import annotations

from pathlib import Path

from lmforge.compress.config import CompressConfig
from lmforge.errors import LMForgeError


def load_teacher(cfg: CompressConfig, resume: bool = False):
    """(task, task model in eval mode on the CPU, splits) of the configured teacher. Without `teacher.run`, the
    teacher is fine-tuned first with `teacher.recipe` into OUT/teacher (reused when it finished there; with
    `resume`, an unfinished one continues)."""
    from lmforge.checkpoint.layout import list_checkpoints
    from lmforge.data.labelled.examples import Dataset
    from lmforge.loading import load_finetuned
    from lmforge.tasks.data import load_splits

    t = cfg.teacher
    run = Path(t.run) if t.run else Path(cfg.out) / "teacher"
    if t.run is None and not (run / "eval.json").is_file():
        _finetune_teacher(cfg, run, resume and bool(list_checkpoints(run)))
    if not run.exists():
        raise LMForgeError(f"teacher.run: {run} not found")
    task, model, _, ft_cfg = load_finetuned(run)
    splits = load_splits(ft_cfg.data)
    if t.max_eval is not None:
        dev = splits["dev"]
        splits["dev"] = Dataset(dev.examples[: t.max_eval], dev.labels, dev.source, dev.task_type)
    if not task.labels:
        raise LMForgeError(f"the teacher's task '{task.name}' has no label set: the report needs a classifier")
    return task, model.cpu().eval(), splits


def _finetune_teacher(cfg: CompressConfig, run: Path, resume: bool) -> None:
    from lmforge.finetuning.run import FineTuner
    from lmforge.tasks.config import load_finetune_config

    ft = load_finetune_config(cfg.teacher.recipe, [*cfg.teacher.overrides, f"--run.dir={run}", "--train.device=cpu"])
    print(f"fine-tuning the teacher ({cfg.teacher.recipe}) into {run}", flush=True)
    FineTuner(ft, resume=resume).fit()
