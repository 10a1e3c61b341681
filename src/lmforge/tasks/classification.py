"""Single-sentence classification (SST-2, CoLA): one text → a label.

GPT-1 §3.3: `<|start|> text <|extract|>`, linear head on the extract token; BERT §4.1: `[CLS] text [SEP]`, head on
[CLS]'s pooled state; `task.format: prompt` (PET / LM-BFF): the text in a template with a mask token, each label
scored by the LM head's logit of its word there (tasks/prompt.py). Loss: cross-entropy (+ λ·LM loss for GPT-1);
metrics: accuracy (CoLA: Matthews corr.)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.registry import TASKS
from lmforge.tasks.base import TaskOptions
from lmforge.tasks.prompt import DEFAULT_TEMPLATE, VerbalizerHead, build_prompt
from lmforge.tasks.sequence import SequenceTask


@dataclass
class ClassificationOptions(TaskOptions):
    template: str = DEFAULT_TEMPLATE
    """format=prompt: the input around the text, with {text} and {mask} once each (LM-BFF's SST-2 template by
    default). The text is cut to fit task.max_len; the template never is."""
    verbalizer: list[str] | None = None
    """format=prompt: each label's word as LABEL=WORD items (`negative=terrible,positive=great`), one token each;
    None = the label names themselves."""


@TASKS.register("classification")
class Classification(SequenceTask):
    name = "classification"
    Options = ClassificationOptions
    needs_labels = True
    chooses_label = True
    prompt_format = True
    default_metrics = ("accuracy",)

    def sequences(self, ex: Example) -> list[tuple[str, str | None]]:
        return [(ex.text, None)]

    def make_head(self, cfg) -> nn.Module:
        if self.fmt != "prompt":
            return super().make_head(cfg)
        if not cfg.lm_head:
            raise LMForgeError("task.format=prompt scores label words with the model's LM head; this model has none")
        self.prompt = build_prompt(self.options.template, self.labels, self.options.verbalizer, self.tokenizer)
        return VerbalizerHead(self.prompt.word_ids)

    def features(self, dataset: Dataset, train: bool = False) -> list[dict]:
        if self.fmt != "prompt":
            return super().features(dataset, train)
        prompt, start = self.prompt, len(self.framer.start)
        budget = self.max_len - self.framer.n_special(False) - prompt.n_tokens
        if budget < 1:
            raise LMForgeError(
                f"task.max_len={self.max_len} leaves no room for the text beside the template's {prompt.n_tokens} "
                "tokens and the special tokens"
            )
        feats, source = [], dataset.source or "data"
        texts = self.tokenizer.encode_batch([prompt.text_prefix + ex.text for ex in dataset.examples])
        for i, (ex, ids) in enumerate(zip(dataset.examples, texts)):
            where = f"{source} example {ex.id or i}"
            if self.check_length(len(ids), budget, where):
                self.n_truncated += 1
                ids = ids[:budget]
            seq, at = prompt.frame(ids)
            framed, _ = self.framer.frame(seq)
            f: dict = {"input_ids": framed, "token_type_ids": [0] * len(framed), "mask_pos": start + at}
            if ex.label is not None:
                f["label"] = self.target(ex, where)
            feats.append(f)
        return feats
