"""Translation by prompting a language model, as GPT-2 did (Radford et al. 2019 §3.7): the model is conditioned on
example pairs in the format `english sentence = french sentence`, then on `english sentence =`, and its greedy
continuation up to the end of the line is the translation, scored by corpus BLEU (sacreBLEU) against the reference.

The example pairs are solved pairs of the train split, drawn per query by a generator seeded with `seed`; without a
train split (one file of pairs, `--data.test=FILE`) they are drawn from the evaluated split itself, never the query
being translated. GPT-2 does not say how many pairs it showed; `k` (default 4) sets it, `k=0` is the bare prompt."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from lmforge.data.labelled.examples import Dataset
from lmforge.errors import LMForgeError
from lmforge.eval.fewshot import GenerateOptions, PromptGenerate, build_prompt, sample_demos
from lmforge.eval.lm import LM
from lmforge.registry import EVALS
from lmforge.tasks import file_sources  # noqa: F401  (registers data.source=parallel)


@dataclass
class TranslateOptions(GenerateOptions):
    template: str = "{text} ="
    """The query: the source sentence and " =" (GPT-2 §3.7's `english sentence =`)."""
    answer_prefix: str = " "
    """Between " =" and a demonstration's translation."""
    k: int = 4
    """Example pairs before each query (0 = zero-shot)."""
    separator: str = "\n"
    """Between the example pairs and the query: one pair a line."""
    until: list[str] = field(default_factory=lambda: ["\n"])
    """The translation ends at the first newline (GPT-2: "the first generated sentence")."""
    max_tokens: int = 64
    metrics: list[str] | None = field(default_factory=lambda: ["bleu"])


@EVALS.register("translate")
class Translate(PromptGenerate):
    """GPT-2-style translation prompts: k solved pairs, then the source and " =", greedy decoding to the end of the
    line, BLEU against `Example.target`."""

    Options = TranslateOptions

    def pool(self, splits: dict[str, Dataset], split: str) -> Dataset:
        """Where the example pairs come from: the train split, else the evaluated split itself."""
        train = splits.get("train")
        return train if train is not None and train.examples else splits[split]

    def prompts(self, splits: dict[str, Dataset], split: str) -> list[str]:
        rng = random.Random(self.o.seed)
        pool = self.pool(splits, split)
        others = len(pool.examples) - (pool is splits[split])
        if self.o.k > others:
            where = "train split" if pool is not splits[split] else f"{split} split (no train split given)"
            raise LMForgeError(f"translate: eval.k={self.o.k} example pairs per query, but the {where} has "
                               f"{others} pairs to draw them from")  # fmt: skip
        out = []
        for ex in splits[split].examples:
            demos = sample_demos(pool, self.o.k, rng, ex)  # never the query itself
            solved = [(d, self.o.answer_prefix + (d.target or "")) for d in demos]
            out.append(build_prompt(self.o.template, solved, ex, self.o.separator))
        return out

    def run(self, lm: LM, splits: dict[str, Dataset], split: str) -> dict[str, float]:
        from lmforge.tasks.scoring import require_metric_packages

        require_metric_packages(self.o.metrics or ["bleu"])  # before any decoding: BLEU needs sacrebleu
        return super().run(lm, splits, split)
