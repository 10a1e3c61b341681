"""Sequence-level tasks: one or more framed sequences per example, pooled, then a `SequenceHead`.

Classification, sentence-pair classification, regression and multiple choice are thin subclasses."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput
from lmforge.tasks.base import Task
from lmforge.tasks.heads import Combine, SequenceHead
from lmforge.tasks.model import TaskModel, TaskOutput


class SequenceTask(Task):
    """Frames `sequences(example)` (one (A, B) text pair per sequence) and scores them with a SequenceHead."""

    combine: Combine = "none"

    def n_out(self) -> int:
        return len(self.labels or [])

    def make_head(self, cfg) -> SequenceHead:
        # GPT-1 puts a bare linear layer on the extract token; BERT's [CLS] goes through its pooler (dense + tanh),
        # so models without one (RoBERTa, ELECTRA, BART, T5 encoders) get that transform in the head.
        transform = self.fmt != "gpt" and not (self.fmt == "bert" and cfg.pooler)
        return SequenceHead(cfg.d_model, self.n_out(), self.options.head_dropout, self._combine(), transform)

    def _combine(self) -> Combine:
        return self.combine

    def sequences(self, ex: Example) -> list[tuple[str, str | None]]:
        """The (A, B) texts of each sequence of an example (B None for single texts)."""
        return [(ex.text, ex.text_pair)]

    def target(self, ex: Example, where: str):
        """The label of an example as the loss wants it."""
        return self.label_index(ex.label, where)

    def features(self, dataset: Dataset, train: bool = False) -> list[dict]:
        seqs = [self.sequences(ex) for ex in dataset.examples]
        texts = sorted({t for s in seqs for pair in s for t in pair if t is not None})
        ids = dict(zip(texts, self.tokenizer.encode_batch(texts)))
        feats = []
        for i, (ex, pairs) in enumerate(zip(dataset.examples, seqs)):
            where = f"{dataset.source or 'data'} example {ex.id or i}"
            lengths = [(len(ids[a]) + (len(ids[b]) if b is not None else 0), b is not None) for a, b in pairs]
            cut = [self.check_length(n, self.max_len - self.framer.n_special(pair), where) for n, pair in lengths]
            self.n_truncated += any(cut)
            framed = [self.framer.frame(ids[a], ids[b] if b is not None else None, self.max_len) for a, b in pairs]
            f: dict = {"input_ids": [x for x, _ in framed], "token_type_ids": [t for _, t in framed]}
            if ex.label is not None:
                f["label"] = self.target(ex, f"{dataset.source or 'data'} example {ex.id or i}")
            feats.append(f)
        return feats

    def task_loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(logits.float(), labels)

    def scored(self, model: TaskModel, batch: dict[str, Tensor]) -> tuple[LossOutput, TaskOutput]:
        out = model(batch)
        return self.with_aux(self.task_loss(out.logits, batch["label"]), model, out, batch), out

    def predict(self, model: TaskModel, batch: dict[str, Tensor], feats: list[dict]) -> list:
        return model(batch).logits.argmax(-1).tolist()

    def probabilities(self, model: TaskModel, batch: dict[str, Tensor], feats: list[dict]) -> list[list[float]]:
        return model(batch).logits.float().softmax(-1).tolist()

    def gold(self, dataset: Dataset) -> list:
        where = dataset.source or "data"
        return [self.target(ex, f"{where} example {ex.id or i}") for i, ex in enumerate(dataset.examples)]


class PairMixin:
    """GPT-1 §3.3 similarity: both orderings of the two texts, their extract-token states added element-wise
    (`symmetric`, "gpt" format only; other formats see both texts in one bidirectional pass)."""

    def _symmetric(self) -> bool:
        return bool(self.options.symmetric) and self.fmt == "gpt"

    def _combine(self) -> Combine:
        return "sum" if self._symmetric() else "none"

    def sequences(self, ex: Example) -> list[tuple[str, str | None]]:
        if ex.text_pair is None:
            raise LMForgeError(f"task '{self.name}' needs text pairs, example {ex.id or ex.text[:30]!r} has one text")
        if self._symmetric():
            return [(ex.text, ex.text_pair), (ex.text_pair, ex.text)]
        return [(ex.text, ex.text_pair)]
