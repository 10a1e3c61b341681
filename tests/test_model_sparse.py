"""Sparse attention (GPT-3 §2.1 banded layers, Child et al. 2019 strided / fixed patterns): the banded computation
equals dense attention under the band mask, patterns match their definitions, the alternation hits the right
layers, causality and the band hold end to end, KV-cache decoding equals the full forward, GPT-Neo parity
(the published alternating global / local model) and the GPT-3 presets."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
import transformers

from lmforge.errors import LMForgeError
from lmforge.models import ModelConfig, Transformer, get_preset
from lmforge.models.gpt3 import GPT3_SIZES, count_params, gpt3_table
from lmforge.models.hf.base import converter_of
from lmforge.models.layers import AttnInputs
from lmforge.models.sparse import band_allowed, banded_attention, factor_sets, is_sparse_layer, layer_allowed

V = 512


def _model(name: str, **kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(get_preset(name, **kw)).eval()


# ------------------------------------------------------------------------------------------ masks and kernel


@pytest.mark.parametrize(("T", "band"), [(16, 4), (33, 5), (7, 8), (40, 1), (64, 32)])
def test_banded_computation_equals_dense_attention_with_the_band_mask(T, band):
    torch.manual_seed(T)
    q, k, v = (torch.randn(2, 3, T, 8, requires_grad=True) for _ in range(3))
    y = banded_attention(q, k, v, band, scale=0.4)
    i = torch.arange(T)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=band_allowed(i, i, band), scale=0.4)
    torch.testing.assert_close(y, ref, atol=1e-6, rtol=0)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (q, k, v), g)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_banded_decoding_step_sees_the_last_band_keys():
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8)
    ok = band_allowed(torch.tensor([19]), torch.arange(20), 6)
    assert ok.nonzero()[:, 1].tolist() == list(range(14, 20))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=ok, scale=0.3)
    torch.testing.assert_close(banded_attention(q, k, v, 6, 0.3), ref, atol=1e-6, rtol=0)


def test_pattern_masks_match_their_definitions():
    T = 40
    i = torch.arange(T)
    band = band_allowed(i, i, 7)
    cfg_s = get_preset("sparse-strided-tiny", attn_stride=8)
    cfg_f = get_preset("sparse-fixed-tiny", attn_stride=8, attn_fixed_c=3)
    s1, s2 = factor_sets(cfg_s, i, i)
    f1, f2 = factor_sets(cfg_f, i, i)
    for a in range(T):
        for b in range(T):
            causal = b <= a
            assert band[a, b] == (causal and a - b < 7)  # GPT-3 local band: itself and the 6 before
            # Child et al. §4.2 strided: A1 = {t .. i} with t = max(0, i - l); A2 = {j : (i - j) mod l = 0}
            assert s1[a, b] == (causal and b >= max(0, a - 8))
            assert s2[a, b] == (causal and (a - b) % 8 == 0)
            # fixed: A1 = {j : floor(j/l) = floor(i/l)}; A2 = {j : j mod l in {l - c, ..., l - 1}} (c = 3)
            assert f1[a, b] == (causal and b // 8 == a // 8)
            assert f2[a, b] == (causal and (b % 8 >= 5 or b == a))  # and i itself: no query attends to nothing


def test_factorisations_union_interleaved_and_heads():
    i = torch.arange(24)
    base = dict(attn_stride=6, attn_fixed_c=2, n_layers=4)
    a1, a2 = factor_sets(get_preset("sparse-fixed-tiny", **base), i, i)
    union = layer_allowed(get_preset("sparse-fixed-tiny", **base), 0, i, i)
    assert torch.equal(union, (a1 | a2)[None])
    inter = get_preset("sparse-fixed-interleaved-tiny", **base)
    assert [torch.equal(layer_allowed(inter, n, i, i)[0], a1) for n in range(4)] == [True, False, True, False]
    assert [torch.equal(layer_allowed(inter, n, i, i)[0], a2) for n in range(4)] == [False, True, False, True]
    heads = layer_allowed(get_preset("sparse-fixed-tiny", attn_factorize="heads", **base), 0, i, i)
    assert heads.shape == (4, 24, 24)
    assert all(torch.equal(heads[h], a1) for h in (0, 1)) and all(torch.equal(heads[h], a2) for h in (2, 3))


@pytest.mark.parametrize(("every", "expected"), [(2, [0, 1, 0, 1, 0, 1]), (1, [1] * 6), (3, [0, 0, 1, 0, 0, 1])])
def test_which_layers_are_sparse(every, expected):
    cfg = get_preset("gpt3-tiny", n_layers=6, attn_sparse_every=every)
    assert [int(is_sparse_layer(cfg, n)) for n in range(6)] == expected
    assert not any(is_sparse_layer(get_preset("gpt-tiny"), n) for n in range(6))


# ------------------------------------------------------------------------------------------ the model


def _reference_forward(sparse: Transformer, x: torch.Tensor) -> torch.Tensor:
    """Logits of `sparse`'s weights run through a dense copy with explicit masks: the band mask in the layers that
    should be sparse, the causal mask in the others."""
    cfg = sparse.config
    dense = Transformer(dataclasses.replace(cfg, attn_pattern="dense")).eval()
    dense.load_state_dict(sparse.state_dict())
    T = x.shape[1]
    i = torch.arange(T)
    neg = torch.finfo(torch.float32).min

    def additive(ok: torch.Tensor) -> torch.Tensor:
        return torch.zeros(ok.shape).masked_fill(~ok, neg)[None]

    stack = dense.decoder
    h = stack.embed(dense.tok_emb(x), i, None)
    for n, block in enumerate(stack.blocks):
        sparse_layer = n % cfg.attn_sparse_every == cfg.attn_sparse_every - 1
        ok = layer_allowed(cfg, n, i, i) if sparse_layer else (i[None, :] <= i[:, None])[None]  # (1|H, T, T)
        h = block(h, AttnInputs(additive(ok), False, i, i, i), n)
    return dense.logits(stack.final_norm(h))


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("gpt3-tiny", dict(n_layers=4, attn_band=6)),
        ("gpt3-tiny", dict(n_layers=3, attn_band=5, attn_sparse_every=3)),
        ("sparse-strided-tiny", dict(attn_stride=5)),
        ("sparse-fixed-tiny", dict(attn_stride=8, attn_fixed_c=2)),
        ("sparse-fixed-interleaved-tiny", dict(n_layers=3, attn_stride=8, attn_fixed_c=2)),
    ],
)
def test_sparse_layers_are_the_right_ones_with_the_right_masks(name, kw):
    m = _model(name, **kw)
    x = torch.randint(0, V, (2, 29))
    with torch.no_grad():
        torch.testing.assert_close(m(x).logits, _reference_forward(m, x), atol=1e-5, rtol=0)
        dense = Transformer(get_preset(name, **{**kw, "attn_pattern": "dense"})).eval()
        dense.load_state_dict(m.state_dict())
        assert (m(x).logits - dense(x).logits).abs().max() > 1e-3  # the pattern changes the model


def test_one_banded_layer_is_causal_and_banded():
    m = _model("gpt3-tiny", n_layers=1, attn_sparse_every=1, attn_band=5)
    x = torch.randint(0, V, (1, 30))
    p = 12
    y = x.clone()
    y[0, p] = (y[0, p] + 1) % V
    with torch.no_grad():
        changed = (m(x).logits - m(y).logits)[0].abs().amax(-1) > 1e-6
    # Only the queries that see position p change: p .. p + band - 1.
    assert changed.nonzero().flatten().tolist() == list(range(p, p + 5))


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("gpt3-tiny", dict(attn_band=6)),
        ("sparse-strided-tiny", dict(attn_stride=5)),
        ("sparse-fixed-tiny", dict(attn_stride=8, attn_fixed_c=2)),
        ("sparse-fixed-interleaved-tiny", dict(attn_stride=8, attn_fixed_c=2)),
        ("gpt3-tiny", dict(attn_band=6, position="rope", n_kv_heads=2)),
    ],
)
def test_kv_cache_decoding_equals_the_full_forward(name, kw):
    m = _model(name, **kw)
    x = torch.randint(0, V, (2, 30))
    with torch.no_grad():
        full = m(x).logits
        out = m(x[:, :9], use_cache=True)  # a prompt longer than the band
        steps = [out.logits, m(x[:, 9:13], cache=out.cache).logits]  # a chunk of several tokens
        steps += [m(x[:, t : t + 1], cache=out.cache).logits for t in range(13, 30)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_padding_mask_path_equals_banded_computation_and_padding_is_ignored():
    m = _model("gpt3-tiny", attn_band=4)
    x = torch.randint(0, V, (2, 21))
    with torch.no_grad():
        banded = m(x).logits  # no mask: the blocked banded computation
        masked = m(x, torch.ones_like(x)).logits  # a padding mask: the band becomes part of one explicit mask
        torch.testing.assert_close(masked, banded, atol=1e-5, rtol=0)
        pad = torch.cat([x, torch.zeros(2, 5, dtype=torch.long)], 1)
        am = torch.cat([torch.ones_like(x), torch.zeros(2, 5, dtype=torch.long)], 1)
        torch.testing.assert_close(m(pad, am).logits[:, :21], banded, atol=1e-5, rtol=0)


def test_training_step_gradients_match_the_masked_reference():
    m = _model("gpt3-tiny", n_layers=2, attn_band=4)
    x = torch.randint(0, V, (2, 17))
    m(x).logits.square().mean().backward()
    ours = {k: p.grad.clone() for k, p in m.named_parameters()}
    m.zero_grad()
    m(x, torch.ones_like(x)).logits.square().mean().backward()  # the explicit-mask path
    for k, p in m.named_parameters():
        torch.testing.assert_close(p.grad, ours[k], atol=1e-6, rtol=1e-4)


def test_matches_gpt_neo_alternating_global_and_local_attention():
    """GPT-Neo is a public implementation of GPT-3's alternating scheme (global, local, ...; window 8 here). It has
    no attention scaling and no q/k/v biases: zero biases and model.scale_attention=false give the same model."""
    hf_cfg = transformers.GPTNeoConfig(
        vocab_size=V, max_position_embeddings=64, hidden_size=32, num_layers=4, num_heads=4, intermediate_size=128,
        attention_types=[[["global", "local"], 2]], window_size=8, embed_dropout=0.0, attention_dropout=0.0,
        resid_dropout=0.0, activation_function="gelu_new",
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.GPTNeoForCausalLM(hf_cfg).eval()
    cfg = get_preset(
        "gpt3-tiny", d_model=32, n_layers=4, n_heads=4, d_ff=128, max_seq_len=64, attn_band=8, scale_attention=False
    )
    ours = Transformer(cfg).eval()
    sd = hf.state_dict()
    new = {"tok_emb.weight": sd["transformer.wte.weight"], "decoder.pos_emb.emb.weight": sd["transformer.wpe.weight"]}
    for n in range(4):
        h, o = f"transformer.h.{n}.", f"decoder.blocks.{n}."
        a = h + "attn.attention."
        new[o + "attn.qkv.weight"] = torch.cat([sd[a + p + "_proj.weight"] for p in "qkv"])
        new[o + "attn.qkv.bias"] = torch.zeros(96)
        new[o + "attn.o.weight"], new[o + "attn.o.bias"] = sd[a + "out_proj.weight"], sd[a + "out_proj.bias"]
        for ours_n, theirs in (
            ("norm1", "ln_1"),
            ("norm2", "ln_2"),
            ("mlp.up", "mlp.c_fc"),
            ("mlp.down", "mlp.c_proj"),
        ):
            new[o + ours_n + ".weight"], new[o + ours_n + ".bias"] = (
                sd[h + theirs + ".weight"],
                sd[h + theirs + ".bias"],
            )
    new["decoder.final_norm.weight"], new["decoder.final_norm.bias"] = (
        sd["transformer.ln_f.weight"],
        sd["transformer.ln_f.bias"],
    )
    new["lm_head.weight"] = sd["lm_head.weight"]
    ours.load_state_dict(new)
    x = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(ours(x).logits, hf(x).logits, atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------------------ config and presets


def test_sparse_patterns_need_a_causal_decoder():
    with pytest.raises(LMForgeError) as err:
        get_preset("bert-tiny", attn_pattern="banded").validate()
    assert str(err.value) == "model.attn_pattern='banded' needs a causal decoder (arch 'decoder', mask 'causal')"
    with pytest.raises(LMForgeError, match="^model.attn_fixed_c=20 must be at most model.attn_stride=16$"):
        get_preset("sparse-fixed-tiny", attn_fixed_c=20).validate()
    with pytest.raises(LMForgeError, match="^model.attn_band must be positive, got 0$"):
        ModelConfig(attn_band=0).validate()


def test_sparse_models_do_not_export_as_dense_hugging_face_models():
    m = _model("gpt3-tiny")
    with pytest.raises(LMForgeError, match="has no Hugging Face equivalent"):
        converter_of(m.config, m.state_dict())
    dense = get_preset("gpt-tiny", attn_band=64)  # sparse fields without a sparse pattern change nothing
    assert converter_of(dense, Transformer(dense).state_dict()).model_type == "gpt2"


def test_gpt3_presets_follow_table_2_1():
    for row in GPT3_SIZES:
        cfg = get_preset(row.preset)
        assert (cfg.n_layers, cfg.max_seq_len, cfg.vocab_size, cfg.d_ff) == (row.n_layers, 2048, 50257, 4 * cfg.d_model)
        assert cfg.dim_head == row.d_head and cfg.n_heads * cfg.dim_head == cfg.d_model
        assert (cfg.attn_pattern, cfg.attn_sparse_every, cfg.norm_position) == ("banded", 2, "pre")
        # Table 2.1 rounds (356M is "350M", 12.9B "13.0B"): within 2%.
        assert abs(count_params(row.preset) / row.n_params - 1) < 0.02, row.preset
    small = get_preset("gpt3-small")
    assert (small.d_model, small.n_heads) == (768, 12)


def test_gpt3_table_lists_every_size():
    text = gpt3_table()
    lines = text.splitlines()
    assert lines[2].split() == [
        "preset", "model", "n_params", "preset", "params", "n_layers", "d_model", "n_heads", "d_head", "batch", "lr",
    ]  # fmt: skip
    row = next(line for line in lines if line.startswith("gpt3-175b"))
    assert row.split() == ["gpt3-175b", "GPT-3", "175B", "175.0B", "174,604,259,328", "96", "12288", "96", "128",
                           "3.2M", "6.0e-05"]  # fmt: skip
    assert sum(line.startswith("gpt3-") for line in lines) == len(GPT3_SIZES)
    assert [line.split(":")[1].strip() for line in lines if line.startswith("note:")] == ["gpt3-xl", "gpt3-13b"]
