"""Single-sentence classification (SST-2, CoLA): one text → a label.

GPT-1 §3.3: `<|start|> text <|extract|>`, linear head on the extract token; BERT §4.1: `[CLS] text [SEP]`, head on
[CLS]'s pooled state. Loss: cross-entropy (+ λ·LM loss for GPT-1); metrics: accuracy (CoLA: Matthews corr.)."""

from __future__ import annotations

from lmforge.data.examples import Example
from lmforge.registry import TASKS
from lmforge.tasks.sequence import SequenceTask


@TASKS.register("classification")
class Classification(SequenceTask):
    name = "classification"
    needs_labels = True
    default_metrics = ("accuracy",)

    def sequences(self, ex: Example) -> list[tuple[str, str | None]]:
        return [(ex.text, None)]
