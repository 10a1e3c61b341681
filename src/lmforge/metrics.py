"""Evaluation metrics for fine-tuned models: classification, regression, span QA, generation, language modelling.

Every score is a fraction: accuracy, F1, exact match and ROUGE in [0, 1], correlations in [-1, 1], BLEU in
[0, 1] (sacreBLEU's 27.3 is 0.273 here); reports multiply by 100. Perplexity is exp(mean NLL).
The heavy lifting is done by the reference implementations: scikit-learn (F1, MCC), scipy (Pearson,
Spearman), `rouge-score` (ROUGE, Lin 2004, as Google's reference) and `sacrebleu` (BLEU, Papineni et al. 2002,
with sacreBLEU's standard 13a tokenisation), each imported where it is used: they are lmforge's `eval` extra, and
accuracy, SQuAD and perplexity need none of them. SQuAD EM/F1 follow the official v1.1/v2.0 evaluation script.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Literal

from lmforge.errors import LMForgeError
from lmforge.extras import require


def _check(name: str, preds: Sequence, refs: Sequence) -> None:
    if len(preds) != len(refs):
        raise LMForgeError(f"{name}: {len(preds)} predictions for {len(refs)} references")
    if len(preds) == 0:
        raise LMForgeError(f"{name}: no predictions to score")


# ---------------------------------------------------------------- classification / regression


def accuracy(preds: Sequence[Hashable], refs: Sequence[Hashable]) -> float:
    """Fraction of predictions equal to the reference."""
    _check("accuracy", preds, refs)
    return sum(p == r for p, r in zip(preds, refs)) / len(refs)


def f1(
    preds: Sequence[Hashable],
    refs: Sequence[Hashable],
    average: Literal["binary", "macro"] = "binary",
    pos_label: Hashable = 1,
    labels: Sequence[Hashable] | None = None,
) -> float:
    """F1: of the class `pos_label` ("binary"), or the unweighted mean over classes ("macro"; over `labels`
    when given, else over the classes that occur). A class never predicted nor present scores 0."""
    f1_score = require("sklearn.metrics", "F1").f1_score

    _check("f1", preds, refs)
    if average == "binary":
        classes = set(preds) | set(refs)
        if len(classes - {pos_label}) > 1:
            if pos_label not in classes:
                raise LMForgeError(f"f1: the positive label {pos_label!r} is not among the labels {sorted(classes)}")
            raise LMForgeError(f"f1: binary F1 needs two classes, found {len(classes)} (use average='macro')")
        # Score pos_label against "anything else": correct whatever the other class is called.
        y_true = [r == pos_label for r in refs]
        y_pred = [p == pos_label for p in preds]
        return float(f1_score(y_true, y_pred, average="binary", pos_label=True, zero_division=0.0))
    kwargs = {"labels": list(labels)} if labels is not None else {}
    return float(f1_score(list(refs), list(preds), average="macro", zero_division=0.0, **kwargs))


def macro_f1(preds: Sequence[Hashable], refs: Sequence[Hashable]) -> float:
    """Unweighted mean of the per-class F1 over the classes that occur."""
    return f1(preds, refs, average="macro")


def matthews(preds: Sequence[Hashable], refs: Sequence[Hashable]) -> float:
    """Matthews correlation coefficient (CoLA's metric); 0 when a side is constant."""
    matthews_corrcoef = require("sklearn.metrics", "MCC").matthews_corrcoef

    _check("matthews", preds, refs)
    return float(matthews_corrcoef(list(refs), list(preds)))


def _constant(xs: Sequence[float]) -> bool:
    return min(xs) == max(xs)


def pearson(preds: Sequence[float], refs: Sequence[float]) -> float:
    """Pearson correlation; 0 when a side is constant (no linear association is measurable)."""
    pearsonr = require("scipy.stats", "Pearson correlation").pearsonr

    _check("pearson", preds, refs)
    if len(preds) < 2 or _constant(preds) or _constant(refs):
        return 0.0
    return float(pearsonr(list(map(float, preds)), list(map(float, refs)))[0])


def spearman(preds: Sequence[float], refs: Sequence[float]) -> float:
    """Spearman rank correlation (ties get average ranks); 0 when a side is constant."""
    spearmanr = require("scipy.stats", "Spearman correlation").spearmanr

    _check("spearman", preds, refs)
    if len(preds) < 2 or _constant(preds) or _constant(refs):
        return 0.0
    return float(spearmanr(list(map(float, preds)), list(map(float, refs)))[0])


# ---------------------------------------------------------------- SQuAD (official evaluation script)

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation, drop articles (a/an/the), collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _golds(golds: Sequence[str]) -> list[str]:
    # SQuAD 2.0: an unanswerable question's only gold answer is the empty string.
    return [g for g in golds if normalize_answer(g)] or [""]


def squad_exact(pred: str, golds: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals a normalised gold answer (max over golds), else 0.0."""
    return float(max(normalize_answer(pred) == normalize_answer(g) for g in _golds(golds)))


def _token_f1(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    if not p or not g:  # unanswerable: right only if both are empty
        return float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def squad_f1(pred: str, golds: Sequence[str]) -> float:
    """Bag-of-tokens F1 of the normalised prediction against the best-matching gold answer."""
    return max(_token_f1(pred, g) for g in _golds(golds))


def squad_scores(preds: Sequence[str], golds: Sequence[Sequence[str]]) -> dict[str, float]:
    """Mean exact match and F1 over questions: {"exact_match", "f1"} (fractions; the script prints ×100)."""
    _check("squad", preds, golds)
    em = sum(squad_exact(p, g) for p, g in zip(preds, golds)) / len(preds)
    f = sum(squad_f1(p, g) for p, g in zip(preds, golds)) / len(preds)
    return {"exact_match": em, "f1": f}


# ---------------------------------------------------------------- generation


def _ref_lists(name: str, refs: Sequence[str] | Sequence[Sequence[str]]) -> list[list[str]]:
    out = [[r] if isinstance(r, str) else list(r) for r in refs]
    if any(not r for r in out):
        raise LMForgeError(f"{name}: every prediction needs at least one reference")
    return out


def rouge(
    preds: Sequence[str],
    refs: Sequence[str] | Sequence[Sequence[str]],
    types: Sequence[str] = ("rouge1", "rouge2", "rougeL"),
    use_stemmer: bool = True,
) -> dict[str, float]:
    """Mean ROUGE F-measure per type (rouge1, rouge2, rougeL, rougeLsum); with several references per
    prediction the best-scoring one counts. Porter stemming on by default, as in most summarisation papers."""
    rouge_scorer = require("rouge_score.rouge_scorer", "ROUGE")

    _check("rouge", preds, refs)
    scorer = rouge_scorer.RougeScorer(list(types), use_stemmer=use_stemmer)
    totals = dict.fromkeys(types, 0.0)
    for pred, golds in zip(preds, _ref_lists("rouge", refs)):
        scores = scorer.score_multi(golds, pred)
        for t in types:
            totals[t] += scores[t].fmeasure
    return {t: v / len(preds) for t, v in totals.items()}


def bleu(preds: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]], tokenize: str = "13a") -> float:
    """Corpus BLEU (sacreBLEU, 4-grams, brevity penalty) as a fraction. Every prediction needs the same number of
    references."""
    sacrebleu = require("sacrebleu", "BLEU")

    _check("bleu", preds, refs)
    ref_lists = _ref_lists("bleu", refs)
    n_refs = {len(r) for r in ref_lists}
    if len(n_refs) != 1:
        raise LMForgeError("bleu: every prediction needs the same number of references")
    streams = [[r[i] for r in ref_lists] for i in range(n_refs.pop())]  # sacreBLEU wants one stream per ref
    return float(sacrebleu.corpus_bleu(list(preds), streams, tokenize=tokenize).score) / 100.0


# ---------------------------------------------------------------- language modelling


def perplexity(total_nll: float, n_tokens: int) -> float:
    """exp(total negative log-likelihood in nats / number of predicted tokens)."""
    if n_tokens <= 0:
        raise LMForgeError(f"perplexity: needs at least one token, got {n_tokens}")
    mean = total_nll / n_tokens
    return math.exp(mean) if mean < 700 else math.inf  # exp overflows float64 past ~709


METRICS: dict[str, Callable[[Sequence, Sequence], float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "macro_f1": macro_f1,
    "mcc": matthews,
    "pearson": pearson,
    "spearman": spearman,
}
"""Name → metric over parallel (predictions, references) lists, for the metrics that return one number."""
