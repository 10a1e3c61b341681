"""Labelled examples shared by readers, task types and evaluation. Readers produce these; tasks consume them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Example:
    """One labelled example. Which fields are set depends on the task type:

    - classification / regression: `text` (+ `text_pair` for sentence pairs), `label` (str class name or float)
    - multiple choice: `text` (context / question), `choices`, `label` (index of the right choice, int)
    - span QA: `text` (question), `context`, `answers` [(char_start, answer_text), ...] (empty = no answer, SQuAD 2.0)
    - token tagging: `tokens` (words), `tags` (one BIO tag per word)
    - text-to-text / seq2seq: `text` (source), `target` (reference text)
    """

    text: str = ""
    text_pair: str | None = None
    label: str | int | float | None = None
    choices: list[str] | None = None
    context: str | None = None
    answers: list[tuple[int, str]] | None = None
    tokens: list[str] | None = None
    tags: list[str] | None = None
    target: str | None = None
    id: str | None = None
    meta: dict = field(default_factory=dict)


@dataclass
class Dataset:
    """A labelled split: examples + the label set (classification/tagging) and where it came from."""

    examples: list[Example]
    labels: list[str] | None = None
    source: str = ""
    task_type: str | None = None
    """What the labels are, as the reader knows it: classification, regression, multiple_choice, span, tagging or
    text_to_text (None = not stated)."""


def example_texts(datasets: list[Dataset]) -> list[str]:
    """Every text of the examples (to train a tokenizer for a randomly initialised model; the held-out n-grams of
    test-set decontamination)."""
    out = []
    for ds in datasets:
        for e in ds.examples:
            out += [t for t in (e.text, e.text_pair, e.context, e.target) if t]
            out += list(e.choices or []) + [" ".join(e.tokens or [])]
    return [t for t in out if t]
