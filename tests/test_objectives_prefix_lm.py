"""Prefix LM for decoders: split statistics, labels only on the continuation, no target leaks through the
bidirectional prefix, fixed validation noise, an overfit run and the recipe through the CLI."""

import pytest
import torch
from lm_objective_testing import (
    TINY_DECODER,
    TINY_SEQ2SEQ,
    objective,
    overfit,
    run_cli,
    tokenizer,
    train_recipe,
    windows,
)

from lmforge.errors import LMForgeError
from lmforge.models import Transformer

PREFIX_DECODER = {**TINY_DECODER, "mask": "prefix"}


def prefix_lm(seq_len: int = 64, **options):
    return objective("prefix_lm", tokenizer("gpt"), model=PREFIX_DECODER, seq_len=seq_len, **options)


def test_split_is_uniform_and_only_the_continuation_is_scored():
    obj = prefix_lm()
    torch.manual_seed(0)
    tokens = torch.randint(0, 300, (20_000, 65))
    batch = obj.transform(tokens)
    k = batch["prefix_len"]
    assert int(k.min()) == 1 and int(k.max()) == 63  # one prefix token at least, one scored token at least
    counts = torch.bincount(k, minlength=64)[1:64].float() / len(k)
    assert bool(((counts - 1 / 63).abs() < 0.005).all())  # uniform over 1..63
    labels = batch["labels"]
    i = torch.arange(64)[None, :]
    scored = i >= k[:, None] - 1  # position i predicts token i + 1, a continuation token when i + 1 >= k
    assert torch.equal(labels == -100, ~scored)
    assert torch.equal(labels[scored], tokens[:, 1:][scored])
    assert torch.equal(batch["input_ids"], tokens[:, :-1])


def test_prefix_fraction_bounds():
    obj = prefix_lm(min_prefix=0.25, max_prefix=0.5)
    torch.manual_seed(1)
    k = obj.transform(torch.randint(0, 300, (5000, 65)))["prefix_len"]
    assert int(k.min()) == 16 and int(k.max()) == 32


def test_no_scored_position_sees_its_target():
    torch.manual_seed(2)
    obj = prefix_lm(seq_len=16)
    model = Transformer(obj.cfg.model).eval()
    tokens = torch.randint(0, 300, (1, 17))
    batch = obj.transform(tokens)
    k = int(batch["prefix_len"][0])
    assert 2 <= k <= 14, k  # this seed gives a split with both kinds of positions
    base = model(batch["input_ids"], prefix_len=batch["prefix_len"]).logits[0]
    for i in range(15):
        changed = batch["input_ids"].clone()
        changed[0, i + 1] = (changed[0, i + 1] + 1) % 300  # the token position i would predict
        logits = model(changed, prefix_len=batch["prefix_len"]).logits[0]
        sees_target = not torch.allclose(logits[i], base[i])
        # Inside the prefix a position sees the next token (so it is not scored); scored positions never do.
        assert sees_target == (i + 1 < k)
        assert sees_target == (batch["labels"][0, i] == -100)


def test_validation_noise_is_fixed_and_leaves_training_randomness_alone():
    obj = prefix_lm()
    tokens = torch.randint(0, 300, (8, 65))
    torch.manual_seed(3)
    a = obj.eval_transform(tokens)
    after_eval = torch.rand(1)
    torch.manual_seed(3)
    b = obj.eval_transform(tokens)
    assert torch.equal(a["prefix_len"], b["prefix_len"]) and torch.equal(a["labels"], b["labels"])
    torch.manual_seed(3)
    assert torch.equal(torch.rand(1), after_eval)  # evaluation did not consume the global RNG
    other = obj.eval_transform(torch.randint(0, 300, (8, 65)))
    assert not torch.equal(other["prefix_len"], a["prefix_len"])


def test_bad_setups_give_one_clear_error():
    tok = tokenizer("gpt")
    with pytest.raises(LMForgeError, match="needs a decoder with a prefix-visible mask: set --model.mask=prefix"):
        objective("prefix_lm", tok, model=TINY_DECODER)
    with pytest.raises(LMForgeError, match="objective t5 and objective.style=prefix_lm"):
        objective("prefix_lm", tok, model=TINY_SEQ2SEQ)
    with pytest.raises(LMForgeError, match="min <= max"):
        prefix_lm(min_prefix=0.6, max_prefix=0.4)


def test_overfits_one_batch():
    tok = tokenizer("gpt")
    obj = prefix_lm(seq_len=32)
    torch.manual_seed(0)
    batch = obj.transform(windows(tok, 8, 32))
    torch.manual_seed(0)
    losses = overfit(obj, Transformer(obj.cfg.model), batch, steps=40, lr=1e-2)
    assert losses[0] > 5.0
    assert losses[-1] < 0.25 * losses[0]


def test_recipe_trains_and_generates_through_the_cli(tmp_path):
    run = train_recipe(
        tmp_path, "prefix-lm", "--model.preset=gpt-tiny", "--train.seq_len=64", "--train.lr=3e-3",
        "--sample.max_new_tokens=5",
    )  # fmt: skip
    gen = run_cli("generate", str(run), "--prompt", "The", "--max-new-tokens", "8", "--seed", "0", cwd=tmp_path)
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.startswith("The") and len(gen.stdout.strip()) > 3
