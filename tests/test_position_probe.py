"""Position probe: sinusoids decode exactly, random tables do not; representations come from the right place."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lmforge.errors import LMForgeError
from lmforge.eval.position_probe import cmd_probe, linear_probe, position_probe, position_representations
from lmforge.models import ModelConfig, Transformer, get_preset
from lmforge.models.positions import sinusoidal_table
from lmforge.registry import EVALS


def tiny(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(get_preset("gpt-tiny", **{"max_seq_len": 512, **kw}))


def test_sinusoidal_positions_decode_to_within_a_thousandth_of_a_position() -> None:
    r = position_probe(tiny(position="sinusoidal"))  # 512 positions, d_model 64
    assert (r["n_positions"], r["dim"], r["n_train"], r["n_test"]) == (512, 64, 410, 102)
    assert r["mae"] < 1e-3  # measured ~2e-6: the lowest frequencies are nearly linear in position
    assert r["r2"] > 0.999999
    assert 100 < r["baseline_mae"] < 160  # predicting the mean is off by ~n/4


def test_random_learned_positions_decode_no_better_than_the_mean() -> None:
    r = position_probe(tiny(position="learned"))
    assert r["source"] == "decoder learned position table"
    assert r["mae"] > 0.8 * r["baseline_mae"] > 80
    assert r["r2"] < 0.2


def test_learned_table_rows_start_at_the_position_offset() -> None:
    cfg = ModelConfig(arch="encoder-decoder", vocab_size=50, d_model=32, n_layers=1, n_heads=4, d_ff=64,
                      max_seq_len=40, position="learned", position_offset=2)  # fmt: skip
    model = Transformer(cfg)
    reps, source = position_representations(model, n_positions=30)
    assert source == "encoder learned position table"
    assert torch.equal(reps, model.encoder.pos_emb.emb.weight[2:32].detach())
    with pytest.raises(LMForgeError, match="n_positions=41 exceeds the learned table's max_seq_len 40"):
        position_representations(model, n_positions=41)


def test_a_linear_table_is_decoded_exactly_and_a_shuffled_one_is_not() -> None:
    model = tiny(position="learned", max_seq_len=256)
    with torch.no_grad():
        model.decoder.pos_emb.emb.weight.copy_(sinusoidal_table(256, 64))
    assert position_probe(model)["mae"] < 1e-3
    with torch.no_grad():
        model.decoder.pos_emb.emb.weight.copy_(sinusoidal_table(256, 64)[torch.randperm(256)])
    assert position_probe(model)["mae"] > 30


def test_relative_models_use_the_first_block_output_averaged_over_random_inputs() -> None:
    model = tiny(position="rope", n_layers=2, max_seq_len=64)
    reps, source = position_representations(model, n_samples=4, seed=7)
    assert source == "decoder first-block hidden states (rope positions, 4 random inputs)"
    # The same computation by hand: a one-layer copy without final norm outputs exactly the first block.
    one = Transformer(dataclasses.replace(model.config, n_layers=1, final_norm=False)).eval()
    missing, _ = one.load_state_dict(model.state_dict(), strict=False)
    assert missing == []
    ids = torch.randint(0, model.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = one(ids).last_hidden_state.mean(0)
    torch.testing.assert_close(reps, expected, atol=1e-5, rtol=0)
    assert model.training  # the probe restores train mode
    r = position_probe(model)
    assert r["n_positions"] == 64 and 0 <= r["mae"] and r["n_test"] == 13


def test_linear_probe_on_known_data_and_bad_splits() -> None:
    x = torch.linspace(0, 1, 50)[:, None]
    g = torch.Generator().manual_seed(0)
    r = linear_probe(torch.cat([x, torch.randn(50, 3, generator=g)], 1), 3 * torch.linspace(0, 1, 50) + 2)
    assert r["mae"] < 1e-6 and r["r2"] == pytest.approx(1.0)
    noise = linear_probe(torch.randn(200, 2, generator=g), torch.arange(200))
    assert noise["r2"] < 0.1 and noise["mae"] > 0.9 * noise["baseline_mae"]
    with pytest.raises(LMForgeError, match=r"needs >= 2 train and >= 2 held-out positions \(n=5, train_frac=0.8\)"):
        linear_probe(torch.randn(5, 2), torch.arange(5))
    with pytest.raises(LMForgeError, match="train_frac=1.0"):
        linear_probe(torch.randn(50, 2), torch.arange(50), train_frac=1.0)


def test_cmd_probe_on_a_checkpoint_and_a_preset(tmp_path, capsys) -> None:
    from lmforge.checkpoint.write import save_checkpoint

    model = tiny(position="learned", max_seq_len=128)
    with torch.no_grad():
        model.decoder.pos_emb.emb.weight.copy_(sinusoidal_table(128, 64))
    save_checkpoint(tmp_path, 1, model, config={"model": dataclasses.asdict(model.config)})
    r = cmd_probe(str(tmp_path))
    assert r["model"] == str(tmp_path) and r["n_positions"] == 128 and r["mae"] < 1e-3
    out = capsys.readouterr().out
    assert "decoder learned position table, 128 positions, dim 64" in out and "held-out MAE 0.00 positions" in out
    r = cmd_probe("gpt-tiny")  # random init: nothing to decode
    assert r["n_positions"] == 128 and r["mae"] > 0.8 * r["baseline_mae"]
    assert EVALS.get("position_probe") is position_probe


def test_cmd_probe_unknown_name() -> None:
    with pytest.raises(
        LMForgeError, match="'gpt-tinny' is neither a checkpoint path nor a model preset — did you mean"
    ):
        cmd_probe("gpt-tinny")
