"""Every family of bench/train_parity.py, its reference side included, trains two steps at test size on the CPU:
a batch key the reference loss reads but the objective no longer writes (T5's attention_mask, dropped from
unpadded span-corruption batches) stops the harness here, not on the GPU machine."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import train_parity as tp  # noqa: E402

TINY = ["train.seq_len=32", "train.batch_size=4", "model.max_seq_len=64"]
CHECKOUT_REFS = {"nanogpt", "nanot5"}
"""References imported from a local checkout, which a test machine does not have."""


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """One output dir for the module: families with the same tokenizer share its prepared data."""
    return tmp_path_factory.mktemp("parity")


@pytest.mark.parametrize("family", sorted(tp.FAMILIES))
def test_every_family_trains_on_both_sides(family, parity_corpus, out):
    refs = [r for r in tp.FAMILIES[family].refs if r not in CHECKOUT_REFS]
    assert refs, f"{family} has no reference that runs without a checkout"
    impls = ["lmforge", *refs]
    args = ["--family", family, "--impls", *impls, "--size", "tiny", "--data-inputs", str(parity_corpus),
            "--seeds", "0",
            "--out", str(out), "--steps", "2", "--eval-every", "2", "--val-batches", "1", "--device", "cpu",
            "--set", *TINY]  # fmt: skip
    assert tp.main(args) == 0
    runs = {i: json.loads((out / f"{family}-{i}-seed0.json").read_text()) for i in impls}
    lm = runs["lmforge"]
    for impl, r in runs.items():
        assert [s for s, _ in r["val"]] == [0, 2], impl
        assert all(math.isfinite(v) for _, v in r["val"]) and len(r["train_loss"]) == 2, impl
        assert all(math.isfinite(v) for v in r["train_loss"]) and r["skipped_steps"] == 0, impl
        assert r["batch_hash"] == lm["batch_hash"] and r["val_hash"] == lm["val_hash"], impl
        assert r["n_weights"] == lm["n_weights"], impl
    assert runs[refs[0]]["model_class"] != lm["model_class"]  # the reference is not lmforge's model


@pytest.mark.parametrize(
    ("preset", "overrides", "message"),
    [
        ("t5-tiny", {"attn_dropout": 0.0}, "the t5 twin drops at every site with one rate (dropout_rate)"),
        ("t5-tiny", {"dropout_final_norm": False}, "the t5 twin drops at every site with one rate (dropout_rate)"),
        ("gpt-tiny", {"dropout": 0.1, "dropout_ffn_hidden": True}, "the gpt2 twin drops neither the FFN hidden"),
    ],
)
def test_a_twin_refuses_dropout_its_config_cannot_express(preset, overrides, message):
    from parity_refs import hf_config

    from lmforge.errors import LMForgeError
    from lmforge.models import Transformer, get_preset

    with pytest.raises(LMForgeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        hf_config(get_preset(preset, **overrides), Transformer(get_preset(preset)).state_dict())
    config, _ = hf_config(get_preset(preset), Transformer(get_preset(preset)).state_dict())  # the preset itself
    assert config.model_type == ("t5" if preset.startswith("t5") else "gpt2")
