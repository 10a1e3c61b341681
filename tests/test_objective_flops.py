"""Training FLOPs of a pretraining window per objective (`Objective.window_flops`): the encoder and decoder lengths
each T5 style really produces, masked LMs' head on the masked share only, ELECTRA's generator counted, and the MFU
of a pretraining run counted per window token."""

import pytest
import torch
from lm_objective_testing import TINY_SEQ2SEQ, objective, tokenizer

from lmforge.config import RECIPES_DIR
from lmforge.models.flops import lm_head_weights, matmul_weights, training_flops
from lmforge.objectives import OBJECTIVES
from lmforge.objectives.electra import generator_config
from lmforge.pretraining.config import load_config

T5_TOK = ("t5", "unigram", 400)
STYLES = ["span", "iid", "bert", "mass", "drop", "deshuffle", "prefix_lm", "lm"]


@pytest.mark.parametrize("style", STYLES)
def test_t5_lengths_match_the_batches_each_style_makes(style):
    """The expected (encoder, decoder) lengths are the mean real lengths of 400 corrupted windows (EOS included)."""
    torch.manual_seed(0)
    obj = objective("t5", tokenizer(*T5_TOK), model=TINY_SEQ2SEQ, seq_len=64, style=style, noise_density=0.15)
    batch = obj.transform(torch.randint(10, 250, (400, 65)))
    src_mask = batch.get("attention_mask", torch.ones_like(batch["input_ids"]))  # absent: no row is padded
    src = src_mask.sum(1).float().mean().item()
    tgt = (batch["labels"] != -100).sum(1).float().mean().item()
    want_src, want_tgt = obj.lengths(obj.options, 64)
    assert src == pytest.approx(want_src, abs=1.0) and tgt == pytest.approx(want_tgt, abs=1.0)


def test_t5_window_flops_follow_the_lengths():
    cfg = load_config("t5", {"model": {"preset": "t5-tiny"}, "train": {"seq_len": 100}, "objective": {"style": "drop"}})
    t5 = OBJECTIVES.get("t5")
    assert t5.lengths(cfg.objective.options, 100) == (86, 16)  # 15 corrupted tokens out, into the target; EOS each
    assert t5.window_flops(cfg) == training_flops(cfg.model, 86, 16)
    cfg.objective.options.style = "deshuffle"  # the whole window both ways: more compute per window than span
    assert t5.window_flops(cfg) == training_flops(cfg.model, 101, 101)


def test_masked_lm_counts_its_head_on_the_masked_share_only():
    cfg = load_config("roberta", {"model": {"preset": "roberta-tiny"}, "train": {"seq_len": 64}})
    full = training_flops(cfg.model, 64)
    head = lm_head_weights(cfg.model)
    assert head == matmul_weights(cfg.model).head > 0  # roberta-tiny: transform + vocabulary projection
    assert OBJECTIVES.get("roberta").window_flops(cfg) == pytest.approx(full - 6 * head * 64 * 0.85)


def test_electra_counts_generator_and_discriminator():
    cfg = load_config("electra", {"model": {"preset": "electra-tiny"}, "train": {"seq_len": 64}})
    o = cfg.objective.options
    gen = generator_config(cfg.model, o.generator_scale, o.generator_preset)
    disc = training_flops(cfg.model, 64)  # electra-tiny's discriminator has no LM head: the RTD head only
    assert lm_head_weights(cfg.model) == 0 and matmul_weights(cfg.model).head == 64 * 64 + 64
    gen_flops = training_flops(gen, 64) - 6 * lm_head_weights(gen) * 64 * 0.85
    assert OBJECTIVES.get("electra").window_flops(cfg) == pytest.approx(disc + gen_flops)
    assert gen_flops > 0.1 * disc  # a quarter-width generator is no rounding error


def test_decoders_count_the_model_once_per_window():
    cfg = load_config("gpt", {"model": {"preset": "gpt-tiny"}, "train": {"seq_len": 64}})
    assert OBJECTIVES.get("causal_lm").window_flops(cfg) == training_flops(cfg.model, 64)


@pytest.mark.parametrize("recipe", sorted(p.stem for p in (RECIPES_DIR / "pretrain").glob("*.yaml")))
def test_every_bundled_pretraining_recipe_counts_its_window(recipe):
    """At least the stack over half the window, at most twice the whole model over the whole window both ways."""
    cfg = load_config(recipe)
    flops = OBJECTIVES.get(cfg.objective.name).window_flops(cfg)
    T = cfg.train.seq_len
    w = matmul_weights(cfg.model)
    assert 6 * (w.encoder + w.decoder) * T / 2 < flops < 2 * training_flops(cfg.model, T + 1, T + 1)
