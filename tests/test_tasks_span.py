"""Span QA: SQuAD context windows with doc_stride, answer mapping, best-span search, no-answer handling."""

import itertools

import pytest
import tasks_testing as T
import torch

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.registry import TASKS
from lmforge.tasks.span_qa import best_spans, char_to_token_span, max_context, windows

CONTEXT = T.GETTYSBURG.split("\n\n")[0].replace("\\\n", "")
QUESTION = "What was the nation conceived in?"
ANSWER = "Liberty"


def build(family="bert", preset="bert-tiny", **options):
    tok = T.tokenizer(family)
    cls = TASKS.get("span_qa")
    t = cls(cls.Options(head_dropout=0.0, **options), tok)
    return t, t.build(T.model(preset, tok)).eval(), tok


def example(answers=None) -> Example:
    start = CONTEXT.index(ANSWER)
    return Example(text=QUESTION, context=CONTEXT, answers=[(start, ANSWER)] if answers is None else answers, id="q1")


def test_windows_cover_the_context_with_stride():
    assert windows(10, 4, 3) == [(0, 4), (3, 7), (6, 10)]
    assert windows(10, 4, 6) == [(0, 4), (4, 8), (8, 10)]  # a stride above the size still covers every token
    assert windows(3, 8, 2) == [(0, 3)]


def test_each_token_has_one_max_context_window():
    # Windows (0, 4), (2, 6), (4, 8): token 2 has 1 token on its short side in the first, 0 in the second; token 3
    # 0 in the first, 1 in the second; token 4 1 in the second, 0 in the third.
    flags = max_context(windows(8, 4, 2))
    assert flags == [[True, True, True, False], [False, True, True, False], [False, True, True, True]]
    # Every token is claimed by exactly one window.
    owners = [k for k, (w0, w1) in enumerate(windows(8, 4, 2)) for p, f in zip(range(w0, w1), flags[k]) if f]
    assert len(owners) == 8
    assert max_context(windows(0, 4, 2)) == [[]]  # an empty context has one empty window


def test_best_spans_starts_only_where_allowed():
    start, end = torch.tensor([[0.0, 9.0, 1.0, 0.0]]), torch.tensor([[0.0, 0.0, 9.0, 1.0]])
    valid = torch.ones(1, 4, dtype=torch.bool)
    assert [int(x) for x in best_spans(start, end, valid, 3)[1:]] == [1, 2]
    start_ok = torch.tensor([[False, False, True, True]])
    assert [int(x) for x in best_spans(start, end, valid, 3, start_ok)[1:]] == [2, 2]


def test_char_to_token_span_covers_the_answer():
    offsets = [(0, 3), (3, 8), (8, 9), (10, 15)]
    assert char_to_token_span(offsets, 3, 9) == (1, 2)
    assert char_to_token_span(offsets, 4, 5) == (1, 1)
    assert char_to_token_span(offsets, 10, 15) == (3, 3)
    assert char_to_token_span(offsets, 20, 22) is None


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_stride_windows_and_answer_positions(family):
    preset = "bert-tiny" if family == "bert" else "gpt-tiny"
    t, _, tok = build(family, preset, max_len=24, doc_stride=6, max_query_len=8)
    feats = t.features(Dataset([example()]), train=True)
    q = tok.encode(QUESTION)[:8]
    n_ctx = len(tok.encode(CONTEXT))
    size = 24 - len(q) - 3
    assert len(feats) == len(windows(n_ctx, size, 6)) > 3
    ctx_ids = tok.backend.encode(CONTEXT, add_special_tokens=False).ids
    first, mid, last = t.framer.start, t.framer.mid, t.framer.end
    with_answer = 0
    for f, (w0, w1) in zip(feats, windows(n_ctx, size, 6)):
        assert f["input_ids"] == first + q + mid + ctx_ids[w0:w1] + last
        assert len(f["input_ids"]) <= 24
        s, e = f["start_positions"], f["end_positions"]
        if s == 0:
            assert e == 0
            continue
        with_answer += 1
        c0 = f["_ctx"][0]
        offs = f["_offsets"]
        assert CONTEXT[offs[s - c0][0] : offs[e - c0][1]].strip() == ANSWER
    assert with_answer >= 1  # the answer sits in each window that contains it whole


def test_squad2_unanswerable_questions_point_at_cls():
    t, _, _ = build(max_len=32, doc_stride=8, version_2=True)
    feats = t.features(Dataset([example(answers=[])]), train=True)
    assert len(feats) > 1 and all(f["start_positions"] == f["end_positions"] == 0 for f in feats)


def test_best_spans_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    start, end = torch.randn(3, 9, generator=g), torch.randn(3, 9, generator=g)
    valid = torch.zeros(3, 9, dtype=torch.bool)
    valid[:, 2:8] = True
    valid[1, 6:] = False
    score, s, e = best_spans(start, end, valid, max_answer_len=3)
    for b in range(3):
        ok = [
            (i, j) for i, j in itertools.product(range(9), repeat=2) if valid[b, i] and valid[b, j] and 0 <= j - i < 3
        ]
        bi, bj = max(ok, key=lambda p: float(start[b, p[0]] + end[b, p[1]]))
        assert (int(s[b]), int(e[b])) == (bi, bj)
        torch.testing.assert_close(score[b], start[b, bi] + end[b, bj])


class FixedLogits(torch.nn.Module):
    """Stands in for a TaskModel: start/end logits that peak on given feature positions."""

    def __init__(self, peaks: dict[int, tuple[int, int]], null: float = 0.0) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.peaks, self.null, self.calls = peaks, null, 0

    def forward(self, batch):
        B, T = batch["input_ids"].shape
        start, end = torch.full((B, T), -5.0), torch.full((B, T), -5.0)
        start[:, 0] = end[:, 0] = self.null
        for b in range(B):
            if self.calls + b in self.peaks:
                i, j = self.peaks[self.calls + b]
                start[b, i], end[b, j] = 5.0, 5.0
        self.calls += B
        return type("Out", (), {"logits": (start, end)})()


def _answer_windows(feats: list[dict]) -> tuple[int, list[int]]:
    """(the window where the answer's first token has the most context, the other windows holding the answer)."""
    holding = [i for i, f in enumerate(feats) if f["start_positions"] > 0]
    best = [i for i in holding if feats[i]["_max_ctx"][feats[i]["start_positions"] - feats[i]["_ctx"][0]]]
    assert len(best) == 1
    return best[0], [i for i in holding if i != best[0]]


def test_prediction_takes_the_best_window_and_maps_back_to_text():
    t, _, tok = build(max_len=24, doc_stride=6, max_query_len=8)
    ds = Dataset([example()])
    feats = t.features(ds)
    k, _ = _answer_windows(feats)
    f = feats[k]
    model = FixedLogits({k: (f["start_positions"], f["end_positions"])})
    assert t.predict_all(model, ds, batch_size=2) == [ANSWER]
    scores = t.evaluate(FixedLogits({k: (f["start_positions"], f["end_positions"])}), ds)
    assert scores == {"f1": 1.0, "exact_match": 1.0}


def test_a_span_counts_only_in_the_window_where_its_start_has_most_context():
    t, _, _ = build(max_len=24, doc_stride=3, max_query_len=8)
    ds = Dataset([example()])
    feats = t.features(ds)
    k, others = _answer_windows(feats)
    assert others  # the answer lies in several windows
    # The answer peaks only in a window where its start lacks context: that window's span is not a candidate.
    j = others[0]
    peak = {j: (feats[j]["start_positions"], feats[j]["end_positions"])}
    assert t.predict_all(FixedLogits(peak), ds) != [ANSWER]
    peak[k] = (feats[k]["start_positions"], feats[k]["end_positions"])
    assert t.predict_all(FixedLogits(peak), ds) == [ANSWER]


def test_version2_predicts_no_answer_when_the_null_score_wins():
    t, _, _ = build(max_len=24, doc_stride=6, max_query_len=8, version_2=True, null_threshold=0.0)
    ds = Dataset([example(answers=[])])
    assert t.predict_all(FixedLogits({}, null=4.0), ds) == [""]
    assert t.evaluate(FixedLogits({}, null=4.0), ds)["exact_match"] == 1.0
    t.options.version_2 = False  # SQuAD 1.1 always answers
    assert t.predict_all(FixedLogits({}, null=4.0), ds) != [""]
