"""The numbers a fine-tune of a single-text classification set has to beat: the majority class of the training
split, and tf-idf (sublinear tf) with logistic regression, its word n-gram range and C chosen by dev accuracy and
reported on test. `scripts/baselines.py` prints them for any labelled set; experiment reports add them as rows
beside every fine-tuned classification task (experiments/results.py). Several sets are fitted in parallel processes,
one per (set, n-gram range), unless they are small enough that this process fits them sooner (SMALL_TRAIN)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from lmforge.extras import require

NGRAMS = ((1, 1), (1, 2), (1, 3))
CS = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
SMALL_TRAIN = 2000
"""Training examples, over all sets, up to which `many_baselines` fits in this process by default: a spawned worker
first imports scikit-learn (~1.5 s), and on 2 CPU cores four sets of 64 training examples fit here in 0.6 s against
2.1 s on two workers, four of 512 in 1.5 s against 2.5 s, four of 1,000 in 2.2 s against 2.8 s."""

Split = tuple[Sequence[str], Sequence[str]]
"""(texts, labels) of one split."""

_FITTED: dict[str, dict] = {}
"""many_baselines' result for each set fitted in this process, by the set's content, probabilities included: an
experiment's report and its ensembles that stack tf-idf (experiments/ensembles.py) fit each set once."""


def majority(train: Split, evals: dict[str, Split]) -> dict:
    """Accuracy on each eval split of always answering the training split's most frequent label."""
    top = Counter(train[1]).most_common(1)[0][0]
    return {"label": top, **{k: sum(y == top for y in s[1]) / max(1, len(s[1])) for k, s in evals.items()}}


def _fits(train: Split, dev: Split, test: Split | None, ngrams: tuple[int, int]) -> list[dict]:
    """tf-idf of one n-gram range with logistic regression at every C: dev (and test) accuracy, the classifier's
    labels and each split's probability of each of them, in CS order."""
    text = require("sklearn.feature_extraction.text", "the tf-idf baseline")
    linear = require("sklearn.linear_model", "the tf-idf baseline")
    from threadpoolctl import threadpool_limits  # scikit-learn's own dependency

    vec = text.TfidfVectorizer(ngram_range=ngrams, sublinear_tf=True)
    x_train, x_dev = vec.fit_transform(train[0]), vec.transform(dev[0])
    x_test = vec.transform(test[0]) if test is not None else None
    out = []
    with threadpool_limits(1):  # BLAS threads slow these small solves down (33 s against 44 s on spam)
        for c in CS:
            clf = linear.LogisticRegression(C=c, max_iter=3000).fit(x_train, train[1])
            fit = {"dev": clf.score(x_dev, dev[1]), "ngrams": list(ngrams), "C": c}
            if test is not None:
                fit["test"] = clf.score(x_test, test[1])
            fit["labels"] = [str(c) for c in clf.classes_]
            splits = {"dev": x_dev} | ({"test": x_test} if test is not None else {})
            fit["probs"] = {k: clf.predict_proba(x).round(6).tolist() for k, x in splits.items()}
            out.append(fit)
    return out


def _best(fits: list[dict]) -> dict:
    """The first fit with the highest dev accuracy (NGRAMS, then CS order)."""
    return max(fits, key=lambda f: f["dev"])  # max keeps the first of equals


def classification_baselines(splits: dict[str, Split]) -> dict:
    """{"majority": …, "tfidf_lr": …} of train/dev(/test) splits of single-text class labels."""
    return many_baselines({"": splits}, workers=1)[""]


def many_baselines(
    sets: dict[str, dict[str, Split]], workers: int | None = None, probs: bool = False
) -> dict[str, dict]:
    """classification_baselines of several sets, each (set, n-gram range) fitted in its own process (`workers`, by
    default one per CPU, or none besides this one for sets of SMALL_TRAIN training examples in all); the same results
    as one set at a time. With `probs`, tfidf_lr also holds its labels and its probabilities on dev (and test)."""
    require("sklearn.linear_model", "the tf-idf baseline")
    keys = {name: hashlib.sha256(json.dumps(s, sort_keys=True).encode()).hexdigest() for name, s in sets.items()}
    todo = {name: splits for name, splits in sets.items() if keys[name] not in _FITTED}
    jobs = [(name, ngrams) for name in todo for ngrams in NGRAMS]
    if workers is None and sum(len(s["train"][0]) for s in todo.values()) <= SMALL_TRAIN:
        workers = 1
    workers = min(len(jobs), workers or os.cpu_count() or 1)
    args = [(todo[n]["train"], todo[n]["dev"], todo[n].get("test"), ngrams) for n, ngrams in jobs]
    if workers <= 1:
        fits = [_fits(*a) for a in args]
    else:  # spawned, not forked: the caller may hold threads (the experiment runner)
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            fits = list(pool.map(_fits, *zip(*args, strict=True)))
    for name, splits in todo.items():
        evals = {k: splits[k] for k in ("dev", "test") if k in splits}
        mine = [f for (n, _), got in zip(jobs, fits, strict=True) if n == name for f in got]
        _FITTED[keys[name]] = {"majority": majority(splits["train"], evals), "tfidf_lr": _best(mine)}
    out = {}
    for name in sets:
        got = _FITTED[keys[name]]
        tfidf = got["tfidf_lr"] if probs else {k: v for k, v in got["tfidf_lr"].items() if k not in ("labels", "probs")}
        out[name] = {"majority": dict(got["majority"]), "tfidf_lr": dict(tfidf)}
    return out
