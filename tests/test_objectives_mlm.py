"""Masked LM: selection statistics, 80/10/10, static vs dynamic masks, whole words, framing, reconstruction, loss."""

import pytest
import torch
from encoder_testing import objective, one_thread, overfit, tiny_encoder, tokenizer, windows  # noqa: F401

from lmforge.errors import LMForgeError
from lmforge.models import Transformer
from lmforge.objectives import masking as M

T = 128


@pytest.fixture(scope="module")
def tok():
    return tokenizer("wordpiece", "bert")


@pytest.fixture(scope="module")
def win(tok):
    return windows(tok, T, 40_000)  # ≈ 310 windows, ≈ 39k tokens


def originals(obj, tokens):
    return M.frame(tokens, obj.cls_id, obj.sep_id, obj.pad_id)["input_ids"]


def test_mask_rate_and_80_10_10_split(tok, win):
    obj = objective("mlm", tok)
    torch.manual_seed(0)
    batch = obj.transform(win)
    orig = originals(obj, win)
    special = obj.special[orig]
    sel = batch["labels"] != M.IGNORE
    assert not (sel & special).any()  # [CLS], [SEP] (also between documents) are never selected
    assert abs(sel.sum() / (~special).sum() - 0.15) < 0.01
    # Exact count per row (BERT's round(0.15 n)): with stochastic rounding, within one token.
    per_row = sel.sum(1).double() - 0.15 * (~special).sum(1).double()
    assert per_row.abs().max() < 1.0
    got, want = batch["input_ids"][sel], orig[sel]
    masked, kept = got == tok.mask_id, got == want
    randomised = ~masked & ~kept
    assert abs(masked.double().mean() - 0.8) < 0.02
    # Unchanged = the 10% kept + random draws that hit the original (1 in ~500 here).
    assert abs(kept.double().mean() - 0.1) < 0.02 and abs(randomised.double().mean() - 0.1) < 0.02
    assert not obj.special[got[randomised]].any()  # random replacements come from the non-special vocabulary
    assert len(set(got[randomised].tolist())) > 100  # and are spread over it
    # Outside the selection, inputs are the originals; no labels there.
    assert torch.equal(batch["input_ids"][~sel], orig[~sel])


def test_targets_reconstruct_the_original_text(tok, win):
    obj = objective("mlm", tok, "--objective.whole_word=true")
    batch = obj.transform(win[:20])
    sel = batch["labels"] != M.IGNORE
    rebuilt = torch.where(sel, batch["labels"], batch["input_ids"])
    orig = originals(obj, win[:20])
    assert torch.equal(rebuilt, orig)
    assert tok.decode(rebuilt[3]) == tok.decode(win[3, : T - 2])


def test_framing_cls_text_sep(tok, win):
    framed = M.frame(win[:4], tok.cls_id, tok.sep_id, tok.pad_id)
    ids = framed["input_ids"]
    assert ids.shape == (4, T) and "attention_mask" not in framed
    assert (ids[:, 0] == tok.cls_id).all() and (ids[:, -1] == tok.sep_id).all()
    assert torch.equal(ids[:, 1:-1], win[:4, : T - 2])


def test_framing_of_padded_rows_puts_sep_after_the_text(tok):
    p = tok.pad_id
    rows = torch.tensor([[7, 8, 9, p, p, p, p, p, p], [5, 6, 7, 8, 9, 10, 11, p, p]])
    out = M.frame(rows, tok.cls_id, tok.sep_id, p)
    c, s = tok.cls_id, tok.sep_id
    assert out["input_ids"].tolist() == [[c, 7, 8, 9, s, p, p, p], [c, 5, 6, 7, 8, 9, 10, s]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0, 0, 0], [1] * 8]


def test_padding_is_never_selected(tok):
    obj = objective("mlm", tok, "--objective.mask_rate=0.5")
    p = tok.pad_id
    rows = torch.tensor([[40, 41, 42, 43, p, p, p, p, p, p, p]] * 50)
    batch = obj.transform(rows)
    sel = batch["labels"] != M.IGNORE
    assert sel[:, 1:5].sum(1).eq(2).all()  # half of the 4 text tokens, none of the padding or specials
    assert not sel[:, 5:].any() and not sel[:, 0].any()


def test_dynamic_masks_change_static_masks_repeat(tok, win):
    rows = win[:16]
    dyn = objective("mlm", tok)
    a, b = dyn.transform(rows)["labels"], dyn.transform(rows)["labels"]
    assert not torch.equal(a != M.IGNORE, b != M.IGNORE)
    st = objective("mlm", tok, "--objective.static=true", "--run.seed=3")
    first = st.transform(rows)
    again = st.transform(rows.flip(0))  # same examples, another epoch order and batch position
    assert torch.equal(first["input_ids"], again["input_ids"].flip(0))
    assert torch.equal(first["labels"], again["labels"].flip(0))
    other_seed = objective("mlm", tok, "--objective.static=true", "--run.seed=4").transform(rows)
    assert not torch.equal(first["labels"], other_seed["labels"])


def test_eval_masks_are_fixed(tok, win):
    obj = objective("mlm", tok)
    a, b = obj.eval_transform(win[:8]), obj.eval_transform(win[:8])
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    assert abs((a["labels"] != M.IGNORE).double().sum() / (8 * (T - 2)) - 0.15) < 0.03


def test_a_run_masking_30_percent_is_scored_on_the_15_percent_validation_masks(tok, win):
    rows = win[:32]
    base = objective("mlm", tok).eval_transform(rows)
    high = objective("mlm", tok, "--objective.mask_rate=0.3", "--objective.eval_mask_rate=0.15")
    assert torch.equal(high.eval_transform(rows)["labels"], base["labels"])  # the same predictions, the same inputs
    assert torch.equal(high.eval_transform(rows)["input_ids"], base["input_ids"])
    torch.manual_seed(0)
    trained = high.transform(rows)["labels"] != M.IGNORE
    assert abs(trained.double().sum() / (32 * (T - 2)) - 0.3) < 0.03  # training keeps its own rate
    assert high.options.mask_rate == 0.3
    with pytest.raises(LMForgeError, match="eval_mask_rate must be between 0 and 1"):
        objective("mlm", tok, "--objective.eval_mask_rate=1.5")


def _words(ids: torch.Tensor, table: torch.Tensor, special: torch.Tensor) -> list[list[int]]:
    """Positions of each word of a row: a word starts at a word-start token or right after a special token."""
    words: list[list[int]] = []
    prev_special = True
    for i, t in enumerate(ids.tolist()):
        if table[t] or prev_special:
            words.append([])
        words[-1].append(i)
        prev_special = bool(special[t])
    return words


@pytest.mark.parametrize("kind, family", [("wordpiece", "bert"), ("bpe", "bart")])
def test_whole_word_masking_selects_complete_words(kind, family):
    tok = tokenizer(kind, family)
    table = M.word_start_table(tok)
    # The table follows the tokenizer's word marker.
    for text in ("##ing", "Ġthe", "the", "ing"):
        tid = tok.token_to_id(text)
        if tid is not None:
            expected = not text.startswith("##") if kind == "wordpiece" else text.startswith("Ġ")
            assert bool(table[tid]) == expected, text
    win = windows(tok, T, 30_000)
    obj = objective("mlm", tok, "--objective.whole_word=true")
    batch = obj.transform(win)
    sel = batch["labels"] != M.IGNORE
    orig = originals(obj, win)
    multi = 0
    for r in range(len(win)):
        for word in _words(orig[r], table, obj.special):
            flags = sel[r, word]
            assert flags.all() or not flags.any()  # a word is predicted entirely or not at all
            multi += int(flags.all() and len(word) > 1)
    assert multi > 200  # many selected words span several tokens
    cand = ~obj.special[orig]
    assert abs(sel.sum() / cand.sum() - 0.15) < 0.01


def test_albert_ngram_lengths_follow_one_over_n():
    probs = M.ngram_length_probs(3)
    assert torch.allclose(probs, torch.tensor([6 / 11, 3 / 11, 2 / 11], dtype=torch.float64))
    # Synthetic rows (≈ 1.7 tokens per word), as the SpanBERT statistics test: ≈ 12.5k n-grams.
    g = torch.Generator().manual_seed(0)
    B, L = 900, 256
    cand = torch.ones(B, L, dtype=torch.bool)
    cand[:, 0] = cand[:, -1] = False
    starts = M.word_starts(torch.arange(B * L).view(B, L), cand, torch.rand(B * L, generator=g) < 0.6)
    torch.manual_seed(0)
    selected, span = M.select_spans(cand, starts, 0.15, probs, M.Draws())
    assert abs(selected.sum() / cand.sum() - 0.15) < 0.005
    key = (torch.arange(B)[:, None] * L + span)[selected & starts]
    words = torch.unique(key, return_counts=True)[1]
    assert len(words) > 10_000
    hist = torch.bincount(words, minlength=4)[1:].double() / len(words)
    assert torch.allclose(hist, probs, atol=0.015)


def test_ngram_masking_selects_whole_words_and_replaces_per_token(tok, win):
    obj = objective("mlm", tok, "--objective.ngram=3")
    torch.manual_seed(0)
    batch = obj.transform(win)
    sel = batch["labels"] != M.IGNORE
    orig = originals(obj, win)
    assert abs(sel.sum() / (~obj.special[orig]).sum() - 0.15) < 0.01
    table = M.word_start_table(tok)
    mixed = 0
    for r in range(len(win)):
        for word in _words(orig[r], table, obj.special):
            flags = sel[r, word]
            assert flags.all() or not flags.any()  # n-grams cover complete words
            if flags.all() and len(word) > 1:
                masked = batch["input_ids"][r, word] == tok.mask_id
                mixed += int(masked.any() and not masked.all())
    assert mixed > 10  # 80/10/10 per token: one word's pieces can be treated differently
    with pytest.raises(LMForgeError, match="objective.ngram must be >= 0"):
        objective("mlm", tok, "--objective.ngram=-1")


def test_bad_options_give_one_line_errors(tok):
    with pytest.raises(LMForgeError, match=r"^objective.mask_rate must be between 0 and 1 \(exclusive\), got 1.5$"):
        objective("mlm", tok, "--objective.mask_rate=1.5")
    with pytest.raises(LMForgeError, match=r"mask_frac \+ objective.random_frac must be at most 1, got 0.9 \+ 0.2"):
        objective("mlm", tok, "--objective.mask_frac=0.9", "--objective.random_frac=0.2")
    with pytest.raises(LMForgeError, match=r"unknown config key 'objective.mask_rat' — did you mean"):
        objective("mlm", tok, "--objective.mask_rat=0.2")
    with pytest.raises(LMForgeError, match=r"needs a tokenizer with a mask token"):
        objective("mlm", tokenizer("bpe", "gpt"))


def test_loss_runs_the_head_on_selected_positions_only_and_overfits(tok, win, one_thread):  # noqa: F811
    obj = objective("mlm", tok)
    torch.manual_seed(0)
    batch = obj.transform(win[:8, :65])
    model = Transformer(tiny_encoder(tok.vocab_size, dropout=0.0))
    seen = []
    model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    out = obj.loss(model, batch)
    n_sel = int((batch["labels"] != M.IGNORE).sum())
    assert seen == [(n_sel, tok.vocab_size)] and out.n_tokens == n_sel
    assert abs(float(out.loss.detach()) - torch.log(torch.tensor(float(tok.vocab_size)))) < 0.5  # ≈ uniform at init
    losses = overfit(model, obj, batch, steps=40)
    assert losses[-1] < 0.5 * losses[0]
