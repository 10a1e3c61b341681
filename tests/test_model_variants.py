"""Config variants across families: prefix-LM mask, position encodings, and every ModelConfig field's effect."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_testing import V

from lmforge.errors import LMForgeError
from lmforge.models import ModelConfig, Transformer, get_preset


def _model(name: str, seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(get_preset(name, vocab_size=V, **kw)).eval()


# ------------------------------------------------------------------------------------------------- prefix LM


def test_prefix_lm_prefix_is_bidirectional_and_the_rest_causal():
    model = _model("prefix-lm-tiny")
    x = torch.randint(0, V, (2, 16))
    prefix = torch.tensor([6, 10])
    with torch.no_grad():
        base = model(x, prefix_len=prefix).logits
        # Change the last prefix token of each row: every prefix position sees it, so all of them change.
        y = x.clone()
        y[0, 5], y[1, 9] = (x[0, 5] + 1) % V, (x[1, 9] + 1) % V
        changed = model(y, prefix_len=prefix).logits
        assert (changed[0, :5] - base[0, :5]).abs().amax(-1).min() > 1e-4
        assert (changed[1, :9] - base[1, :9]).abs().amax(-1).min() > 1e-4
        # Change a token after the prefix: no earlier position may depend on it.
        z = x.clone()
        z[:, 12] = (x[:, 12] + 1) % V
        after = model(z, prefix_len=prefix).logits
    torch.testing.assert_close(after[:, :12], base[:, :12], atol=1e-6, rtol=0)
    assert (after[:, 12:] - base[:, 12:]).abs().max() > 1e-4


def test_prefix_len_zero_is_a_causal_lm_and_an_int_is_accepted():
    model = _model("prefix-lm-tiny")
    causal = _model("prefix-lm-tiny", mask="causal")
    x = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(x, prefix_len=0).logits, causal(x).logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(
            model(x, prefix_len=5).logits, model(x, prefix_len=torch.tensor([5, 5])).logits, atol=0, rtol=0
        )


def test_prefix_lm_kv_cache_decoding_equals_full_forward():
    model = _model("prefix-lm-tiny")
    x = torch.randint(0, V, (2, 14))
    prefix = torch.tensor([5, 5])
    with torch.no_grad():
        full = model(x, prefix_len=prefix).logits
        out = model(x[:, :5], prefix_len=prefix, use_cache=True)
        steps = [out.logits] + [model(x[:, t : t + 1], cache=out.cache).logits for t in range(5, 14)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_prefix_lm_without_prefix_len_is_an_error():
    with pytest.raises(LMForgeError, match="needs prefix_len"):
        _model("prefix-lm-tiny")(torch.zeros(1, 4, dtype=torch.long))


# ------------------------------------------------------------------------------------------------- positions


@pytest.mark.parametrize("position", ["sinusoidal", "rope", "alibi", "t5_bias", "shaw", "none"])
def test_decoder_runs_past_max_seq_len(position):
    model = _model("gpt-tiny", position=position, max_seq_len=16, rel_buckets=8, rel_max_distance=12)
    x = torch.randint(0, V, (2, 40))  # 2.5 x max_seq_len
    with torch.no_grad():
        full = model(x).logits
        # Causal: the first 16 positions do not see the rest.
        torch.testing.assert_close(full[:, :16], model(x[:, :16]).logits, atol=1e-5, rtol=0)
        out = model(x[:, :10], use_cache=True)
        steps = [out.logits] + [model(x[:, t : t + 1], cache=out.cache).logits for t in range(10, 40)]
    assert torch.isfinite(full).all()
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_learned_positions_stop_at_max_seq_len_also_when_decoding_with_a_cache():
    model = _model("gpt-tiny", max_seq_len=8)
    with pytest.raises(LMForgeError) as err:
        model(torch.zeros(1, 10, dtype=torch.long))
    assert str(err.value) == "sequence of length 10 exceeds max_seq_len 8 for learned positions"
    out = model(torch.zeros(1, 8, dtype=torch.long), use_cache=True)
    with pytest.raises(LMForgeError, match="^sequence of length 9 exceeds max_seq_len 8 for learned positions$"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=out.cache)
    enc = _model("bert-tiny", max_seq_len=8)
    with pytest.raises(LMForgeError, match="length 9 exceeds max_seq_len 8"):
        enc(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rope", "alibi", "t5_bias", "shaw", "none"])
def test_encoder_position_encodings_break_permutation_equivariance(position):
    """Without positions self-attention is permutation-equivariant; every encoding must break that."""
    # init_std 0.3: sharp attention, so positions visibly change which tokens a query attends to.
    model = _model("bert-tiny", position=position, type_vocab_size=0, init_std=0.3)
    x = torch.randint(0, V, (1, 12))
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = model(x).last_hidden_state[:, perm], model(x[:, perm]).last_hidden_state
    if position == "none":
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    else:
        assert (a - b).abs().max() > 1e-3


@pytest.mark.parametrize("position", ["rope", "alibi", "sinusoidal"])
def test_encoder_decoder_with_other_positions_decodes_with_cache(position):
    model = _model("t5-tiny", position=position)
    x, y = torch.randint(0, V, (2, 9)), torch.randint(0, V, (2, 7))
    with torch.no_grad():
        full = model(x, decoder_input_ids=y).logits
        enc = model.encode(x)
        out = model(x, decoder_input_ids=y[:, :2], encoder_hidden_states=enc, use_cache=True)
        steps = [out.logits]
        for t in range(2, 7):
            steps.append(model(x, decoder_input_ids=y[:, t : t + 1], encoder_hidden_states=enc, cache=out.cache).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------- every field matters

# (field, preset to start from, new value). Each change must change the parameter shapes or the outputs.
FIELD_CHANGES = [
    ("arch", "gpt-tiny", "encoder"),
    ("vocab_size", "gpt-tiny", 301),
    ("d_model", "gpt-tiny", 32),
    ("n_layers", "gpt-tiny", 3),
    ("n_decoder_layers", "bart-tiny", 3),
    ("n_heads", "gpt-tiny", 2),
    ("n_kv_heads", "llama-tiny", 4),
    ("head_dim", "t5-tiny", 16),
    ("d_ff", "gpt-tiny", 128),
    ("max_seq_len", "gpt-tiny", 64),
    ("norm", "gpt-tiny", "rmsnorm"),
    ("norm_eps", "gpt-tiny", 10.0),
    ("norm_position", "gpt-tiny", "post"),
    ("final_norm", "gpt-tiny", False),
    ("embedding_norm", "gpt-tiny", True),
    ("activation", "gpt-tiny", "relu"),
    ("qk_norm", "gpt-tiny", True),
    ("logit_softcap", "gpt-tiny", 1.0),
    ("zero_init_proj", "gpt-tiny", True),
    ("position", "gpt-tiny", "alibi"),
    ("position_offset", "gpt-tiny", 2),
    ("rope_base", "llama-tiny", 100.0),
    ("rel_buckets", "t5-tiny", 16),
    ("rel_max_distance", "t5-tiny", 40),
    ("shaw_values", "transformer-shaw-tiny", False),
    ("attn_pattern", "gpt3-tiny", "dense"),
    ("attn_band", "gpt3-tiny", 8),
    ("attn_stride", "sparse-strided-tiny", 4),
    ("attn_fixed_c", "sparse-fixed-tiny", 8),
    ("attn_sparse_every", "gpt3-tiny", 1),
    ("attn_factorize", "sparse-fixed-tiny", "interleaved"),
    ("bias", "gpt-tiny", False),
    ("attn_bias", "gpt-tiny", False),
    ("clamp_len", "transformer-xl-tiny", 3),
    ("rel_segments", "transformer-xl-tiny", True),
    ("two_stream", "transformer-xl-tiny", True),
    ("tie_embeddings", "gpt-tiny", False),
    ("mask", "gpt-tiny", "prefix"),
    ("type_vocab_size", "gpt-tiny", 2),
    ("embedding_dim", "bert-tiny", 16),
    ("share_layers", "gpt-tiny", True),
    ("share_encoder_decoder", "t5-tiny", True),
    ("scale_embeddings", "gpt-tiny", True),
    ("scale_attention", "gpt-tiny", False),
    ("lm_head", "gpt-tiny", False),
    ("lm_head_transform", "gpt-tiny", True),
    ("lm_head_bias", "gpt-tiny", True),
    ("scale_tied_logits", "gpt-tiny", True),
    ("pooler", "gpt-tiny", True),
    ("rtd_head", "gpt-tiny", True),
    ("nsp_head", "bert-tiny", False),
    ("mtp_heads", "gpt-tiny", 2),
    ("mtp_sequential", "gpt-mtp-tiny", True),
    ("mtp_head", "gpt-mtp-tiny", "linear"),
    ("dropout", "gpt-tiny", 0.5),
    ("attn_dropout", "gpt-tiny", 0.5),
    ("dropout_ffn_hidden", "t5-tiny", False),
    ("dropout_final_norm", "t5-tiny", False),
    ("init_std", "gpt-tiny", 0.05),
    ("init_scheme", "gpt-tiny", "normal"),
    ("zero_pad_embedding", "bert-tiny", False),
]
# Fields that do not change what the model computes; each is checked by the named test instead.
METADATA_FIELDS = {
    "name": "test_presets_are_registered_under_their_name (test_model_presets.py)",
    "pad_id": "test_token_ids_travel_through_export (test_hf_convert.py)",
    "decoder_start_id": "test_token_ids_travel_through_export (test_hf_convert.py)",
    "mem_len": "test_model_mem_len_is_the_default_and_zero_returns_none (test_model_xl.py)",
}


def _outputs(model: Transformer, train: bool) -> list[torch.Tensor]:
    cfg = model.config
    x = torch.randint(1, 300, (2, 40), generator=torch.Generator().manual_seed(0))
    kw = {"decoder_input_ids": x[:, :9]} if cfg.arch == "encoder-decoder" else {}
    if cfg.arch == "decoder":
        kw["prefix_len"] = torch.tensor([20, 20])
    torch.manual_seed(1)  # the same dropout masks for both models
    out = model.train(train)(x, **kw)
    return [t.detach() for t in (out.last_hidden_state, out.logits, out.pooled, out.rtd_logits) if t is not None]


@pytest.mark.parametrize("field,preset,value", FIELD_CHANGES, ids=[c[0] for c in FIELD_CHANGES])
def test_every_field_changes_the_model(field, preset, value):
    """A changed field changes the tensors the model holds, or, with identical weights, what it computes."""
    base_cfg = get_preset(preset, vocab_size=V)
    assert getattr(base_cfg, field) != value
    torch.manual_seed(0)
    base = Transformer(base_cfg)
    torch.manual_seed(0)
    changed = Transformer(dataclasses.replace(base_cfg, **{field: value}))
    a, b = base.state_dict(), changed.state_dict()
    if field == "init_std":
        assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
        assert b["tok_emb.weight"].std() > 2 * a["tok_emb.weight"].std()
        return
    if field == "zero_init_proj":  # an initialisation: the residual projections start at zero
        for k in ("decoder.blocks.0.attn.o.weight", "decoder.blocks.1.mlp.down.weight"):
            assert b[k].abs().max() == 0 < a[k].abs().max()
        return
    if field == "init_scheme":  # GPT-2's residual rescale (1/sqrt(2 n_layers) = 1/2 here) goes
        for k in ("decoder.blocks.0.attn.o.weight", "decoder.blocks.1.mlp.down.weight"):
            assert 1.7 < float(b[k].std() / a[k].std()) < 2.3
        return
    if field == "zero_pad_embedding":  # the [PAD] row starts at zero only with the field on
        pad = base_cfg.pad_id
        assert a["tok_emb.weight"][pad].abs().max() == 0 < b["tok_emb.weight"][pad].abs().max()
        return
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a) or base.num_params() != changed.num_params():
        return
    changed.load_state_dict(a)
    train = "dropout" in field
    x, y = _outputs(base, train), _outputs(changed, train)
    assert len(x) != len(y) or any((p - q).abs().max() > 1e-5 for p, q in zip(x, y))


def test_field_table_covers_every_config_field():
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    assert {c[0] for c in FIELD_CHANGES} | set(METADATA_FIELDS) == fields


# ----------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(mask="prefix"), "model.mask='prefix' applies to decoder-only models, not arch 'encoder-decoder'"),
        (dict(share_encoder_decoder=True, n_decoder_layers=3), "needs as many decoder layers as encoder layers"),
        (dict(n_kv_heads=3), "model.n_heads=4 is not a multiple of model.n_kv_heads=3"),
        (dict(embedding_dim=0), "model.embedding_dim must be positive or null, got 0"),
        (dict(position_offset=-1), "model.position_offset must be >= 0, got -1"),
    ],
)
def test_inconsistent_configs_are_one_line_errors(overrides, message):
    with pytest.raises(LMForgeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Transformer(get_preset("t5-tiny", **overrides))


def test_share_encoder_decoder_needs_an_encoder_decoder():
    with pytest.raises(LMForgeError, match="^model.share_encoder_decoder needs arch 'encoder-decoder'$"):
        Transformer(get_preset("gpt-tiny", share_encoder_decoder=True))
