"""The numbers a fine-tune has to beat on a single-text classification set: the majority class, and tf-idf
n-grams with logistic regression (word 1-, 1-2- and 1-3-grams × C, chosen on dev; test accuracy of that choice).
Sets are named as fine-tuning names them: `sentiment` (bundled), a fetched set (`lmforge data fetch NAME` first:
rotten-tomatoes, hedge, drug-reviews, spam, …), or a labelled-set directory.

    python scripts/baselines.py                                    # the bundled sentiment set
    python scripts/baselines.py rotten-tomatoes hedge drug-reviews spam --json baselines.json
    python scripts/baselines.py sentiment --sizes 500 1000 0       # on the first N training examples (0 = all)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmforge.data.labelled.readers import bundled_names, load_bundled, load_fetched, load_labelled_dir
from lmforge.errors import LMForgeError
from lmforge.eval.baselines import many_baselines


def load_set(name: str) -> dict:
    """Split → (texts, labels) of a bundled set, a fetched set or a labelled-set directory."""
    if Path(name).is_dir():
        splits = load_labelled_dir(name)
    elif name in bundled_names():
        splits = load_bundled(name)
    else:
        splits = load_fetched(name)
    for split, ds in splits.items():
        if any(e.text_pair is not None for e in ds.examples):
            raise LMForgeError(f"{name}: {split} holds text pairs; this baseline is for single-text sets")
    return {k: ([e.text for e in ds.examples], [e.label for e in ds.examples]) for k, ds in splits.items()}


def training_prefix(name: str, size: int = 0) -> dict:
    """The set's splits with its first `size` training examples (0: all)."""
    xy = load_set(name)
    missing = [s for s in ("train", "dev", "test") if s not in xy]
    if missing:
        raise LMForgeError(f"{name}: no {', '.join(missing)} split (the baselines choose on dev and report on test)")
    xy["train"] = (xy["train"][0][: size or None], xy["train"][1][: size or None])
    return xy


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sets", nargs="*", default=["sentiment"], help="set names or labelled-set directories")
    ap.add_argument("--sizes", type=int, nargs="+", default=[0], help="training examples (0 = all)")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    try:
        sets = {(name, n): training_prefix(name, n) for name in args.sets for n in args.sizes}
    except LMForgeError as e:
        raise SystemExit(f"error: {e}") from None
    results = many_baselines({f"{name}/{n}": xy for (name, n), xy in sets.items()})  # every set at once
    rows = []
    for (name, n), xy in sets.items():
        counts = {"train": len(xy["train"][0]), "dev_n": len(xy["dev"][0]), "test_n": len(xy["test"][0])}
        r = {"set": name, **counts, **results[f"{name}/{n}"]}
        rows.append(r)
        m, t = r["majority"], r["tfidf_lr"]
        print(
            f"{name} (train {r['train']}, dev {r['dev_n']}, test {r['test_n']}): majority dev "
            f"{100 * m['dev']:.1f} test {100 * m['test']:.1f}; tf-idf + LR dev {100 * t['dev']:.1f} "
            f"test {100 * t['test']:.1f} (ngrams {tuple(t['ngrams'])}, C {t['C']})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
