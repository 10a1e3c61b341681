"""Zero-shot grammatical minimal pairs (BLiMP, Warstadt et al. 2020; BabyLM's zero-shot evaluation): a pair is right
when the model gives its acceptable sentence a higher (pseudo-)log-likelihood than the unacceptable one, each
sentence scored whole by the model's own family (eval/sentence_scores.py). A tie counts as wrong: a model that
scores both sentences alike has told them apart in no way (Păpușoi & Nisioi, BabyLM 2025, report an artifact of
BabyLM's pipeline by which a system giving both sentences identical logits reaches maximal accuracy).

Metrics: `accuracy`, the mean over paradigms of each paradigm's accuracy (the headline: BabyLM's pipelines average
their BLiMP subtasks unweighted, and BLiMP's 67 paradigms of 1,000 pairs make it BLiMP's own overall accuracy);
`accuracy_pairs`, the share of all pairs right (it differs from `accuracy` when paradigms differ in size, as
BabyLM's vocabulary-filtered copies do); then, as `breakdown` asks, `field/<field>`, `phenomenon/<linguistics_term>`
(the 12 columns of BabyLM 2023's tables) and `paradigm/<name>`, each the share of its pairs right."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.eval.sentence_scores import SentenceScorer, sentence_scorer
from lmforge.registry import EVALS

Breakdown = Literal["field", "phenomenon", "paradigm"]
ALL_PAIRS = "all"
"""The paradigm of pairs whose data names none."""


@dataclass
class MinimalPairsOptions:
    breakdown: list[Breakdown] = field(default_factory=lambda: ["field", "phenomenon", "paradigm"])
    """The per-group accuracies reported beside the overall ones (an experiment's table gets a column for each: an
    evaluation that compares many runs may keep just [field])."""


def accuracies(examples: list[Example], correct: list[bool], breakdown: list[str]) -> dict[str, float]:
    """The metrics of the module docstring, for pairs `examples` judged `correct`."""
    if not examples:
        raise LMForgeError("minimal pairs: no pairs to evaluate")
    groups: dict[str, dict[str, list[bool]]] = {g: {} for g in ("paradigm", *breakdown)}
    for e, ok in zip(examples, correct):
        for g, members in groups.items():
            name = e.meta.get(g, ALL_PAIRS if g == "paradigm" else None)
            if name:
                members.setdefault(str(name), []).append(ok)
    paradigms = [sum(v) / len(v) for v in groups["paradigm"].values()]
    out = {"accuracy": sum(paradigms) / len(paradigms), "accuracy_pairs": sum(correct) / len(correct)}
    for g in breakdown:
        for name in sorted(groups[g]):
            v = groups[g][name]
            out[f"{g}/{name}"] = sum(v) / len(v)
    return out


@EVALS.register("minimal_pairs")
class MinimalPairs:
    """Acceptable vs unacceptable sentence (`Example.text` vs `Example.text_pair`): which one the model finds more
    likely, for decoders, encoders and encoder-decoders alike."""

    Options = MinimalPairsOptions

    def __init__(self, options: MinimalPairsOptions) -> None:
        self.o = options

    def scorer(self, model, tokenizer, batch_size: int, source: str | Path | None = None) -> SentenceScorer:
        """What `run` is given in place of the decoder LM of the other methods: the model family's scorer."""
        return sentence_scorer(model, tokenizer, batch_size, source)

    def judge(self, scorer: SentenceScorer, examples: list[Example]) -> list[bool]:
        """Whether each pair's acceptable sentence scores strictly higher."""
        for e in examples:
            if not e.text_pair:
                raise LMForgeError(
                    f"minimal pairs: example {e.id or e.text[:40]!r} has no unacceptable sentence (text_pair); "
                    "read minimal pairs with data.source=blimp"
                )
        scores = scorer.score([s for e in examples for s in (e.text, e.text_pair)])
        return [g.logprob > b.logprob for g, b in zip(scores[0::2], scores[1::2])]

    def run(self, scorer: SentenceScorer, splits: dict[str, Dataset], split: str) -> dict[str, float]:
        examples = splits[split].examples
        return accuracies(examples, self.judge(scorer, examples), list(self.o.breakdown))
