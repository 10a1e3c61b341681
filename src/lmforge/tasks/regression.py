"""Sentence-pair regression (STS-B similarity scores 0–5): one output unit, mean squared error.

GPT-1 §3.3 similarity: both orderings, extract states added (`symmetric: true`); BERT: `[CLS] A [SEP] B [SEP]`.
Metrics: Pearson and Spearman correlation."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from lmforge.data.labelled.examples import Example
from lmforge.errors import LMForgeError
from lmforge.registry import TASKS
from lmforge.tasks.base import TaskOptions
from lmforge.tasks.model import TaskModel
from lmforge.tasks.sequence import PairMixin, SequenceTask


@dataclass
class RegressionOptions(TaskOptions):
    symmetric: bool = False
    """GPT-1 similarity input: score both orderings of the pair ("gpt" format only)."""


@TASKS.register("regression")
class Regression(PairMixin, SequenceTask):
    name = "regression"
    Options = RegressionOptions
    default_metrics = ("pearson", "spearman")

    def n_out(self) -> int:
        return 1

    def sequences(self, ex: Example) -> list[tuple[str, str | None]]:
        return [(ex.text, None)] if ex.text_pair is None else super().sequences(ex)

    def target(self, ex: Example, where: str) -> float:
        try:
            return float(ex.label)
        except (TypeError, ValueError):
            raise LMForgeError(f"{where}: regression label {ex.label!r} is not a number") from None

    def task_loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())

    def predict(self, model: TaskModel, batch: dict[str, Tensor], feats: list[dict]) -> list:
        return model(batch).logits.squeeze(-1).float().tolist()
