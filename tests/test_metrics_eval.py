"""Evaluation metrics against scikit-learn/scipy and hand-computed cases."""

from __future__ import annotations

import math
import random

import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

from lmforge.errors import LMForgeError
from lmforge.metrics import (
    METRICS,
    accuracy,
    bleu,
    f1,
    macro_f1,
    matthews,
    normalize_answer,
    pearson,
    perplexity,
    rouge,
    spearman,
    squad_exact,
    squad_f1,
    squad_scores,
)


def _random_labels(n: int, k: int, seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    refs = [rng.randrange(k) for _ in range(n)]
    preds = [r if rng.random() < 0.6 else rng.randrange(k) for r in refs]
    return preds, refs


def test_classification_metrics_match_sklearn() -> None:
    preds, refs = _random_labels(200, 2, 0)
    assert accuracy(preds, refs) == sum(p == r for p, r in zip(preds, refs)) / 200
    assert f1(preds, refs) == pytest.approx(f1_score(refs, preds))
    assert f1(preds, refs, pos_label=0) == pytest.approx(f1_score(refs, preds, pos_label=0))
    assert matthews(preds, refs) == pytest.approx(matthews_corrcoef(refs, preds))
    preds3, refs3 = _random_labels(300, 3, 1)
    assert macro_f1(preds3, refs3) == pytest.approx(f1_score(refs3, preds3, average="macro"))
    assert matthews(preds3, refs3) == pytest.approx(matthews_corrcoef(refs3, preds3))
    assert METRICS["mcc"] is matthews and METRICS["accuracy"] is accuracy


def test_classification_hand_cases() -> None:
    refs = ["pos", "pos", "pos", "neg", "neg"]
    preds = ["pos", "pos", "neg", "pos", "neg"]
    # tp 2, fp 1, fn 1 → P = R = 2/3 → F1 2/3; accuracy 3/5.
    assert f1(preds, refs, pos_label="pos") == pytest.approx(2 / 3)
    assert accuracy(preds, refs) == 0.6
    # MCC = (tp·tn − fp·fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = (2·1 − 1·1) / sqrt(3·3·2·2) = 1/6
    assert matthews(preds, refs) == pytest.approx(1 / 6)
    assert matthews(["a"] * 4, ["a", "b", "a", "b"]) == 0.0  # constant predictions
    assert f1(["neg"] * 3, ["neg"] * 3, pos_label="pos") == 0.0  # no positives anywhere
    # Macro over a given label set: the never-seen class "x" counts as 0.
    assert f1(["a", "b"], ["a", "b"], average="macro", labels=["a", "b", "x"]) == pytest.approx(2 / 3)
    with pytest.raises(LMForgeError, match=r"^f1: binary F1 needs two classes, found 3 \(use average='macro'\)$"):
        f1([0, 1, 2], [0, 1, 2])
    with pytest.raises(LMForgeError, match=r"^f1: the positive label 1 is not among the labels \['neg', 'pos'\]$"):
        f1(["pos", "neg"], ["pos", "pos"])
    with pytest.raises(LMForgeError, match="^accuracy: 2 predictions for 3 references$"):
        accuracy([1, 2], [1, 2, 3])
    with pytest.raises(LMForgeError, match="^matthews: no predictions to score$"):
        matthews([], [])


def test_correlations_match_scipy() -> None:
    rng = random.Random(2)
    refs = [rng.uniform(0, 5) for _ in range(100)]
    preds = [r + rng.gauss(0, 1) for r in refs]
    assert pearson(preds, refs) == pytest.approx(pearsonr(preds, refs)[0])
    assert spearman(preds, refs) == pytest.approx(spearmanr(preds, refs)[0])
    # Hand case: ranks [1, 2, 3, 4] vs [1, 3, 2, 4] → 1 − 6·Σd²/(n(n²−1)) = 1 − 6·2/60 = 0.8
    assert spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0  # constant side: defined as 0, not NaN


def test_squad_normalisation_and_scores() -> None:
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("an apple, a pear and THE plum") == "apple pear and plum"
    assert squad_exact("the Eiffel Tower.", ["Eiffel Tower", "Paris"]) == 1.0
    assert squad_exact("Tower", ["Eiffel Tower"]) == 0.0
    # pred tokens [eiffel, tower, paris], gold [eiffel, tower]: P 2/3, R 1 → F1 0.8
    assert squad_f1("Eiffel Tower Paris", ["the Eiffel Tower"]) == pytest.approx(0.8)
    assert squad_f1("Paris", ["Eiffel Tower", "in Paris"]) == pytest.approx(2 / 3)  # best gold counts
    # SQuAD 2.0: no gold answer → only the empty prediction is right.
    assert squad_exact("", []) == 1.0 and squad_f1("", []) == 1.0
    assert squad_exact("something", []) == 0.0 and squad_f1("something", []) == 0.0
    assert squad_f1("", ["Paris"]) == 0.0
    scores = squad_scores(["Eiffel Tower", "Rome", ""], [["the Eiffel Tower"], ["Paris"], []])
    assert scores == pytest.approx({"exact_match": 2 / 3, "f1": 2 / 3})


def test_rouge_hand_case() -> None:
    pred, ref = "the cat sat on the mat", "the cat is on the mat"
    scores = rouge([pred], [ref])
    # unigrams: 5 of 6 match both ways → F 5/6; bigrams: 3 of 5 → 0.6; LCS "the cat on the mat" = 5 → 5/6.
    assert scores == pytest.approx({"rouge1": 5 / 6, "rouge2": 0.6, "rougeL": 5 / 6})
    multi = rouge([pred, "dogs bark"], [[ref, pred], "a dog barks"], types=("rouge1",))
    # First: the identical second reference wins (1.0). Second: stemming makes dogs=dog, bark=barks → P 1, R 2/3.
    assert multi["rouge1"] == pytest.approx((1.0 + 0.8) / 2)
    assert rouge(["dogs bark"], ["a dog barks"], types=("rouge1",), use_stemmer=False)["rouge1"] == 0.0


def test_bleu_hand_cases() -> None:
    ref = "the cat sat on the mat"
    assert bleu([ref], [ref]) == pytest.approx(1.0)
    # One extra word: p1..p4 = 6/7, 5/6, 4/5, 3/4, no brevity penalty → (3/7)^(1/4).
    assert bleu([ref + " today"], [ref]) == pytest.approx((3 / 7) ** 0.25, abs=1e-6)
    # Too short: all precisions 1, BP = exp(1 − 6/4).
    assert bleu(["the cat sat on"], [ref]) == pytest.approx(math.exp(-0.5), abs=1e-6)
    # Two references each: the closest reference length (6) sets the brevity penalty.
    assert bleu(["the cat sat on"], [[ref, "a cat sat on a mat today"]]) == pytest.approx(math.exp(-0.5), abs=1e-6)
    with pytest.raises(LMForgeError, match="^bleu: every prediction needs the same number of references$"):
        bleu(["a", "b"], [["a"], ["b", "c"]])


def test_perplexity() -> None:
    assert perplexity(10 * math.log(4), 10) == pytest.approx(4.0)
    assert perplexity(1e6, 1) == math.inf
    with pytest.raises(LMForgeError, match="^perplexity: needs at least one token, got 0$"):
        perplexity(1.0, 0)


def test_a_metric_whose_package_is_missing_stops_the_task_before_training(monkeypatch):
    import importlib.util

    import tasks_testing as T

    import lmforge.tasks  # noqa: F401  (registers the task types)
    from lmforge.registry import TASKS

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rouge_score" else real(name, *a))
    cls = TASKS.get("seq2seq")
    with pytest.raises(LMForgeError) as e:
        cls(cls.Options(metrics=["rouge1", "rougeL"]), T.tokenizer("t5"))
    assert str(e.value) == (
        "metric 'rouge1' needs rouge-score, which is not installed (lmforge's `eval` extra): "
        "pip install 'rouge-score>=0.1.2'"
    )
    cls(cls.Options(metrics=["bleu"]), T.tokenizer("t5"))  # sacrebleu is there
