"""Decoders beyond GPT-2: Llama (RMSNorm, SwiGLU, RoPE, grouped-query attention) and GPT-1, against transformers."""

from __future__ import annotations

import pytest
import torch
import transformers
from model_testing import V, assert_parity, padded_batch, save_hf, tiny

from lmforge.models import Transformer, get_preset
from lmforge.models.hf import import_hf, to_hf_model


@pytest.mark.parametrize("preset", ["llama-tiny", "gpt1-tiny", "gpt-tiny"])
def test_lmforge_decoder_equals_transformers(preset):
    model = tiny(preset)
    assert_parity(model, to_hf_model(model))


def test_transformers_llama_with_gqa_and_rope_theta_imports_exactly(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=80, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(cfg)
    save_hf(hf, tmp_path)
    ours = import_hf(tmp_path)
    c = ours.config
    assert (c.n_heads, c.kv_heads, c.rope_base, c.tie_embeddings, c.bias) == (8, 2, 500.0, False, False)
    assert ours.decoder.blocks[0].attn.qkv.weight.shape == (32 + 2 * 2 * 4, 32)  # q: 8 heads, k and v: 2 heads
    assert_parity(ours, hf)


def test_transformers_gpt1_imports_exactly(tmp_path):
    torch.manual_seed(0)
    hf = transformers.OpenAIGPTLMHeadModel(
        transformers.OpenAIGPTConfig(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0)
    )
    save_hf(hf, tmp_path)
    ours = import_hf(tmp_path)
    assert ours.config.norm_position == "post" and not ours.config.final_norm
    assert_parity(ours, hf)


def test_grouped_query_attention_uses_fewer_kv_parameters():
    mha = Transformer(get_preset("llama-tiny", n_kv_heads=None))
    gqa = Transformer(get_preset("llama-tiny"))  # 4 query heads share 2 key/value heads
    d, hd = 64, 16
    # Per layer, k and v projections shrink from 4 heads to 2: 2 * (4 - 2) * hd * d fewer weights.
    assert mha.num_params() - gqa.num_params() == 2 * 2 * (4 - 2) * hd * d


def test_llama_kv_cache_decoding_with_left_padding_equals_full_forward():
    model = tiny("llama-tiny")
    ids, _ = padded_batch(0, B=2, T=16)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding: positions count real tokens only
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        full = model(ids, mask, position_ids=pos).logits
        out = model(ids[:, :6], mask[:, :6], position_ids=pos[:, :6], use_cache=True)
        steps = [out.logits]
        for t in range(6, 16):
            steps.append(
                model(ids[:, t : t + 1], mask[:, : t + 1], position_ids=pos[:, t : t + 1], cache=out.cache).logits
            )
    real = mask.bool()
    torch.testing.assert_close(torch.cat(steps, 1)[real], full[real], atol=1e-5, rtol=0)


def test_llama_presets_follow_galore_sizes():
    for name, (d, layers, heads, d_ff) in {
        "llama-60m": (512, 8, 8, 1376),
        "llama-130m": (768, 12, 12, 2048),
        "llama-350m": (1024, 24, 16, 2736),
    }.items():
        cfg = get_preset(name)
        assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_ff, cfg.vocab_size) == (d, layers, heads, d_ff, 32000)
        assert (cfg.norm, cfg.activation, cfg.position, cfg.bias, cfg.tie_embeddings) == (
            "rmsnorm", "swiglu", "rope", False, False,
        )  # fmt: skip


def test_llama_3_2_presets_follow_the_published_configs():
    for name, (d, layers, heads, head_dim) in {"llama-1b": (2048, 16, 32, 64), "llama-3b": (3072, 28, 24, 128)}.items():
        cfg = get_preset(name)
        assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.dim_head, cfg.kv_heads) == (d, layers, heads, head_dim, 8)
        assert (cfg.d_ff, cfg.vocab_size, cfg.rope_base, cfg.norm_eps, cfg.tie_embeddings) == (
            8192, 128256, 500000.0, 1e-5, True,
        )  # fmt: skip
