"""The relative-order probe (Wang & Chen 2020 §3.1: is token i before token j, from the pair's representations) and
the probes on every family, Transformer-XL and XLNet included (their block loop bypasses the blocks' forward)."""

from __future__ import annotations

import pytest
import torch

from lmforge.cli import main
from lmforge.errors import LMForgeError
from lmforge.eval.position_probe import (
    first_block_states,
    pair_classifier,
    position_probe,
    relative_order_probe,
)
from lmforge.models import Transformer, get_preset
from lmforge.models.positions import sinusoidal_table
from lmforge.registry import EVALS

FAMILIES = [
    "gpt-tiny", "llama-tiny", "prefix-lm-tiny", "transformer-xl-tiny", "bert-tiny", "albert-tiny", "xlnet-tiny",
    "electra-tiny", "unilm-tiny", "t5-tiny", "bart-tiny", "transformer-shaw-tiny",
]  # fmt: skip


def tiny(name: str = "bert-tiny", **kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(get_preset(name, **kw))


@pytest.mark.parametrize("name", FAMILIES)
def test_both_probes_run_on_every_family(name: str) -> None:
    model = tiny(name)
    absolute = position_probe(model, n_positions=32)
    assert absolute["n_positions"] == 32 and absolute["n_test"] == 6 and absolute["baseline_mae"] > 0
    rel = relative_order_probe(model, n_positions=32, n_sequences=16, pairs_per_sequence=32)
    assert (rel["n_train"], rel["n_test"]) == (12 * 32, 4 * 32)
    assert 0 <= rel["accuracy"] <= 1 and 0.3 < rel["chance"] < 0.7
    assert model.training  # both probes put train mode back


@pytest.mark.parametrize("name", ["transformer-xl-tiny", "xlnet-tiny"])
def test_recurrent_stacks_give_the_first_block_output(name: str) -> None:
    """The states are the second block's input: a one-layer copy of the model (no final norm to strip: XL and
    XLNet are post-LN) gives them as its output, through its own forward."""
    model = tiny(name, dropout=0.0)
    assert not model.config.final_norm
    one = Transformer(get_preset(name, dropout=0.0, n_layers=1)).eval()
    missing, _ = one.load_state_dict(model.state_dict(), strict=False)
    assert missing == []
    ids = torch.randint(0, 512, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = one(ids).last_hidden_state if model.config.is_decoder else one.encode(ids)
    torch.testing.assert_close(first_block_states(model, ids, batch_size=2), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["transformer-xl-tiny", "xlnet-tiny"])
def test_cli_probe_on_recurrent_models_prints_both_probes(name: str, capsys) -> None:
    """Before the fix: `internal error: IndexError` (the capture hook on blocks[0] never ran)."""
    assert main(["probe", name, "--n-positions", "24"]) == 0
    out = capsys.readouterr().out
    assert f"position probe on {name}: " in out and "24 positions, dim 64" in out and "held-out MAE" in out
    assert "relative-order probe (is token i before token j?)" in out and "(xl positions), concat of the pair" in out
    assert "3,072 train / 1,024 held-out pairs from 64 random sequences" in out  # 48 and 16 sequences of 64 pairs
    assert "held-out accuracy 0." in out and "(chance 0." in out


def test_learned_positions_give_order_far_above_chance_and_a_bag_of_tokens_gives_chance() -> None:
    """A bidirectional encoder with learned absolute positions vs the same encoder with none: without positions
    the first block's h_i and h_j are exchangeable (a function of the token and of the bag of tokens), so no probe
    can beat chance on held-out sequences; with them, the order is linearly decodable."""
    random_table = relative_order_probe(tiny(position="learned"), n_positions=32)
    assert random_table["accuracy"] > 0.7  # measured 0.81: 32 random rows in 64 dims are linearly independent
    smooth = tiny(position="learned")
    with torch.no_grad():  # a table as smooth in position as trained ones are
        smooth.encoder.pos_emb.emb.weight.copy_(sinusoidal_table(128, 64))
    for features in ("concat", "diff"):
        assert relative_order_probe(smooth, features=features)["accuracy"] > 0.9  # measured 0.96, 0.97
    bag = tiny(position="none")
    for seed in range(3):
        for n in (32, 128):
            r = relative_order_probe(bag, n_positions=n, seed=seed)
            assert abs(r["accuracy"] - 0.5) < 0.06, (seed, n, r)
            assert abs(r["chance"] - 0.5) < 0.06


def test_pair_classifier_on_known_data_and_bad_input() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 5, generator=g)
    labels = x @ torch.tensor([1.0, -2.0, 0.5, 0.0, 0.0]) > 0.3
    train = torch.arange(400) < 300
    assert pair_classifier(x, labels, train)["accuracy"] > 0.95
    noise = pair_classifier(x, torch.rand(400, generator=g) > 0.5, train)
    assert abs(noise["accuracy"] - 0.5) < 0.12 and noise["n_test"] == 100
    with pytest.raises(LMForgeError, match=r"needs >= 2 train and >= 2 held-out pairs \(got 1 and 399\)"):
        pair_classifier(x, labels, torch.arange(400) < 1)
    model = tiny()
    with pytest.raises(LMForgeError, match="pair features must be 'concat' or 'diff', got 'sum'"):
        relative_order_probe(model, features="sum")  # type: ignore[arg-type]
    with pytest.raises(LMForgeError, match="n_positions=129 exceeds the learned table's max_seq_len 128"):
        relative_order_probe(model, n_positions=129)
    with pytest.raises(LMForgeError, match=r"needs train and held-out sequences \(n_sequences=1"):
        relative_order_probe(model, n_sequences=1)
    assert EVALS.get("relative_order_probe") is relative_order_probe


def test_cli_bad_pair_features_exit_non_zero(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["probe", "bert-tiny", "--pair-features", "sum"])
    assert e.value.code != 0
    assert "invalid choice: 'sum'" in capsys.readouterr().err
