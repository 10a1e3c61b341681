"""Sentence-pair classification (MNLI, QNLI, RTE, WNLI entailment; MRPC, QQP paraphrase).

GPT-1 §3.3 entailment: `<|start|> premise <|delim|> hypothesis <|extract|>`; similarity (`symmetric: true`): both
orderings, extract states added element-wise before the linear head. BERT §4.1: `[CLS] A [SEP] B [SEP]` with segment
ids 0/1. Loss: cross-entropy (+ λ·LM loss for GPT-1); metrics: accuracy (MRPC/QQP: F1 and accuracy)."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.registry import TASKS
from lmforge.tasks.base import TaskOptions
from lmforge.tasks.sequence import PairMixin, SequenceTask


@dataclass
class PairOptions(TaskOptions):
    symmetric: bool = False
    """GPT-1 similarity input: score both orderings of the pair ("gpt" format only)."""


@TASKS.register("pair_classification")
class PairClassification(PairMixin, SequenceTask):
    name = "pair_classification"
    Options = PairOptions
    needs_labels = True
    chooses_label = True
    default_metrics = ("accuracy",)
