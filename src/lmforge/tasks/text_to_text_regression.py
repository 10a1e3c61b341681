"""Text-to-text regression (Raffel et al. 2020 §2.4, STS-B): the score is written as text. Targets are rounded to
the nearest `step` (0.2 in T5: 2.57 -> "2.6"); the model generates a string, and one that reads as a number in
the training scores' range becomes the prediction. Any other output is invalid: it is scored as the mean
training score and counted in the `invalid` metric (the fraction of such outputs), so a correlation is never
computed over silently dropped examples. Metrics: Pearson and Spearman correlation.

The training scores' lowest, highest and mean value are the task's "label set": saved with the run like a
classifier's label names, so a reloaded run judges its outputs by the same range."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.registry import TASKS
from lmforge.tasks.model import TaskModel
from lmforge.tasks.seq2seq import Seq2Seq, Seq2SeqOptions


@dataclass
class TextRegressionOptions(Seq2SeqOptions):
    max_len: int = 256
    step: float = 0.2
    """Targets are rounded to a multiple of this and written with as many decimals as it has."""
    max_target_len: int = 8
    num_beams: int = 1
    max_new_tokens: int = 8


def score_text(value: float, step: float) -> str:
    """A score as the target string: rounded to a multiple of `step`, with step's decimals (2.57, 0.2 -> "2.6")."""
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step < 1 else 0
    return f"{round(value / step) * step:.{decimals}f}"


def parse_score(text: str, low: float, high: float) -> float | None:
    """The number a generated string reads as, or None when it is no number or lies outside [low, high]."""
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and low <= value <= high else None


@TASKS.register("text_to_text_regression")
class TextToTextRegression(Seq2Seq):
    name = "text_to_text_regression"
    Options = TextRegressionOptions
    default_metrics = ("pearson", "spearman")

    def __init__(self, options, tokenizer, labels=None) -> None:
        super().__init__(options, tokenizer, labels)
        if not options.step > 0:
            raise LMForgeError(f"task.step must be positive, got {options.step}")
        try:
            self.low, self.high, self.mean = (float(x) for x in labels)
        except (TypeError, ValueError):
            raise LMForgeError(f"text_to_text_regression needs the scores' [low, high, mean], got {labels}") from None

    @classmethod
    def label_set(cls, train: Dataset) -> list[str]:
        where = train.source or "training data"
        scores = [cls.score(ex, f"{where} example {ex.id or i}") for i, ex in enumerate(train.examples)]
        if not scores:
            raise LMForgeError(f"{where}: no scored examples")
        return [repr(min(scores)), repr(max(scores)), repr(sum(scores) / len(scores))]

    @staticmethod
    def score(ex: Example, where: str) -> float:
        try:
            value = float(ex.label)
        except (TypeError, ValueError):
            raise LMForgeError(f"{where}: regression label {ex.label!r} is not a number") from None
        if not math.isfinite(value):
            raise LMForgeError(f"{where}: regression label {ex.label!r} is not a finite number")
        return value

    def target_text(self, ex: Example, where: str) -> str:
        return score_text(self.score(ex, where), self.options.step)

    def features(self, dataset: Dataset, train: bool = False) -> list[dict]:
        if train:
            return super().features(dataset, train=True)
        return self.prompt_features(dataset, self.options.max_target_len)

    def predict(self, model: TaskModel, batch: dict[str, Tensor], feats: list[dict]) -> list:
        texts = self.generate_batch(model, feats, self.options.num_beams, self.options.max_new_tokens)
        return [parse_score(t, self.low, self.high) for t in texts]

    def gold(self, dataset: Dataset) -> list:
        where = dataset.source or "data"
        return [self.score(ex, f"{where} example {ex.id or i}") for i, ex in enumerate(dataset.examples)]

    def evaluate(self, model: TaskModel, dataset: Dataset, batch_size: int = 64) -> dict[str, float]:
        from lmforge.tasks.scoring import score

        preds = self.predict_all(model, dataset, batch_size)
        invalid = sum(p is None for p in preds)
        filled = [self.mean if p is None else p for p in preds]
        return {**score(self.metric_names, filled, self.gold(dataset)), "invalid": invalid / max(len(preds), 1)}
