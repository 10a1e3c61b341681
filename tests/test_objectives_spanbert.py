"""SpanBERT span masking: geometric span lengths, 15% budget, complete words, per-span 80/10/10, reconstruction."""

import pytest
import torch
from encoder_testing import objective, one_thread, overfit, tiny_encoder, tokenizer, windows  # noqa: F401

from lmforge.errors import LMForgeError
from lmforge.objectives import masking as M
from lmforge.objectives.mlm import mlm_loss
from lmforge.objectives.spanbert import span_boundaries

T = 128


@pytest.fixture(scope="module")
def tok():
    return tokenizer("wordpiece", "bert")


@pytest.fixture(scope="module")
def setup(tok):
    """Windows, their framed originals, candidates and word starts (≈ 63k tokens)."""
    obj = objective("spanbert", tok)
    win = windows(tok, T, 64_000)
    orig = M.frame(win, obj.cls_id, obj.sep_id, obj.pad_id)["input_ids"]
    cand = obj.candidates({"input_ids": orig})
    starts = M.word_starts(orig, cand, obj.word_table)
    return obj, win, orig, cand, starts


def test_length_distribution_is_truncated_geometric():
    probs = M.geometric_length_probs(0.2, 10)
    assert torch.allclose(probs.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert torch.allclose(probs[1:] / probs[:-1], torch.full((9,), 0.8, dtype=torch.float64))
    mean = float((probs * torch.arange(1, 11)).sum())
    assert abs(mean - 3.8) < 0.01  # SpanBERT §3.1: "a mean span length of 3.8"


def words_per_span(selected: torch.Tensor, span: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Word count of every span (a span is a (row, span id) pair; its words are its word-start tokens)."""
    key = (torch.arange(len(span))[:, None] * span.shape[1] + span)[selected & starts]
    return torch.unique(key, return_counts=True)[1]


def test_span_length_statistics():
    """Over ≈ 6k spans of synthetic rows (≈ 1.7 tokens per word): Geo(0.2) lengths truncated at 10, 15% budget."""
    g = torch.Generator().manual_seed(0)
    B, L = 1000, 256
    cand = torch.ones(B, L, dtype=torch.bool)
    cand[:, 0] = cand[:, -1] = False  # [CLS] ... [SEP]
    table = torch.rand(B * L, generator=g) < 0.6  # a random "vocabulary" of word-start tokens, one per position
    starts = M.word_starts(torch.arange(B * L).view(B, L), cand, table)
    torch.manual_seed(0)
    selected, span = M.select_spans(cand, starts, 0.15, M.geometric_length_probs(0.2, 10), M.Draws())
    assert abs(selected.sum() / cand.sum() - 0.15) < 0.005
    words = words_per_span(selected, span, starts)
    assert len(words) > 5000
    assert abs(words.double().mean() - 3.8) < 0.1
    assert words.max() <= 10 and words.min() >= 1
    hist = torch.bincount(words, minlength=11)[1:].double() / len(words)
    assert torch.allclose(hist, M.geometric_length_probs(0.2, 10), atol=0.015)


def test_spans_cover_complete_words_of_real_text(setup):
    obj, win, orig, cand, starts = setup
    torch.manual_seed(0)
    selected, span = M.select_spans(cand, starts, 0.15, obj.length_probs, M.Draws())
    assert torch.equal(selected, span >= 0) and not (selected & ~cand).any()
    assert abs(selected.sum() / cand.sum() - 0.15) < 0.01
    words = words_per_span(selected, span, starts)
    assert len(words) > 500 and abs(words.double().mean() - 3.8) < 0.3
    # Spans start at word starts and never end inside a word.
    first_of_span = selected & ~torch.cat([torch.zeros(len(span), 1, dtype=torch.bool), span[:, 1:] == span[:, :-1]], 1)
    assert starts[first_of_span].all()
    wid = torch.cumsum(starts.long(), 1)
    same_word_next = wid[:, 1:] == wid[:, :-1]
    assert torch.equal(selected[:, 1:][same_word_next], selected[:, :-1][same_word_next])
    # Each span is contiguous: a span id never reappears after a gap.
    for r in range(0, len(span), 7):
        ids = span[r][span[r] >= 0]
        runs = torch.unique_consecutive(ids)
        assert len(runs) == len(torch.unique(ids))


def test_replacement_is_decided_per_span_and_targets_reconstruct(setup):
    obj, win, orig, cand, starts = setup
    torch.manual_seed(1)
    batch = obj.transform(win)
    sel = batch["labels"] != M.IGNORE
    assert torch.equal(torch.where(sel, batch["labels"], batch["input_ids"]), orig)
    assert abs(sel.sum() / cand.sum() - 0.15) < 0.01
    # Replay static maskings with their span ids (selection is the first consumer of the draws), 3 seeds.
    outs, spans = [], []
    for seed in (5, 6, 7):
        outs.append(obj.mask({"input_ids": orig.clone()}, M.Draws.static(orig, seed))["input_ids"])
        spans.append(obj.select({"input_ids": orig}, cand, M.Draws.static(orig, seed))[1])
        assert torch.equal(outs[-1] != orig, (outs[-1] != orig) & (spans[-1] >= 0))
    out, span, orig = {"input_ids": torch.cat(outs)}, torch.cat(spans), orig.repeat(3, 1)
    chosen = span >= 0
    _, which = torch.unique((torch.arange(len(span))[:, None] * T + span)[chosen], return_inverse=True)
    n_spans = int(which.max()) + 1
    state = torch.zeros(len(which), dtype=torch.long)  # 0 kept, 1 [MASK], 2 random
    state[out["input_ids"][chosen] == obj.mask_id] = 1
    state[(out["input_ids"][chosen] != obj.mask_id) & (out["input_ids"][chosen] != orig[chosen])] = 2
    lo = torch.full((n_spans,), 9).scatter_reduce(0, which, state, "amin")
    hi = torch.full((n_spans,), -1).scatter_reduce(0, which, state, "amax")
    masked, rest = hi == 1, hi != 1
    assert torch.equal(lo[masked], hi[masked])  # a [MASK] span is [MASK] throughout
    assert not (lo[rest] == 1).any()  # other spans have no [MASK] at all
    assert n_spans > 2000
    assert abs(masked.double().mean() - 0.8) < 0.03
    assert abs((hi == 2).double().mean() - 0.1) < 0.03  # random spans (a random token may equal the original)


def test_bad_options(tok):
    with pytest.raises(LMForgeError, match=r"^objective.geometric_p must be in \(0, 1\], got 0.0$"):
        objective("spanbert", tok, "--objective.geometric_p=0")
    with pytest.raises(LMForgeError, match=r"^objective.max_span must be at least 1, got 0$"):
        objective("spanbert", tok, "--objective.max_span=0")


def test_overfits_one_batch(tok, setup, one_thread):  # noqa: F811
    obj, win, *_ = setup
    torch.manual_seed(0)
    batch = obj.transform(win[:8, :65])
    model = obj.build_model(tiny_encoder(tok.vocab_size))
    losses = overfit(model, obj, batch, steps=40)
    assert losses[-1] < 0.5 * losses[0]


def test_span_boundaries_point_just_outside_each_span():
    # Row 0: span 0 over positions 2-4, span 1 over 6; row 1: span 0 over 0-1 (no left neighbour: clamped).
    span = torch.tensor([[-1, -1, 0, 0, 0, -1, 1, -1], [0, 0, -1, -1, -1, -1, -1, -1]])
    left, right, offset = span_boundaries(span)
    assert left.tolist() == [[0, 0, 1, 1, 1, 0, 5, 0], [0, 0, 0, 0, 0, 0, 0, 0]]
    assert right.tolist() == [[0, 0, 5, 5, 5, 0, 7, 0], [2, 2, 0, 0, 0, 0, 0, 0]]
    assert offset.tolist() == [[0, 0, 0, 1, 2, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0]]


def test_span_boundary_objective_adds_a_head_and_a_loss(tok, setup):
    obj, win, *_ = setup
    torch.manual_seed(0)
    batch = obj.transform(win[:8, :65])
    sel = batch["labels"] != M.IGNORE
    at = sel.nonzero()[:, 1]  # positions of the predicted tokens: their boundaries lie on either side
    assert (batch["sbo_left"][sel] < at).all() and (batch["sbo_right"][sel] > at).all()
    model = obj.build_model(tiny_encoder(tok.vocab_size))
    out = obj.loss(model, batch)
    mlm = mlm_loss(model, batch)[0]
    assert out.loss.item() == pytest.approx(mlm.item() + float(out.metrics["sbo_loss"]), rel=1e-5)
    out.loss.backward()
    assert model.sbo.fc1.weight.grad.abs().sum() > 0 and model.sbo.positions.weight.grad.abs().sum() > 0
    # Without SBO: the plain encoder and the MLM loss alone.
    plain = objective("spanbert", tok, "--objective.sbo=false")
    torch.manual_seed(0)
    batch = plain.transform(win[:8, :65])
    assert "sbo_left" not in batch and plain.build_model(tiny_encoder(tok.vocab_size)).sbo is None
