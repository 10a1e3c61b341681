"""Token tagging (CoNLL-2003 NER with BIO tags; BERT §5.3): a label per word, predicted on its first sub-token
(the other sub-tokens are ignored by the loss, label -100). Metrics: entity-level precision/recall/F1 as conlleval
counts them (an entity is right when its type and both boundaries are) and word accuracy.
`Example.tokens` are the words, `tags` their tags."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from lmforge.adapt.adamix import symmetric_kl
from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput
from lmforge.registry import TASKS
from lmforge.tasks.base import Task
from lmforge.tasks.heads import TokenHead
from lmforge.tasks.model import TaskModel, TaskOutput


def first_subtokens(words: list[str], offsets: list[tuple[int, int]]) -> list[int]:
    """For the text " ".join(words) tokenized with these character offsets: the index of each word's first token
    (-1 for a word no token ends in). A token belongs to the word holding its last character, so byte-level BPE
    tokens that carry the preceding space ("Ġword") still count for their word."""
    owner: list[int] = []
    for w, word in enumerate(words):
        owner += [w] * len(word) + [-1]  # the space after each word belongs to none
    first = [-1] * len(words)
    for t, (s, e) in enumerate(offsets):
        if e <= s or e - 1 >= len(owner):
            continue
        w = owner[e - 1]
        if w >= 0 and first[w] < 0:
            first[w] = t
    return first


_ENTITY_AFTER = {
    "B": lambda cur, typ, i: (typ, i),
    "I": lambda cur, typ, i: cur if cur is not None and cur[0] == typ else (typ, i),
    "O": lambda cur, typ, i: None,
}
"""BIO tag prefix → the entity in progress, (type, first word) or None, after the tag at word i, given `cur`, the
one before it: B- starts one, I- continues one of its type (else starts one, as conlleval counts it), O ends it.
A tag of another prefix leaves `cur` as it is."""


def bio_entities(tags: list[str]) -> set[tuple[str, int, int]]:
    """(type, first word, last word) of each entity in a BIO (or IOB1) sequence; I- after O or another type
    starts an entity, as conlleval counts it."""
    out, cur = set(), None
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, typ = tag.partition("-")
        step = _ENTITY_AFTER.get(prefix)
        after = cur if step is None else step(cur, typ, i)
        if cur is not None and after != cur:
            out.add((cur[0], cur[1], i - 1))
        cur = after
    return out


def entity_scores(preds: list[list[str]], golds: list[list[str]]) -> dict[str, float]:
    """Entity-level precision, recall, F1 (micro over all sentences) and word accuracy."""
    tp = n_pred = n_gold = right = words = 0
    for i, (p, g) in enumerate(zip(preds, golds)):
        pe, ge = {(i, *x) for x in bio_entities(p)}, {(i, *x) for x in bio_entities(g)}
        tp, n_pred, n_gold = tp + len(pe & ge), n_pred + len(pe), n_gold + len(ge)
        right += sum(a == b for a, b in zip(p, g))
        words += len(g)
    prec = tp / n_pred if n_pred else 0.0
    rec = tp / n_gold if n_gold else 0.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    return {"entity_f1": f1, "precision": prec, "recall": rec, "accuracy": right / max(words, 1)}


@TASKS.register("token_tagging")
class TokenTagging(Task):
    name = "token_tagging"
    needs_labels = True
    default_metrics = ("entity_f1", "precision", "recall", "accuracy")

    @classmethod
    def label_set(cls, train: Dataset) -> list[str]:
        if train.labels:
            return [str(x) for x in train.labels]
        found = {t for e in train.examples for t in e.tags or []}
        if not found:
            raise LMForgeError(f"{train.source or 'training data'}: no tagged examples")
        return sorted(found)

    def make_head(self, cfg) -> TokenHead:
        return TokenHead(cfg.d_model, len(self.labels), self.options.head_dropout)

    def _feature(self, i: int, ex: Example, where: str) -> dict:
        words = ex.tokens or []
        enc = self.tokenizer.backend.encode(" ".join(words), add_special_tokens=False)
        budget = self.max_len - self.framer.n_special(pair=False)
        self.n_truncated += self.check_length(len(enc.ids), budget, f"{where} example {ex.id or i}")
        ids = enc.ids[:budget]
        first = [t if t < len(ids) else -1 for t in first_subtokens(words, enc.offsets)]
        input_ids, types = self.framer.frame(ids)
        shift = len(self.framer.start)
        labels = [-100] * len(input_ids)
        if ex.tags is not None:
            if len(ex.tags) != len(words):
                raise LMForgeError(f"{where} example {ex.id or i}: {len(words)} words but {len(ex.tags)} tags")
            for t, tag in zip(first, ex.tags):
                if t >= 0:
                    labels[shift + t] = self.label_index(tag, f"{where} example {ex.id or i}")
        return {"input_ids": input_ids, "token_type_ids": types, "labels": labels,
                "_first": [t + shift if t >= 0 else -1 for t in first]}  # fmt: skip

    def features(self, dataset: Dataset, train: bool = False) -> list[dict]:
        return [self._feature(i, ex, dataset.source or "data") for i, ex in enumerate(dataset.examples)]

    def scored(self, model: TaskModel, batch: dict[str, Tensor]) -> tuple[LossOutput, TaskOutput]:
        out = model(batch)
        loss = F.cross_entropy(out.logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100)
        return self.with_aux(loss, model, out, batch), out

    def divergence(self, a: TaskOutput, b: TaskOutput, batch: dict[str, Tensor]) -> Tensor:
        """Over the tagged tokens (the first sub-token of each word) only."""
        tagged = batch["labels"] != -100
        return symmetric_kl(a.logits[tagged], b.logits[tagged])

    def predict(self, model: TaskModel, batch: dict[str, Tensor], feats: list[dict]) -> list:
        tags = model(batch).logits.argmax(-1).tolist()  # (B, T)
        outside = "O" if "O" in self.labels else self.labels[0]  # words cut off by max_len
        return [[self.labels[row[t]] if t >= 0 else outside for t in f["_first"]] for row, f in zip(tags, feats)]

    def gold(self, dataset: Dataset) -> list[list[str]]:
        return [list(ex.tags or []) for ex in dataset.examples]

    def evaluate(self, model: TaskModel, dataset: Dataset, batch_size: int = 64) -> dict[str, float]:
        scores = entity_scores(self.predict_all(model, dataset, batch_size), self.gold(dataset))
        unknown = [k for k in self.metric_names if k not in scores]
        if unknown:
            raise LMForgeError(f"task.metrics: token tagging reports {', '.join(scores)}, not '{unknown[0]}'")
        return {k: scores[k] for k in self.metric_names}
