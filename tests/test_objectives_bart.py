"""BART denoising: span statistics, exact noising against a per-row reference, sentence permutation, rotation,
the teacher-forced batch, an overfit run and the recipe through the CLI."""

import itertools
import math
from collections import Counter

import pytest
import torch
from lm_objective_testing import (
    TINY_SEQ2SEQ,
    objective,
    overfit,
    tokenizer,
    train_recipe,
    windows,
)

from lmforge.errors import LMForgeError
from lmforge.models import Transformer
from lmforge.objectives.bart import emit, infill, permute_sentences, poisson_spans, rotate

MASK, PAD = 999, -1


def bart(**options):
    return objective("bart", tokenizer("bart"), model=TINY_SEQ2SEQ, **options)


def random_rows(batch: int, length: int) -> torch.Tensor:
    return torch.randint(10, 300, (batch, length))


def test_poisson_spans_cover_exactly_the_rate_with_poisson_lengths():
    torch.manual_seed(0)
    B, L, lam = 400, 512, 3.0
    n_noise = round(0.3 * L)
    s = poisson_spans(B, L, n_noise, lam)
    covered = (s.length * s.valid).sum(1)
    assert covered.tolist() == [n_noise] * B  # exact count per row
    # Spans are in order, apart and inside the row: each ends before the next begins.
    end = s.start + s.length
    ok = s.valid[:, 1:]
    assert bool(((s.start[:, 1:] >= end[:, :-1]) | ~ok).all())
    assert bool(((end <= L) | ~s.valid).all())
    # Lengths other than each row's last (trimmed) span follow Poisson(3).
    n = s.valid.sum(1)
    inner = s.valid.clone()
    inner[torch.arange(B), n - 1] = False
    lengths = s.length[inner].float()
    assert len(lengths) > 10_000
    assert abs(lengths.mean().item() - lam) < 0.1
    for k in range(7):
        pmf = math.exp(-lam) * lam**k / math.factorial(k)
        assert abs((lengths == k).float().mean().item() - pmf) < 0.012, k


def reference_noise(x, masked, deleted, spans) -> list[list[int]]:
    """BART noising of each row, token by token: spans → one MASK (0-length: an inserted MASK)."""
    out = []
    for b in range(x.shape[0]):
        cover, inserts = {}, Counter()
        for j in range(spans.start.shape[1]):
            if not spans.valid[b, j]:
                continue
            start, length = int(spans.start[b, j]), int(spans.length[b, j])
            if length == 0:
                inserts[start] += 1
            for p in range(start, start + length):
                cover[p] = p == start
        row = []
        for p in range(x.shape[1] + 1):
            row += [MASK] * inserts[p]
            if p == x.shape[1]:
                break
            if p in cover:
                row += [MASK] if cover[p] else []
            elif not deleted[b, p]:
                row.append(MASK if masked[b, p] else int(x[b, p]))
        out.append(row)
    return out


def test_masking_deletion_and_infilling_match_a_per_token_reference():
    torch.manual_seed(1)
    B, L = 64, 40
    x = random_rows(B, L)
    u = torch.rand(B, L)
    masked, deleted = u < 0.1, (u >= 0.1) & (u < 0.2)
    spans = poisson_spans(B, L, 12, 3.0)
    assert bool((spans.valid & (spans.length == 0)).any())  # the draw includes insertions
    vals, keep, inserts = infill(torch.where(masked, MASK, x), ~deleted, spans, MASK)
    rows, lengths = emit(vals, keep, inserts, MASK, PAD)
    expected = reference_noise(x, masked, deleted, spans)
    assert lengths.tolist() == [len(r) for r in expected]
    for b in range(B):
        assert rows[b, : lengths[b]].tolist() == expected[b]
        assert bool((rows[b, lengths[b] :] == PAD).all())


def test_token_masking_and_deletion_rates():
    torch.manual_seed(2)
    obj = bart(mask_rate=0.15, delete_rate=0.1, infill_rate=0.0, permute=False)
    x = random_rows(200, 100)  # 20k tokens
    src, lengths = obj.noise(x)
    assert abs(1 - lengths.sum().item() / x.numel() - 0.1) < 0.01  # deleted
    assert abs((src == obj.mask_id).sum().item() / x.numel() - 0.15) < 0.01  # masked
    for b in range(20):
        assert is_subsequence([t for t in src[b, : lengths[b]].tolist() if t != obj.mask_id], x[b].tolist())


def is_subsequence(short: list[int], long: list[int]) -> bool:
    it = iter(long)
    return all(t in it for t in short)


def test_infilling_keeps_the_clean_tokens_and_one_mask_per_span():
    torch.manual_seed(3)
    obj = bart(infill_rate=0.3, permute=False)
    x = random_rows(300, 100)
    src, lengths = obj.noise(x)
    n_masks = (src == obj.mask_id).sum(1)
    clean = lengths - n_masks
    assert clean.tolist() == [70] * 300  # exactly 30% of the tokens went into spans
    # 30 tokens in spans of mean 3 (1/e^3 of them 0-length insertions): about 10 masks per row.
    assert 9.0 < n_masks.float().mean().item() < 11.0
    for b in range(20):
        assert is_subsequence([t for t in src[b, : lengths[b]].tolist() if t != obj.mask_id], x[b].tolist())


def test_random_rate_swaps_masks_for_ordinary_tokens():
    torch.manual_seed(4)
    obj = bart(mask_rate=0.5, infill_rate=0.0, permute=False, random_rate=0.2)
    x = torch.full((100, 100), 7)
    src, _ = obj.noise(x)
    changed = (src != 7).sum().item()
    random = ((src != 7) & (src != obj.mask_id)).sum().item()
    assert abs(random / changed - 0.2) < 0.02
    tok = obj.tokenizer
    special = torch.tensor([tok.token_to_id(t) for t in tok.special_tokens.values() if t != "<mask>"])
    assert not bool(torch.isin(src, special).any())  # random tokens are ordinary ones


def test_sentence_permutation_shuffles_whole_sentences_uniformly():
    torch.manual_seed(5)
    end = torch.zeros(20, dtype=torch.bool)
    end[0] = True  # token 0 ends a sentence
    # Three sentences: [5 6 0] [7 0] [8 9 9] (the last one unfinished, as at a window's end).
    row = torch.tensor([5, 6, 0, 7, 0, 8, 9, 9])
    out = permute_sentences(row.repeat(6000, 1), end)
    orders = Counter(tuple(r) for r in out.tolist())
    sentences = [(5, 6, 0), (7, 0), (8, 9, 9)]
    expected = {tuple(t for s in p for t in s) for p in itertools.permutations(sentences)}
    assert set(orders) == expected
    assert all(abs(c / 6000 - 1 / 6) < 0.02 for c in orders.values())


def test_sentence_permutation_on_text_keeps_every_sentence():
    tok = tokenizer("bart")
    obj = bart(infill_rate=0.0, permute=True)
    x = windows(tok, 16, 128)[:, :-1]
    torch.manual_seed(6)
    src, lengths = obj.noise(x)
    assert lengths.tolist() == [128] * 16
    moved = multi = 0
    for b in range(16):
        text, noised = tok.decode(x[b].tolist()), tok.decode(src[b].tolist())
        assert sorted(text) == sorted(noised)
        moved += text != noised
        ends = obj.sentence_end[x[b]].nonzero().squeeze(1).tolist()
        pieces = [x[b, i + 1 : j + 1].tolist() for i, j in zip([-1, *ends], [*ends, 127]) if j > i]
        flat = src[b].tolist()
        for piece in pieces:  # every sentence appears contiguously in the permuted row
            assert any(flat[k : k + len(piece)] == piece for k in range(129 - len(piece)))
        multi += len(pieces) > 1
    # A row of k sentences keeps its order with probability 1/k!: most rows of several sentences change.
    assert multi >= 10 and moved >= multi / 2


def test_rotation_is_a_cyclic_shift_of_the_noised_row():
    rows = torch.tensor([[1, 2, 3, 4, PAD], [5, 6, 7, 8, 9]])
    out = rotate(rows, torch.tensor([4, 5]), torch.tensor([1, 3]), PAD)
    assert out.tolist() == [[2, 3, 4, 1, PAD], [8, 9, 5, 6, 7]]
    x = random_rows(8, 50)
    torch.manual_seed(7)
    plain, n_plain = bart(rotate=False, permute=False).noise(x)
    torch.manual_seed(7)
    rolled, n_rolled = bart(rotate=True, permute=False).noise(x)
    assert torch.equal(n_plain, n_rolled)
    shifts = []
    for b in range(8):
        a, r = plain[b, : n_plain[b]].tolist(), rolled[b, : n_rolled[b]].tolist()
        shifts.append(next(k for k in range(len(a)) if a[k:] + a[:k] == r))
    assert len(set(shifts)) > 3


def test_batch_is_teacher_forced_on_the_original_window():
    tok = tokenizer("bart")
    obj = bart(mask_rate=0.1, delete_rate=0.1, infill_rate=0.3, rotate=True)
    tokens = windows(tok, 4, 64)
    batch = obj.transform(tokens)
    assert torch.equal(batch["labels"], tokens[:, :-1])
    start = obj.cfg.model.decoder_start_id
    assert batch["decoder_input_ids"][:, 0].tolist() == [start] * 4
    assert torch.equal(batch["decoder_input_ids"][:, 1:], tokens[:, :-2])
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape[1] == int(lengths.max())
    pads = batch["input_ids"][batch["attention_mask"] == 0]
    assert bool((pads == obj.cfg.model.pad_id).all())
    assert bool((lengths < 64).all())  # deletion and infilling shorten every row


def test_source_is_cut_at_max_seq_len_for_learned_positions():
    obj = objective("bart", tokenizer("bart"), model={**TINY_SEQ2SEQ, "max_seq_len": 64}, infill_rate=0.5,
                    poisson_lambda=0.05, permute=False)  # fmt: skip
    torch.manual_seed(8)
    batch = obj.transform(random_rows(8, 65))
    assert batch["input_ids"].shape[1] == 64  # almost all spans are insertions: rows grow past 64


def test_bad_setups_give_one_clear_error():
    with pytest.raises(LMForgeError, match="objective 'bart' trains an encoder-decoder"):
        objective("bart", tokenizer("bart"), model={"arch": "decoder", "d_model": 32, "n_heads": 4})
    with pytest.raises(LMForgeError, match="has no mask token: set data.tokenizer_family: bart"):
        objective("bart", tokenizer("gpt"), model=TINY_SEQ2SEQ)
    with pytest.raises(LMForgeError, match=r"objective.infill_rate must be in \[0, 1\], got 1.5"):
        bart(infill_rate=1.5)


def test_overfits_one_batch():
    tok = tokenizer("bart")
    obj = bart()
    torch.manual_seed(0)
    batch = obj.transform(windows(tok, 8, 32))
    torch.manual_seed(0)
    model = Transformer(obj.cfg.model)
    losses = overfit(obj, model, batch, steps=40, lr=1e-2)
    assert losses[0] > 5.0  # ln(400) ≈ 6.0 at init
    assert losses[-1] < 0.25 * losses[0]


def test_recipe_trains_through_the_cli(tmp_path):
    train_recipe(
        tmp_path, "bart", "--model.preset=bart-tiny", "--model.dropout=0.0", "--train.seq_len=32", "--train.lr=3e-3"
    )
