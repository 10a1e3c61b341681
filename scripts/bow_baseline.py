"""The bag-of-words number to beat on a single-text classification set: tf-idf unigrams (+ bigrams) and logistic
regression, the n-gram range and C chosen on dev, test accuracy of that choice; with --sizes, on the first N training
examples (as `--data.max_train=N` takes them).

    python scripts/bow_baseline.py                      # the bundled sentiment set, all training examples
    python scripts/bow_baseline.py --sizes 500 1000 2000 0 --dir DIR   # 0 = all; DIR: a labelled-set directory
"""

from __future__ import annotations

import argparse

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from lmforge.tasks.readers import load_bundled, load_labelled_dir


def best_on_dev(train, dev, test) -> tuple[float, float, str]:
    """(dev accuracy, test accuracy, setting) of the setting with the best dev accuracy."""
    best = (-1.0, 0.0, "")
    for ngrams in ((1, 1), (1, 2)):
        for c in (1.0, 3.0, 10.0, 30.0, 100.0, 300.0):
            vec = TfidfVectorizer(ngram_range=ngrams, sublinear_tf=True)
            clf = LogisticRegression(C=c, max_iter=2000).fit(vec.fit_transform(train[0]), train[1])
            dev_acc = clf.score(vec.transform(dev[0]), dev[1])
            if dev_acc > best[0]:
                best = (dev_acc, clf.score(vec.transform(test[0]), test[1]), f"ngrams {ngrams}, C {c}")
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="labelled-set directory (default: the bundled sentiment set)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[0], help="training examples (0 = all)")
    args = ap.parse_args()
    splits = load_labelled_dir(args.dir) if args.dir else load_bundled("sentiment")
    xy = {k: ([e.text for e in ds.examples], [e.label for e in ds.examples]) for k, ds in splits.items()}
    for n in args.sizes:
        train = (xy["train"][0][: n or None], xy["train"][1][: n or None])
        dev_acc, test_acc, setting = best_on_dev(train, xy["dev"], xy["test"])
        print(f"train {len(train[0])}: dev {100 * dev_acc:.1f}, test {100 * test_acc:.1f} ({setting})")


if __name__ == "__main__":
    main()
