"""Prompted evaluation: a template turns an example into text, k solved training examples go before it
(in-context few-shot, Brown et al. 2020 §2; k = 0 is zero-shot), and the model either picks the label word it finds
most likely after the prompt or writes an answer (GPT-2-style task prompts, e.g. "TL;DR:" for summaries,
Radford et al. 2019 §3.6).

Demonstrations are drawn from the train split, k per query, by a generator seeded with `seed`. The multiple-choice
and Winograd methods (eval/zeroshot.py) take them too (`FewShotOptions`, `demonstrations`): a demonstration is a
solved example, the right answer in place."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from lmforge.config.types import Seed
from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.eval.lm import LM
from lmforge.registry import EVALS
from lmforge.tasks.seq2seq import render


@dataclass
class PromptOptions:
    template: str = "{text}"
    """How an example reads: fields {text}, {text_pair}, {context}."""
    label_words: list[str] | None = None
    """The continuation that means each label, in label-set order (None: " " + the label name)."""
    k: int = 0
    """Solved training examples before each query (0 = zero-shot)."""
    seed: Seed = 0
    separator: str = "\n\n"
    """Between demonstrations and the query."""
    normalize: Literal["sum", "mean"] = "sum"
    """Compare label words by total or by mean token log-probability."""
    metrics: list[str] | None = None


def sample_demos(train: Dataset | None, k: int, rng: random.Random, exclude: Example | None = None) -> list[Example]:
    """k training examples (never the query itself)."""
    if k == 0:
        return []
    pool = [e for e in (train.examples if train else []) if e is not exclude]
    if len(pool) < k:
        raise LMForgeError(f"few-shot k={k} needs at least {k} training examples, the train split has {len(pool)}")
    return rng.sample(pool, k)


@dataclass
class FewShotOptions:
    """In-context demonstrations (Brown et al. 2020 §2): k solved training examples, drawn per query by a
    generator seeded with `seed` (never the query itself), before each query; k = 0 is zero-shot."""

    k: int = 0
    seed: Seed = 0
    separator: str = "\n\n"
    """Between demonstrations and the query."""


def demonstrations(
    o: FewShotOptions, splits: dict[str, Dataset], split: str, solve: Callable[[Example], str]
) -> list[str]:
    """Per example of `split`: its k solved demonstrations, each followed by the separator ("" when k = 0)."""
    rng = random.Random(o.seed)
    out = []
    for ex in splits[split].examples:
        demos = sample_demos(splits.get("train"), o.k, rng, ex)
        out.append("".join(solve(d) + o.separator for d in demos))
    return out


def build_prompt(template: str, demos: list[tuple[Example, str]], query: Example, separator: str = "\n\n") -> str:
    """Demonstrations (each rendered + its answer) and the rendered query, joined by separator."""
    parts = [render(template, ex) + answer for ex, answer in demos]
    return separator.join([*parts, render(template, query)])


def label_names(splits: dict[str, Dataset], split: str) -> list[str]:
    for ds in (splits.get("train"), splits[split]):
        if ds is not None and ds.labels:
            return [str(x) for x in ds.labels]
    found = {str(e.label) for ds in splits.values() for e in ds.examples if e.label is not None}
    if not found:
        raise LMForgeError("prompted classification needs labelled examples")
    return sorted(found)


@EVALS.register("prompt_classify")
class PromptClassify:
    """Classify by the most likely label word after the (few-shot) prompt (GPT-1 §5 SST-2: "… very" followed by
    " positive" or " negative")."""

    Options = PromptOptions

    def __init__(self, options: PromptOptions) -> None:
        self.o = options

    def words(self, labels: list[str]) -> list[str]:
        words = self.o.label_words or [f" {x}" for x in labels]
        if len(words) != len(labels):
            raise LMForgeError(f"label_words has {len(words)} words for {len(labels)} labels {labels}")
        return list(words)

    def prompts(self, splits: dict[str, Dataset], split: str) -> list[str]:
        """The prompt of each example of `split` (deterministic in `seed`)."""
        labels = label_names(splits, split)
        words = self.words(labels)
        rng = random.Random(self.o.seed)
        out = []
        for ex in splits[split].examples:
            demos = sample_demos(splits.get("train"), self.o.k, rng, ex)
            solved = [(d, words[labels.index(str(d.label))]) for d in demos]
            out.append(build_prompt(self.o.template, solved, ex, self.o.separator))
        return out

    def predict(self, lm: LM, splits: dict[str, Dataset], split: str) -> list[int]:
        words = self.words(label_names(splits, split))
        prompts = self.prompts(splits, split)
        scored = lm.score([(p, w) for p in prompts for w in words])
        values = [s.mean if self.o.normalize == "mean" else s.total for s in scored]
        n = len(words)
        return [max(range(n), key=lambda j: values[i * n + j]) for i in range(len(prompts))]

    def run(self, lm: LM, splits: dict[str, Dataset], split: str) -> dict[str, float]:
        from lmforge.tasks.scoring import score

        labels = label_names(splits, split)
        gold = [labels.index(str(e.label)) for e in splits[split].examples]
        return score(self.o.metrics or ["accuracy"], self.predict(lm, splits, split), gold)


@dataclass
class GenerateOptions:
    template: str = "{text}\nTL;DR:"
    """GPT-2 §3.6 summarisation prompt; any template with {text}, {text_pair}, {context}."""
    answer_prefix: str = " "
    """Put before a demonstration's answer."""
    k: int = 0
    seed: Seed = 0
    separator: str = "\n\n"
    until: list[str] = field(default_factory=lambda: ["\n"])
    """Stop strings: the answer ends before the first."""
    max_tokens: int = 64
    metrics: list[str] | None = None


@EVALS.register("prompt_generate")
class PromptGenerate:
    """Write the answer after the (few-shot) prompt; score it against `Example.target` (ROUGE by default)."""

    Options = GenerateOptions

    def __init__(self, options: GenerateOptions) -> None:
        self.o = options

    def prompts(self, splits: dict[str, Dataset], split: str) -> list[str]:
        rng = random.Random(self.o.seed)
        out = []
        for ex in splits[split].examples:
            demos = sample_demos(splits.get("train"), self.o.k, rng, ex)
            solved = [(d, self.o.answer_prefix + (d.target or "")) for d in demos]
            out.append(build_prompt(self.o.template, solved, ex, self.o.separator))
        return out

    def run(self, lm: LM, splits: dict[str, Dataset], split: str) -> dict[str, float]:
        from lmforge.tasks.scoring import score

        outs = lm.generate_until([(p, self.o.until, self.o.max_tokens) for p in self.prompts(splits, split)])
        gold = [e.target or "" for e in splits[split].examples]
        return score(self.o.metrics or ["rouge1", "rouge2", "rougeL"], [o.strip() for o in outs], gold)
