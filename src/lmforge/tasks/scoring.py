"""Metric names used in recipes (`task.metrics`, `eval.metrics`) → the functions of `lmforge.metrics`.

Classification predictions and references are label indices; binary F1 scores label index 1 as the positive class
(the second label: "positive" in SST-2 and the sentiment set, "equivalent" in MRPC, "duplicate" in QQP)."""

from __future__ import annotations

from lmforge import extras
from lmforge.errors import LMForgeError

SINGLE = ("accuracy", "f1", "macro_f1", "mcc", "pearson", "spearman")
ROUGE = ("rouge1", "rouge2", "rougeL")
NAMES = (*SINGLE, *ROUGE, "bleu")
MODULES = {
    **dict.fromkeys(("f1", "macro_f1", "mcc"), "sklearn"),
    **dict.fromkeys(("pearson", "spearman"), "scipy"),
    **dict.fromkeys(ROUGE, "rouge_score"),
    "bleu": "sacrebleu",
}
"""Metric → the module that computes it, for the metrics computed by a library (lmforge's `eval` extra);
accuracy needs none."""


def require_metric_packages(names: list[str]) -> None:
    """One line naming the missing package when a metric's library is not installed (checked before training)."""
    for name in names:
        if name in MODULES and not extras.available(MODULES[name]):
            raise LMForgeError(extras.hint(MODULES[name], f"metric '{name}'"))


def score(names: list[str], preds: list, golds: list) -> dict[str, float]:
    """{name: value} for each metric name, in the order given."""
    from lmforge import metrics

    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise LMForgeError(f"unknown metric '{unknown[0]}' (known: {', '.join(NAMES)})")
    out: dict[str, float] = {}
    rouge_types = [n for n in names if n in ROUGE]
    if rouge_types:  # one pass scores every ROUGE type
        out.update(metrics.rouge(preds, golds, types=rouge_types))
    for name in names:
        if name in SINGLE:
            out[name] = metrics.METRICS[name](preds, golds)
        elif name == "bleu":
            out[name] = metrics.bleu(preds, golds)
    return {n: float(out[n]) for n in names}
