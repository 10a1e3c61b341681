"""The numbers a fine-tune of a single-text classification set has to beat: the majority class of the training
split, and tf-idf (sublinear tf) with logistic regression, its word n-gram range and C chosen by dev accuracy and
reported on test. `scripts/baselines.py` prints them for any labelled set; experiment reports add them as rows
beside every fine-tuned classification task (experiments/results.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from lmforge.extras import require

NGRAMS = ((1, 1), (1, 2), (1, 3))
CS = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)

Split = tuple[Sequence[str], Sequence[str]]
"""(texts, labels) of one split."""


def majority(train: Split, evals: dict[str, Split]) -> dict:
    """Accuracy on each eval split of always answering the training split's most frequent label."""
    top = Counter(train[1]).most_common(1)[0][0]
    return {"label": top, **{k: sum(y == top for y in s[1]) / max(1, len(s[1])) for k, s in evals.items()}}


def tfidf_lr(train: Split, dev: Split, test: Split | None = None) -> dict:
    """tf-idf + logistic regression: the (n-gram range, C) of the best dev accuracy, its dev and test accuracy."""
    text = require("sklearn.feature_extraction.text", "the tf-idf baseline")
    linear = require("sklearn.linear_model", "the tf-idf baseline")
    best: dict = {"dev": -1.0}
    for ngrams in NGRAMS:
        vec = text.TfidfVectorizer(ngram_range=ngrams, sublinear_tf=True)
        x_train, x_dev = vec.fit_transform(train[0]), vec.transform(dev[0])
        for c in CS:
            clf = linear.LogisticRegression(C=c, max_iter=3000).fit(x_train, train[1])
            dev_acc = clf.score(x_dev, dev[1])
            if dev_acc > best["dev"]:
                best = {"dev": dev_acc, "ngrams": list(ngrams), "C": c}
                if test is not None:
                    best["test"] = clf.score(vec.transform(test[0]), test[1])
    return best


def classification_baselines(splits: dict[str, Split]) -> dict:
    """{"majority": …, "tfidf_lr": …} of train/dev(/test) splits of single-text class labels."""
    train, dev, test = splits["train"], splits["dev"], splits.get("test")
    evals = {"dev": dev, **({"test": test} if test is not None else {})}
    return {"majority": majority(train, evals), "tfidf_lr": tfidf_lr(train, dev, test)}
