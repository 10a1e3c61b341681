"""T5 span corruption and its Table 4/5/7 variants: exact noise counts, span statistics, sentinel order, exact
reconstruction of the text from input + target, corruption splits, an overfit run and the recipe through the CLI."""

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
from lmforge.objectives.t5 import random_spans_noise_mask, span_counts

T5_TOK = ("t5", "unigram", 400)


def t5(style: str = "span", seq_len: int = 64, **options):
    return objective("t5", tokenizer(*T5_TOK), model=TINY_SEQ2SEQ, seq_len=seq_len, style=style, **options)


def rows(batch: int, length: int) -> torch.Tensor:
    """(B, L + 1) windows of ordinary ids (no specials or sentinels)."""
    return torch.randint(10, 250, (batch, length + 1))


def real(batch: dict, key: str, b: int) -> list[int]:
    """Row b of input_ids or labels without padding."""
    if key == "input_ids":
        return [t for t, ok in zip(batch[key][b].tolist(), src_mask(batch)[b].tolist()) if ok]
    return [t for t in batch[key][b].tolist() if t != -100]


def src_mask(batch: dict) -> torch.Tensor:
    """The source padding mask; a batch without one has no padded row."""
    return batch.get("attention_mask", torch.ones_like(batch["input_ids"]))


def reconstruct(inp: list[int], tgt: list[int], sentinels: set[int], eos: int) -> list[int]:
    """Put each target span back in place of its sentinel in the input."""
    assert inp[-1] == eos and tgt[-1] == eos
    spans, current = {}, None
    for t in tgt[:-1]:
        if t in sentinels:
            current = t
            spans[current] = []
        else:
            spans[current].append(t)
    out = []
    for t in inp[:-1]:
        out += spans.pop(t) if t in sentinels else [t]
    assert not spans  # every target span had its sentinel in the input
    return out


@pytest.mark.parametrize("density, mean", [(0.15, 3.0), (0.1, 2.0), (0.25, 5.0), (0.5, 10.0)])
def test_random_spans_noise_mask_has_exact_counts(density, mean):
    torch.manual_seed(0)
    B, L = 200, 512
    noise = random_spans_noise_mask(B, L, density, mean)
    n_noise, n_spans = span_counts(L, density, mean)
    assert n_noise == round(L * density)
    assert noise.sum(1).tolist() == [n_noise] * B
    starts = noise & ~torch.nn.functional.pad(noise[:, :-1], (1, 0))
    assert starts.sum(1).tolist() == [n_spans] * B
    assert not bool(noise[:, 0].any()) and bool(noise[:, -1].all())  # starts clean, ends inside a span
    # Spans are spread over the row, not bunched: each quarter holds about its share of the noise.
    quarters = noise.view(B, 4, L // 4).float().mean((0, 2))
    assert bool(((quarters - density).abs() < 0.03).all()), quarters


def test_span_lengths_average_the_mean_span_length():
    torch.manual_seed(1)
    noise = random_spans_noise_mask(300, 200, 0.15, 3.0)  # 30 noise tokens in 10 spans per row
    edges = torch.diff(noise.long(), dim=1, prepend=torch.zeros(300, 1, dtype=torch.long), append=torch.zeros(300, 1))
    starts, ends = (edges == 1).nonzero()[:, 1], (edges == -1).nonzero()[:, 1]
    lengths = (ends - starts).float()
    assert len(lengths) == 3000 and lengths.mean().item() == 3.0
    assert lengths.min().item() >= 1 and lengths.max().item() > 6  # lengths vary (random segmentation)


def test_span_style_reconstructs_the_text_with_ordered_sentinels():
    obj = t5("span")
    torch.manual_seed(2)
    tokens = rows(50, 64)
    batch = obj.transform(tokens)
    sentinels = obj.tokenizer.sentinel_ids(100)
    n_noise, n_spans = span_counts(64, 0.15, 3.0)
    assert batch["input_ids"].shape == (50, 64 - n_noise + n_spans + 1)  # no padding: equal lengths
    assert batch["labels"].shape == (50, n_noise + n_spans + 1)
    for b in range(50):
        inp, tgt = real(batch, "input_ids", b), real(batch, "labels", b)
        assert [t for t in inp if t in sentinels] == sentinels[:n_spans]  # <extra_id_0>, <extra_id_1>, ...
        assert [t for t in tgt if t in sentinels] == sentinels[:n_spans]
        assert tgt[0] == sentinels[0]
        assert reconstruct(inp, tgt, set(sentinels), obj.eos_id) == tokens[b, :-1].tolist()


def test_iid_style_gives_one_sentinel_per_run_and_reconstructs():
    obj = t5("iid", noise_density=0.15)
    torch.manual_seed(3)
    tokens = rows(200, 100)  # 20k tokens
    batch = obj.transform(tokens)
    sentinels = obj.tokenizer.sentinel_ids(100)
    n_noise = 0
    for b in range(200):
        inp, tgt = real(batch, "input_ids", b), real(batch, "labels", b)
        n_runs = sum(t in sentinels for t in inp)
        assert [t for t in tgt if t in sentinels] == sentinels[:n_runs]
        assert all(a not in sentinels or b not in sentinels for a, b in zip(inp, inp[1:]))  # runs are maximal
        assert reconstruct(inp, tgt, set(sentinels), obj.eos_id) == tokens[b, :-1].tolist()
        n_noise += len(tgt) - 1 - n_runs
    assert abs(n_noise / 20_000 - 0.15) < 0.01


def test_bert_style_splits_corruption_80_10_10_and_targets_the_original():
    obj = t5("bert", seq_len=200)
    torch.manual_seed(4)
    tokens = torch.full((500, 201), 7)  # 100k tokens of one ordinary id: any change is corruption
    batch = obj.transform(tokens)
    inp = batch["input_ids"][:, :-1]
    assert batch["input_ids"][:, -1].tolist() == [obj.eos_id] * 500
    masked = (inp == obj.mask_id).float().mean().item()
    random = ((inp != 7) & (inp != obj.mask_id)).float().mean().item()
    # 15% corrupted: 80% of them masked, 10% random (a random draw of 7 itself is rare), 10% unchanged.
    assert abs(masked - 0.15 * 0.8) < 0.005 and abs(random - 0.15 * 0.1) < 0.003
    assert obj.mask_id == obj.tokenizer.sentinel_ids(1)[0]  # T5 tokenizers have no mask: <extra_id_0>
    assert batch["labels"][:, :-1].eq(7).all() and batch["labels"][:, -1].eq(obj.eos_id).all()


def test_mass_drop_deshuffle_prefix_and_lm_styles():
    torch.manual_seed(5)
    tokens = rows(200, 100)
    x = tokens[:, :-1]
    eos = t5().eos_id
    batch = t5("mass", seq_len=100).transform(tokens)
    masked = batch["input_ids"][:, :-1] == t5().mask_id
    assert abs(masked.float().mean().item() - 0.15) < 0.01
    assert torch.equal(torch.where(masked, x, batch["input_ids"][:, :-1]), x)
    assert torch.equal(batch["labels"][:, :-1], x)

    batch = t5("drop", seq_len=100, noise_density=0.25).transform(tokens)
    n_dropped = 0
    for b in range(200):
        inp, tgt = real(batch, "input_ids", b)[:-1], real(batch, "labels", b)[:-1]
        assert sorted(inp + tgt) == sorted(x[b].tolist())
        n_dropped += len(tgt)
    assert abs(n_dropped / 20_000 - 0.25) < 0.01

    batch = t5("deshuffle", seq_len=100).transform(tokens)
    assert torch.equal(batch["input_ids"][:, :-1].sort(1).values, x.sort(1).values)
    assert not torch.equal(batch["input_ids"][:, :-1], x)
    assert torch.equal(batch["labels"][:, :-1], x)

    batch = t5("prefix_lm", seq_len=100, noise_density=0.5).transform(tokens)
    prefixes = []
    for b in range(200):
        inp, tgt = real(batch, "input_ids", b), real(batch, "labels", b)
        assert inp[-1] == eos and tgt[-1] == eos
        assert inp[:-1] + tgt[:-1] == x[b].tolist()
        prefixes.append(len(inp) - 1)
    assert min(prefixes) >= 1 and max(prefixes) <= 99 and abs(sum(prefixes) / 200 - 50) < 4  # uniform split

    batch = t5("lm", seq_len=100).transform(tokens)
    assert batch["input_ids"].tolist() == [[eos]] * 200
    assert torch.equal(batch["labels"][:, :-1], x)


def test_decoder_inputs_are_the_targets_shifted_behind_the_start_token():
    obj = t5("iid", noise_density=0.3)
    torch.manual_seed(6)
    batch = obj.transform(rows(16, 64))
    labels, dec = batch["labels"], batch["decoder_input_ids"]
    assert dec[:, 0].tolist() == [obj.cfg.model.decoder_start_id] * 16
    ok = labels != -100
    assert torch.equal(dec[:, 1:][ok[:, :-1]], labels[:, :-1][ok[:, :-1]])
    lengths = ok.sum(1)
    assert len(set(lengths.tolist())) > 1  # i.i.d. noise: ragged targets, padded with -100
    assert labels[torch.arange(16), lengths - 1].tolist() == [obj.eos_id] * 16


def test_source_mask_only_when_a_row_is_padded_and_the_loss_is_the_same_without_it():
    """Span corruption makes rows of one length: no attention_mask, so cross-attention can run unmasked; the loss
    equals that of the same batch with an all-ones mask. Ragged styles (drop) keep their mask."""
    torch.manual_seed(2)
    obj = t5("span")
    batch = obj.transform(rows(4, 64))
    assert "attention_mask" not in batch
    assert "attention_mask" in t5("drop").transform(rows(4, 64))
    torch.manual_seed(0)
    model = Transformer(obj.cfg.model)
    masked = {**batch, "attention_mask": torch.ones_like(batch["input_ids"])}
    torch.testing.assert_close(obj.loss(model, batch).loss, obj.loss(model, masked).loss)


def test_bad_setups_give_one_clear_error():
    with pytest.raises(LMForgeError, match="style 'span' needs <extra_id_N> sentinel tokens"):
        objective("t5", tokenizer("bart"), model=TINY_SEQ2SEQ)
    with pytest.raises(
        LMForgeError, match="objective 't5': 341 noise spans per sequence but the tokenizer has 100 sentinels"
    ):
        t5(seq_len=2048, noise_density=0.5, mean_span_length=3.0)
    with pytest.raises(LMForgeError, match=r"objective.noise_density must be in \(0, 1\), got 1.0"):
        t5(noise_density=1.0)
    with pytest.raises(LMForgeError, match="expected one of 'span'"):
        t5(style="spans")


def test_overfits_one_batch():
    tok = tokenizer(*T5_TOK)
    obj = t5(seq_len=32)
    torch.manual_seed(0)
    batch = obj.transform(windows(tok, 8, 32))
    torch.manual_seed(0)
    model = Transformer(obj.cfg.model)
    losses = overfit(obj, model, batch, steps=50, lr=1e-2)
    assert losses[0] > 5.0  # ln(400) ≈ 6.0 at init
    assert losses[-1] < 0.25 * losses[0]


def test_recipe_trains_through_the_cli(tmp_path):
    train_recipe(
        tmp_path, "t5", "--model.preset=t5-tiny", "--model.dropout=0.0", "--train.seq_len=64", "--train.lr=1e-2"
    )
