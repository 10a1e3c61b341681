"""Extractive span QA (SQuAD; BERT §4.2–4.3): start/end logits over the context tokens.

Input: `[CLS] question [SEP] context window [SEP]` (or the model's format). Contexts longer than max_len are cut into
windows that start every `doc_stride` tokens; a window that does not contain the answer, and every window of a
SQuAD 2.0 unanswerable question, is labelled with position 0 (the [CLS] token). Prediction: the best span
(end ≥ start, at most max_answer_len tokens) over all windows of a question, a span starting only in the window
where its first token has the most context (BERT's `_check_is_max_context`: the window maximising
min(tokens left, tokens right) + 0.01 · window length); with `version_2`, the answer is empty when the null score
s₀ + e₀ beats the best span's score by more than `null_threshold`.
`Example.text` is the question, `context` the passage, `answers` [(char_start, text), ...]."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lmforge.adapt.adamix import symmetric_kl
from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput
from lmforge.registry import TASKS
from lmforge.tasks.base import Task, TaskOptions
from lmforge.tasks.heads import SpanHead
from lmforge.tasks.model import TaskModel, TaskOutput


@dataclass
class SpanQAOptions(TaskOptions):
    max_len: int = 384
    doc_stride: int = 128
    """Tokens between the starts of consecutive context windows."""
    max_query_len: int = 64
    max_answer_len: int = 30
    """Longest predicted answer in tokens."""
    version_2: bool = False
    """SQuAD 2.0: questions may have no answer; predict none when the null score wins."""
    null_threshold: float = 0.0
    """Predict no answer when null score − best span score > this (tuned on dev in BERT §4.3)."""


def char_to_token_span(offsets: list[tuple[int, int]], char_start: int, char_end: int) -> tuple[int, int] | None:
    """Token indices (first, last) covering characters [char_start, char_end) of the text, or None."""
    first = next((i for i, (_, e) in enumerate(offsets) if e > char_start), None)
    last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < char_end), None)
    if first is None or last is None or last < first:
        return None
    return first, last


def windows(n_tokens: int, size: int, stride: int) -> list[tuple[int, int]]:
    """(start, end) token ranges of the context windows: size tokens each, starting every `stride` tokens, the
    last one reaching the end of the context."""
    if size <= 0:
        raise LMForgeError("task.max_len leaves no room for the context after the question")
    out, start = [], 0
    while True:
        end = min(start + size, n_tokens)
        out.append((start, end))
        if end >= n_tokens:
            return out
        start += min(stride, size)


def max_context(spans: list[tuple[int, int]]) -> list[list[bool]]:
    """Per window, per token of it: is this the window where the token has the most context on both sides?
    Score min(left, right) + 0.01 · window length; the first window wins a tie (BERT's run_squad.py)."""
    w0, w1 = (np.array(x)[:, None] for x in zip(*spans))  # (K, 1) window starts and ends
    if w1.max() == 0:  # an empty context
        return [[] for _ in spans]
    p = np.arange(int(w1.max()))[None, :]  # (1, n) token positions
    score = np.minimum(p - w0, w1 - 1 - p) + 0.01 * (w1 - w0)  # (K, n)
    owner = np.where((p >= w0) & (p < w1), score, -np.inf).argmax(0)  # (n,) argmax keeps the first of equals
    return [(owner[a:b] == k).tolist() for k, (a, b) in enumerate(spans)]


def best_spans(
    start: Tensor, end: Tensor, valid: Tensor, max_answer_len: int, start_ok: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Best (score, start, end) per row over spans with both ends in `valid` (B, T), the start also in `start_ok`
    when given, end ≥ start and at most max_answer_len tokens. start/end: (B, T) logits."""
    T = start.shape[1]
    scores = start[:, :, None] + end[:, None, :]  # (B, T, T): s_i + e_j
    i = torch.arange(T, device=start.device)
    band = (i[None, :] >= i[:, None]) & (i[None, :] - i[:, None] < max_answer_len)  # (T, T)
    starts = valid if start_ok is None else valid & start_ok
    ok = band[None] & starts[:, :, None] & valid[:, None, :]
    scores = scores.masked_fill(~ok, float("-inf")).flatten(1)  # (B, T·T)
    best, idx = scores.max(-1)
    return best, idx // T, idx % T


@TASKS.register("span_qa")
class SpanQA(Task):
    name = "span_qa"
    Options = SpanQAOptions
    default_metrics = ("f1", "exact_match")

    def make_head(self, cfg) -> SpanHead:
        return SpanHead(cfg.d_model, self.options.head_dropout)

    def _example_features(self, i: int, ex: Example, q_ids: list[int], train: bool) -> list[dict]:
        if ex.context is None:
            raise LMForgeError(f"span QA example {ex.id or i} has no context")
        enc = self.tokenizer.backend.encode(ex.context, add_special_tokens=False)
        ids, offsets = enc.ids, enc.offsets
        size = self.max_len - len(q_ids) - self.framer.n_special(pair=True)
        answer = None
        if ex.answers:
            char_start, text = ex.answers[0]
            answer = char_to_token_span(offsets, char_start, char_start + len(text))
        ctx_at = len(self.framer.start) + len(q_ids) + len(self.framer.mid)  # where the context starts
        feats = []
        spans = windows(len(ids), size, self.options.doc_stride)
        for (w0, w1), is_max in zip(spans, max_context(spans)):
            input_ids, types = self.framer.frame(q_ids, ids[w0:w1])
            f = {"input_ids": input_ids, "token_type_ids": types, "start_positions": 0, "end_positions": 0}
            if answer is not None and w0 <= answer[0] and answer[1] < w1:
                f["start_positions"], f["end_positions"] = ctx_at + answer[0] - w0, ctx_at + answer[1] - w0
            elif train and answer is None and ex.answers and not self.options.version_2:
                continue  # SQuAD 1.1: an answer the tokenizer cannot place teaches nothing
            f.update(_example=i, _ctx=(ctx_at, w1 - w0), _offsets=offsets[w0:w1], _max_ctx=is_max)
            feats.append(f)
        return feats

    def features(self, dataset: Dataset, train: bool = False) -> list[dict]:
        questions = self.tokenizer.encode_batch([ex.text for ex in dataset.examples])
        feats = []
        for i, (ex, q) in enumerate(zip(dataset.examples, questions)):
            feats += self._example_features(i, ex, q[: self.options.max_query_len], train)
        return feats

    def scored(self, model: TaskModel, batch: dict[str, Tensor]) -> tuple[LossOutput, TaskOutput]:
        out = model(batch)
        pad = batch["attention_mask"] == 0
        start, end = (x.float().masked_fill(pad, torch.finfo(torch.float32).min) for x in out.logits)
        loss = (F.cross_entropy(start, batch["start_positions"]) + F.cross_entropy(end, batch["end_positions"])) / 2
        return self.with_aux(loss, model, out, batch), out

    def divergence(self, a: TaskOutput, b: TaskOutput, batch: dict[str, Tensor]) -> Tensor:
        """Mean of the start and end distributions' symmetric KL, over real tokens."""
        pad = batch["attention_mask"] == 0
        x = [t.float().masked_fill(pad, torch.finfo(torch.float32).min) for t in (*a.logits, *b.logits)]
        return (symmetric_kl(x[0], x[2]) + symmetric_kl(x[1], x[3])) / 2

    def predict(self, model: TaskModel, batch: dict[str, Tensor], feats: list[dict]) -> list:
        """Per window: (example index, best span score, its text, null score)."""
        start, end = (x.float() for x in model(batch).logits)  # (B, T) each
        device = start.device
        lo = torch.tensor([f["_ctx"][0] for f in feats], device=device)[:, None]
        hi = lo + torch.tensor([f["_ctx"][1] for f in feats], device=device)[:, None]
        pos = torch.arange(start.shape[1], device=device)[None, :]
        start_ok = torch.zeros_like(start, dtype=torch.bool)  # (B, T): context tokens at their max-context window
        for b, f in enumerate(feats):
            c0, n = f["_ctx"]
            start_ok[b, c0 : c0 + n] = torch.tensor(f["_max_ctx"], dtype=torch.bool)
        valid = (pos >= lo) & (pos < hi)
        score, s, e = best_spans(start, end, valid, self.options.max_answer_len, start_ok)
        null = (start[:, 0] + end[:, 0]).tolist()
        out = []
        for f, sc, si, ei, nu in zip(feats, score.tolist(), s.tolist(), e.tolist(), null):
            offs, c0 = f["_offsets"], f["_ctx"][0]
            span = (offs[si - c0][0], offs[ei - c0][1]) if sc > float("-inf") else (0, 0)  # -inf: empty window
            out.append((f["_example"], sc, span, nu))
        return out

    def predict_all(self, model: TaskModel, dataset: Dataset, batch_size: int = 64) -> list[str]:
        """The answer text of each example ("" for no answer): the best span over its windows."""
        best: dict[int, tuple[float, tuple[int, int]]] = {}
        null: dict[int, float] = {}
        for k, score, span, null_score in super().predict_all(model, dataset, batch_size):
            null[k] = min(null.get(k, null_score), null_score)
            if k not in best or score > best[k][0]:
                best[k] = (score, span)
        preds = []
        for k, ex in enumerate(dataset.examples):
            score, (c0, c1) = best.get(k, (float("-inf"), (0, 0)))
            no_answer = self.options.version_2 and null.get(k, float("-inf")) - score > self.options.null_threshold
            preds.append("" if no_answer else ex.context[c0:c1].strip())
        return preds

    def gold(self, dataset: Dataset) -> list[list[str]]:
        return [[t for _, t in ex.answers] if ex.answers else [""] for ex in dataset.examples]

    def evaluate(self, model: TaskModel, dataset: Dataset, batch_size: int = 64) -> dict[str, float]:
        """SQuAD exact match and F1 (the official script's normalisation)."""
        from lmforge.metrics import squad_scores

        scores = squad_scores(self.predict_all(model, dataset, batch_size), self.gold(dataset))
        unknown = [k for k in self.metric_names if k not in scores]
        if unknown:
            raise LMForgeError(f"task.metrics: span QA reports f1 and exact_match, not '{unknown[0]}'")
        return {k: scores[k] for k in self.metric_names}
