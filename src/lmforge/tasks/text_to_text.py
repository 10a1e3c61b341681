"""Text-to-text classification (Raffel et al. 2020 §2.4): a task prefix on the input ("sst2 sentence: ...",
"mnli hypothesis: ... premise: ...") and the label as a word ("positive", "entailment") the model learns to write.

Scored either by generation (greedy; output that is no label word counts as wrong, as in T5) or by label-word
likelihood (rank classification: the label word with the highest log P(word EOS | input) wins). Works with
encoder-decoders and decoder-only models (see seq2seq.py for the input layout)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.registry import TASKS
from lmforge.tasks.inputs import collate
from lmforge.tasks.model import TaskModel
from lmforge.tasks.seq2seq import Seq2Seq, Seq2SeqOptions


@dataclass
class TextToTextOptions(Seq2SeqOptions):
    max_len: int = 256
    template: str = "{text}"
    """Input with its task prefix, e.g. "sst2 sentence: {text}" or "mnli hypothesis: {text_pair} premise: {text}"."""
    label_words: list[str] | None = None
    """The word written for each label, in label-set order (None = the label names)."""
    scoring: Literal["likelihood", "generate"] = "likelihood"
    max_target_len: int = 16
    num_beams: int = 1
    max_new_tokens: int = 8


@TASKS.register("text_to_text")
class TextToText(Seq2Seq):
    name = "text_to_text"
    Options = TextToTextOptions
    needs_labels = True
    default_metrics = ("accuracy",)

    @property
    def words(self) -> list[str]:
        words = self.options.label_words or self.labels
        if len(words) != len(self.labels):
            raise LMForgeError(f"task.label_words has {len(words)} words for {len(self.labels)} labels {self.labels}")
        return list(words)

    def target_text(self, ex: Example, where: str) -> str:
        return self.words[self.label_index(ex.label, where)]

    def features(self, dataset: Dataset, train: bool = False) -> list[dict]:
        if train:
            return super().features(dataset, train=True)
        # Evaluation: the source only; predict() pairs it with every label word.
        return self.prompt_features(dataset, max(len(self.target_ids(w)) for w in self.words))

    def predict(self, model: TaskModel, batch: dict[str, Tensor], feats: list[dict]) -> list:
        if self.options.scoring == "generate":
            lookup = {w.strip().lower(): i for i, w in enumerate(self.words)}
            texts = self.generate_batch(model, feats, self.options.num_beams, self.options.max_new_tokens)
            return [lookup.get(t.strip().lower(), -1) for t in texts]
        return self.rank(model, feats).argmax(-1).tolist()

    @torch.no_grad()
    def rank(self, model: TaskModel, feats: list[dict]) -> Tensor:
        """(B, C) log P(label word c, EOS | source b) for every example and label word."""
        targets = [self.target_ids(w) for w in self.words]
        pairs = [self.pair_feature(f["_prompt"], t) for f in feats for t in targets]  # B·C sequences
        device = next(model.parameters()).device
        batch = {k: v.to(device) for k, v in collate(pairs, self.pad_id).items()}
        logp, _ = self.token_logprobs(model, batch)
        return logp.sum(-1).view(len(feats), len(targets))

    def baselines(self, dataset: Dataset) -> dict[str, dict[str, float]]:
        """None: the floor of a label-choosing task is the majority class (printed for every labelled task);
        copying the input, a summariser's floor, never writes a label word."""
        return {}

    def gold(self, dataset: Dataset) -> list:
        where = dataset.source or "data"
        return [self.label_index(ex.label, f"{where} example {ex.id or i}") for i, ex in enumerate(dataset.examples)]
