"""Predictions of a fine-tuned run on new inputs: labels (with their probabilities), numbers, tags, answer spans or
generated text, as `lmforge predict` prints them and `lmforge.load(ft_run)[0].predict(...)` returns them."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.models import Transformer
from lmforge.tasks.inputs import collate, eval_batches
from lmforge.tasks.model import TaskModel
from lmforge.tasks.sequence import SequenceTask

FIELDS = ("text", "text_pair", "context", "tokens", "choices")


def as_example(item: str | dict | Example, where: str = "input") -> Example:
    """An unlabelled Example from a text, a dict of Example fields, or an Example."""
    if isinstance(item, Example):
        return item
    if isinstance(item, str):
        return Example(text=item)
    if not isinstance(item, dict):
        raise LMForgeError(f"{where}: expected a text or an object with fields {', '.join(FIELDS)}, got {item!r}")
    unknown = [k for k in item if k not in FIELDS and k not in ("id", "label", "tags", "answers", "target")]
    if unknown:
        raise LMForgeError(f"{where}: unknown field '{unknown[0]}' (fields: {', '.join(FIELDS)})")
    for key in ("text", "text_pair", "context"):
        if item.get(key) is not None and not isinstance(item[key], str):
            raise LMForgeError(f"{where}: field '{key}' must be a string, got {item[key]!r}")
    for key in ("tokens", "choices"):
        value = item.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise LMForgeError(f"{where}: field '{key}' must be a list of strings, got {value!r}")
    return Example(text=item.get("text") or "", text_pair=item.get("text_pair"), context=item.get("context"),
                   tokens=item.get("tokens"), choices=item.get("choices"), id=item.get("id"))  # fmt: skip


class Predictor:
    """A fine-tuned task model with its task: `predict(inputs)` → one dict per input with its `prediction`
    (label name, number, tag list, answer text or generated text) and, for classifiers, `scores` (label → P)."""

    def __init__(self, task, model: TaskModel) -> None:
        self.task, self.model = task, model

    @property
    def labels(self) -> list[str] | None:
        return self.task.labels

    @torch.no_grad()
    def predict(self, inputs: list[str | dict | Example] | str, batch_size: int = 32) -> list[dict[str, Any]]:
        items = [inputs] if isinstance(inputs, (str, dict, Example)) else list(inputs)
        if not items:
            raise LMForgeError("nothing to predict: no inputs")
        examples = [as_example(x, f"input {i + 1}") for i, x in enumerate(items)]
        if self.task.name == "token_tagging":
            for ex in examples:
                ex.tokens = ex.tokens if ex.tokens is not None else ex.text.split()
        dataset = Dataset(examples, labels=self.labels, source="input")
        training = self.model.training
        self.model.eval()
        try:
            if isinstance(self.task, SequenceTask):
                return self._sequence(dataset, batch_size)
            preds = self.task.predict_all(self.model, dataset, batch_size)
        finally:
            self.model.train(training)
        return [{"prediction": self._name(p, ex)} for p, ex in zip(preds, examples)]

    def _name(self, pred: Any, ex: Example) -> Any:
        """A label index as its name (text-to-text: -1 = generated text that is no label word)."""
        if self.task.name == "text_to_text":
            return self.labels[pred] if pred >= 0 else None
        if self.task.name == "token_tagging":
            return list(pred)
        return pred

    def _sequence(self, dataset: Dataset, batch_size: int) -> list[dict[str, Any]]:
        """Classifier labels with their probabilities, regression values, or the chosen answer of each choice set."""
        task, device = self.task, next(self.model.parameters()).device
        feats = task.features(dataset)
        out: list[dict[str, Any]] = [{} for _ in feats]
        for idx, chunk in eval_batches(feats, batch_size):  # longest first; back in order by position
            batch = {k: v.to(device) for k, v in collate(chunk, task.pad_id).items()}
            logits = self.model(batch).logits.float()
            if task.name == "regression":
                for i, v in zip(idx, logits.squeeze(-1).tolist()):
                    out[i] = {"prediction": v}
                continue
            for pos, p in zip(idx, logits.softmax(-1).tolist()):
                best = max(range(len(p)), key=p.__getitem__)
                names = task.labels if task.labels else [str(i) for i in range(len(p))]
                out[pos] = {"prediction": names[best], "scores": {n: v for n, v in zip(names, p)}}
        if task.name == "multiple_choice":  # the index of the right answer, and its text
            for o, ex in zip(out, dataset.examples):
                o["prediction"] = int(o["prediction"])
                o["answer"] = (ex.choices or [])[o["prediction"]]
                o["scores"] = dict(enumerate(o["scores"].values()))
        return out


class FineTunedTransformer(Transformer):
    """The backbone of a fine-tuned run as `lmforge.load` returns it: a Transformer like any (generation, logits,
    export and quantisation see the backbone alone; its state dict is the backbone's) that also predicts with the
    run's task head: `model.predict(["a fine film"])` → [{"prediction": "positive", "scores": {...}}]."""

    @classmethod
    def wrap(cls, backbone: Transformer, task, head: nn.Module | None, fmt: str) -> FineTunedTransformer:
        """Turn `backbone` itself into a FineTunedTransformer holding the task and its head (not as submodules)."""
        backbone.__class__ = cls
        backbone.__dict__.update(_task=task, _head=head, _fmt=fmt)
        return backbone  # type: ignore[return-value]

    @property
    def task(self):
        return self.__dict__["_task"]

    @property
    def labels(self) -> list[str] | None:
        return self.task.labels

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        head = self.__dict__.get("_head")
        if head is not None:  # .to(device), .half(): the head follows the backbone
            head._apply(fn, recurse)
        return self

    def train(self, mode: bool = True):
        super().train(mode)
        head = self.__dict__.get("_head")
        if head is not None:
            head.train(mode)
        return self

    def predict(self, inputs: list[str | dict | Example] | str, batch_size: int = 32) -> list[dict[str, Any]]:
        """Predictions of the fine-tuned task on texts or dicts of Example fields (see `Predictor.predict`)."""
        model = TaskModel(self, self.__dict__["_head"], self.__dict__["_fmt"])
        return Predictor(self.task, model).predict(inputs, batch_size)
