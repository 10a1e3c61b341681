"""Zero-shot evaluation of a pretrained language model (GPT-1 §5 "Zero-shot behaviours"), and the runner of every
prompted evaluation (recipes in `recipes/eval/`: a `data` section as fine-tuning has, an `eval` section naming a
method registered in `EVALS` plus its options).

Methods here: acceptability (CoLA: mean token log-prob above a threshold tuned on train), choice (multiple choice,
RACE: the answer with the highest mean log-prob given the context), winograd (WSC, DPR: substitute each referent
for the pronoun, the most likely sentence or rest of the sentence wins). Choice and winograd also run few-shot
(`k` solved training examples first). Label-word classification (SST-2: "… very" + " positive"/" negative") and
prompted generation are in `eval/fewshot.py`, GPT-2's translation prompts ("english sentence = french sentence")
in `eval/translate_prompt.py`. Story Cloze is `choice` on `data.source=story-cloze`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from lmforge.config import all_keys, build_dataclass, recipe_dict, resolve_recipe
from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.eval.fewshot import FewShotOptions, demonstrations
from lmforge.eval.lm import LM
from lmforge.registry import EVALS
from lmforge.tasks.config import FtDataConfig
from lmforge.tasks.seq2seq import render, template_tail


def best_threshold(scores: list[float], positive: list[bool]) -> float:
    """The threshold t maximising the Matthews correlation of "score > t" against `positive` (of equally good
    thresholds, the one that predicts the fewest positives)."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(positive, dtype=np.float64)
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    n, P = len(s), y.sum()
    tp = np.concatenate([[0.0], np.cumsum(y)])  # predicting the top i as positive, i = 0..n
    fp = np.arange(n + 1) - tp
    fn, tn = P - tp, (n - P) - fp
    denom = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    mcc = np.where(denom > 0, (tp * tn - fp * fn) / np.where(denom > 0, denom, 1), 0.0)
    # Cutting between ranks i-1 and i only makes sense where the scores differ.
    valid = np.concatenate([[True], s[:-1] > s[1:], [True]])
    i = int(np.argmax(np.where(valid, mcc, -np.inf)))
    if i == 0:
        return float(s[0]) if n else 0.0
    if i == n:
        return float(s[-1]) - 1.0
    return float((s[i - 1] + s[i]) / 2)


@dataclass
class AcceptabilityOptions:
    tune_split: str = "train"
    """Split the threshold is tuned on (GPT-1 §5 tunes on the training data)."""
    max_tune: int | None = 1000
    positive_label: str = "1"
    """The label meaning "acceptable"."""
    metrics: list[str] = field(default_factory=lambda: ["mcc", "accuracy"])


@EVALS.register("acceptability")
class Acceptability:
    """CoLA zero-shot: mean token log-probability of the sentence, thresholded."""

    Options = AcceptabilityOptions

    def __init__(self, options: AcceptabilityOptions) -> None:
        self.o = options

    def mean_logprobs(self, lm: LM, ds: Dataset) -> list[float]:
        out = []
        for parts in lm.score_rolling([e.text for e in ds.examples]):
            lp = [x for p in parts for x in p.logprobs]
            out.append(sum(lp) / max(len(lp), 1))
        return out

    def run(self, lm: LM, splits: dict[str, Dataset], split: str) -> dict[str, float]:
        from lmforge.tasks.scoring import score

        if self.o.tune_split not in splits:
            raise LMForgeError(f"acceptability: no '{self.o.tune_split}' split to tune the threshold on")
        tune = splits[self.o.tune_split]
        tune = Dataset(tune.examples[: self.o.max_tune], tune.labels, tune.source)
        positive = [str(e.label) == self.o.positive_label for e in tune.examples]
        threshold = best_threshold(self.mean_logprobs(lm, tune), positive)
        ev = splits[split]
        preds = [int(x > threshold) for x in self.mean_logprobs(lm, ev)]
        gold = [int(str(e.label) == self.o.positive_label) for e in ev.examples]
        return score(self.o.metrics, preds, gold)


@dataclass
class ChoiceOptions(FewShotOptions):
    template: str = "{text}"
    """The context; fields {text}, {text_pair}, {context}."""
    choice_prefix: str = " "
    normalize: Literal["mean", "sum"] = "mean"
    """GPT-1 §5: the answer with the highest average token log-probability."""
    blank: str | None = None
    """The gap of cloze-style questions (RACE: "_"): when the question holds it, the context ends at the gap and
    the answer is scored there, what follows the gap is not scored (a solved demonstration fills the gap)."""


def _answer(e: Example, where: str) -> str:
    if not e.choices or not isinstance(e.label, int) or not 0 <= e.label < len(e.choices):
        raise LMForgeError(f"{where} example {e.id or e.text[:40]!r} has no right choice to demonstrate")
    return e.choices[e.label]


@EVALS.register("choice")
class Choice:
    """Multiple choice (RACE, Story Cloze, COPA): the most likely answer given the context (GPT-1 §5 zero-shot;
    with k > 0, after k solved examples)."""

    Options = ChoiceOptions

    def __init__(self, options: ChoiceOptions) -> None:
        self.o = options

    def _cloze(self, e: Example) -> bool:
        return bool(self.o.blank) and self.o.blank in str(e.meta.get("question", e.text))

    def request(self, e: Example, choice: str) -> tuple[str, str]:
        """(context, continuation) scoring `choice` as the answer to `e`."""
        rendered = render(self.o.template, e)
        if self._cloze(e):
            return rendered.rpartition(self.o.blank)[0], choice
        return rendered, self.o.choice_prefix + choice

    def solved(self, e: Example) -> str:
        """A demonstration: the example with its right answer in place."""
        answer = _answer(e, "choice")
        if self._cloze(e):
            head, _, tail = render(self.o.template, e).rpartition(self.o.blank)
            prompt = template_tail(self.o.template)  # e.g. "\nAnswer:": the gap is the answer here
            return head + answer + (tail[: -len(prompt)] if prompt and tail.endswith(prompt) else tail)
        return render(self.o.template, e) + self.o.choice_prefix + answer

    def run(self, lm: LM, splits: dict[str, Dataset], split: str) -> dict[str, float]:
        from lmforge.tasks.scoring import score

        exs = splits[split].examples
        prefixes = demonstrations(self.o, splits, split, self.solved)
        reqs = []
        for e, prefix in zip(exs, prefixes):
            for c in e.choices or []:
                ctx, cont = self.request(e, c)
                reqs.append((prefix + ctx, cont))
        scored = iter(lm.score(reqs))
        preds = []
        for e in exs:
            vals = [s.mean if self.o.normalize == "mean" else s.total for _, s in zip(e.choices or [], scored)]
            preds.append(int(np.argmax(vals)))
        return score(["accuracy"], preds, [int(e.label) for e in exs])


@dataclass
class WinogradOptions(FewShotOptions):
    blank: str = "_"
    """The placeholder in `Example.text` that each of `choices` replaces."""
    scoring: Literal["full", "partial"] = "full"
    """full: log-prob of the whole substituted sentence; partial: of the words after the blank given the
    substituted start (Trinh & Le 2018; GPT-1 §5 scores "the rest of the sequence after the substitution")."""


@EVALS.register("winograd")
class Winograd:
    """Winograd schemas (WSC273, DPR, SuperGLUE WSC): substitute each referent for the pronoun (the blank); the
    most likely sentence (full) or continuation after the referent (partial) wins."""

    Options = WinogradOptions

    def __init__(self, options: WinogradOptions) -> None:
        self.o = options

    def solved(self, e: Example) -> str:
        return e.text.replace(self.o.blank, _answer(e, "winograd"), 1)

    def run(self, lm: LM, splits: dict[str, Dataset], split: str) -> dict[str, float]:
        from lmforge.tasks.scoring import score

        exs = splits[split].examples
        for e in exs:
            if self.o.blank not in e.text or not e.choices:
                raise LMForgeError(f"winograd example {e.id or e.text[:40]!r} needs a '{self.o.blank}' and choices")
        prefixes = demonstrations(self.o, splits, split, self.solved)
        if self.o.scoring == "full" and self.o.k == 0:
            values = lm.loglikelihood_rolling([e.text.replace(self.o.blank, c, 1) for e in exs for c in e.choices])
        else:
            reqs = []
            for e, prefix in zip(exs, prefixes):
                head, tail = e.text.split(self.o.blank, 1)
                if self.o.scoring == "full":  # the whole substituted sentence, after the demonstrations
                    reqs += [(prefix, head + c + tail) for c in e.choices]
                else:
                    reqs += [(prefix + head + c, tail) for c in e.choices]
            values = [lp for lp, _ in lm.loglikelihood(reqs)]
        it, preds = iter(values), []
        for e in exs:
            preds.append(int(np.argmax([v for _, v in zip(e.choices, it)])))
        return score(["accuracy"], preds, [int(e.label) for e in exs])


# --- prompted-evaluation recipes --------------------------------------------------------------------------------


@dataclass
class EvalSection:
    method: str = "prompt_classify"
    """A registered method: prompt_classify, prompt_generate, translate, acceptability, choice, winograd,
    minimal_pairs."""
    options: Any = None


@dataclass
class PromptEvalConfig:
    name: str = ""
    """Row name in the results table (default: the recipe's name)."""
    split: str = "dev"
    batch_size: int = 16
    device: str = "auto"
    data: FtDataConfig = field(default_factory=FtDataConfig)
    eval: EvalSection = field(default_factory=EvalSection)


def _methods_registered() -> None:
    # prompt_classify, prompt_generate; minimal_pairs; translate
    from lmforge.eval import fewshot, minimal_pairs, translate_prompt  # noqa: F401
    from lmforge.tasks import file_sources  # noqa: F401  (data.source story-cloze, parallel)


def load_prompt_config(recipe: str | Path, overrides: list[str] | dict | None = None) -> PromptEvalConfig:
    """A prompted-evaluation recipe (path or bundled name in recipes/eval/) + dotted overrides."""
    _methods_registered()
    path = resolve_recipe(str(recipe), kind="eval")
    raw = recipe_dict(path, "eval", overrides, schema=PromptEvalConfig)
    section = raw.pop("eval", None)
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise LMForgeError(f"eval: expected a mapping, got {section!r}")
    section = dict(section)
    cfg = build_dataclass(PromptEvalConfig, raw, "", all_keys(PromptEvalConfig))
    method = str(section.pop("method", EvalSection.method))
    options_cls = EVALS.get(method).Options
    keys = [f"eval.{k}" for k in all_keys(options_cls)] + ["eval.method"]
    cfg.eval = EvalSection(method, build_dataclass(options_cls, section, "eval.", keys))
    cfg.name = cfg.name or path.stem
    return cfg


def run_prompt_eval(cfg: PromptEvalConfig, model, tokenizer, source: str | Path | None = None) -> dict[str, float]:
    """Load the recipe's data and run its method with `model` on `cfg.split`. A method with a `scorer` builds what
    it scores with itself (minimal pairs score encoders too; `source`, the run the model came from, holds an ELECTRA
    run's generator); the others get the decoder LM."""
    from lmforge.tasks.data import load_splits

    _methods_registered()
    splits = load_splits(cfg.data, require_train=False)
    if cfg.split not in splits:
        raise LMForgeError(f"split '{cfg.split}' not found (have: {', '.join(splits)})")
    method = EVALS.get(cfg.eval.method)(cfg.eval.options)
    make = getattr(method, "scorer", None)
    lm = make(model, tokenizer, cfg.batch_size, source) if make else LM(model, tokenizer, batch_size=cfg.batch_size)
    return method.run(lm, splits, cfg.split)


def prompt_config_dict(cfg: PromptEvalConfig) -> dict:
    d = dataclasses.asdict(cfg)
    d["eval"] = {"method": cfg.eval.method, **(d["eval"].pop("options") or {})}
    return d
