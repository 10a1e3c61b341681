"""tf-idf + logistic regression on the splits an experiment's fine-tune read: the report's baseline rows
(experiments/results.py) and the ensembles that stack it (experiments/ensembles.py) fit it through here, once per
set and process (eval/baselines.py keeps the fits). The runner starts the fits while its runs train
(`fit_in_background`), so that the report finds them done."""

from __future__ import annotations

import threading
from pathlib import Path

from lmforge.errors import LMForgeError


def single_text_classes(run_dir: Path) -> dict | None:
    """The splits a classification fine-tune read, as (texts, labels); None for other tasks or text pairs."""
    from lmforge.tasks.config import load_finetune_config

    return _classes(load_finetune_config(run_dir / "config.yaml"))


def _classes(cfg) -> dict | None:
    """single_text_classes of a fine-tuning config."""
    from lmforge.tasks.data import load_splits

    if cfg.task.type not in ("classification", "text_to_text"):  # the tasks that choose one label per text
        return None
    splits = load_splits(cfg.data)
    examples = [e for ds in splits.values() for e in ds.examples]
    if "dev" not in splits or any(e.text_pair is not None or not isinstance(e.label, str) for e in examples):
        return None
    return {k: ([e.text for e in ds.examples], [e.label for e in ds.examples]) for k, ds in splits.items()}


def fit_in_background(arms: list) -> threading.Thread | None:
    """Start fitting tf-idf + LR on the splits of every task that `arms` fine-tune (the first arm of each task, its
    config as its command will resolve it), in a thread of this process, while the runs train: the report's baseline
    rows and the stacks then find them fitted. Join the thread before the report. A task it cannot fit, or a failure
    (a missing set), is left to the report, which says why. None when no arm fine-tunes or scikit-learn is absent."""
    from lmforge import extras
    from lmforge.experiments.arms import of_stage

    firsts: dict[str, object] = {}
    for arm in of_stage(arms, "finetune", arm=lambda a: a):
        firsts.setdefault(arm.info.get("task"), arm)
    if not firsts or not extras.available("sklearn"):
        return None
    thread = threading.Thread(target=_fit_quietly, args=(list(firsts.items()),), name="tfidf-fits", daemon=True)
    thread.start()
    return thread


def _fit_quietly(firsts: list) -> None:
    from lmforge.eval.baselines import many_baselines
    from lmforge.experiments.arms import cli_args
    from lmforge.tasks.config import load_finetune_config

    try:
        sets = {}
        for task, arm in firsts:
            splits = _classes(load_finetune_config(arm.recipe, cli_args(arm.overrides)))
            if splits is not None:
                sets[task] = splits
        many_baselines(sets)
    except Exception:  # noqa: BLE001 - the report fits again and reports the error in its own words
        pass


def tfidf_predictions(run_dir: Path) -> dict:
    """The predictions of tf-idf + logistic regression (eval/baselines.py; n-gram range and C chosen on dev) on the
    splits the fine-tune in `run_dir` read, in its predictions.json's form: labels, and per split the gold label
    indices and each example's probabilities, in the splits' order."""
    from lmforge import extras
    from lmforge.eval.baselines import many_baselines

    extras.check("a tf-idf ensemble", "sklearn")
    splits = single_text_classes(run_dir)
    if splits is None:
        raise LMForgeError(f"{run_dir}: a tf-idf ensemble needs a classification task of single texts")
    fit = many_baselines({"": splits}, probs=True)[""]["tfidf_lr"]
    labels = fit["labels"]
    out: dict = {"labels": labels}
    for split, probs in fit["probs"].items():
        if any(y not in labels for y in splits[split][1]):
            raise LMForgeError(f"{run_dir}: {split} has a label that its training split lacks")
        out[split] = {"gold": [labels.index(y) for y in splits[split][1]], "probs": probs}
    return out
