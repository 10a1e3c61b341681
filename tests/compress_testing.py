"""A tiny fine-tuned classifier for the compression tests: gpt-tiny fine-tuned from scratch (the fine-tuning code's
own run) on real sentences with one inserted sentiment word (train 240, dev 80)."""

from __future__ import annotations

from pathlib import Path

import tasks_testing as T
import torch

from lmforge.data.labelled.examples import Dataset
from lmforge.finetuning.run import FineTuner
from lmforge.tasks.config import load_finetune_config


def fine_tuned_teacher(d: Path) -> Path:
    """The run dir of the teacher, fine-tuned into d/run on one CPU thread (~20 s)."""
    full = T.sentiment(320, seed=1)
    splits = {"train": Dataset(full.examples[:240], full.labels), "dev": Dataset(full.examples[240:], full.labels)}
    data = T.write_labelled_dir(d / "data", splits)
    over = [f"--run.dir={d / 'run'}", "--data.source=dir", f"--data.dir={data}", "--train.batch_size=16",
            "--train.lr=2e-3", "--train.warmup_ratio=0.1", "--task.max_len=48", "--train.epochs=4",
            "--model.vocab_size=400", "--train.device=cpu"]  # fmt: skip
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        FineTuner(load_finetune_config("sst2-gpt", over, init="gpt-tiny")).fit()
    finally:
        torch.set_num_threads(n)
    return d / "run"
