"""Encoder-decoder family: BART and T5 (v1.0, v1.1) against transformers; cached decoding; shared stacks."""

from __future__ import annotations

import pytest
import torch
import transformers
from model_testing import ATOL, V, assert_parity, padded_batch, save_hf, tiny

from lmforge.models import Transformer, get_preset
from lmforge.models.hf import import_hf, to_hf_model


@pytest.mark.parametrize("preset", ["bart-tiny", "t5-tiny", "t5-v1_1-tiny"])
def test_lmforge_seq2seq_equals_transformers(preset):
    model = tiny(preset)
    assert_parity(model, to_hf_model(model))


def _t5_config(**kw):
    return transformers.T5Config(
        vocab_size=V, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=4,
        relative_attention_num_buckets=16, relative_attention_max_distance=24, dropout_rate=0.0, **kw,
    )  # fmt: skip


def test_transformers_bart_imports_exactly(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.BartConfig(
        vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        dropout=0.0, scale_embedding=True,
    )  # fmt: skip
    hf = transformers.BartForConditionalGeneration(cfg)
    save_hf(hf, tmp_path)
    ours = import_hf(tmp_path)
    c = ours.config
    assert (c.n_layers, c.decoder_layers, c.scale_embeddings, c.lm_head_bias, c.position_offset) == (
        2,
        3,
        True,
        True,
        2,
    )
    assert_parity(ours, hf)


def test_transformers_t5_v1_0_imports_exactly(tmp_path):
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(_t5_config())
    save_hf(hf, tmp_path)
    ours = import_hf(tmp_path)
    assert ours.config.tie_embeddings and ours.config.scale_tied_logits and ours.config.activation == "relu"
    assert ours.config.head_dim == 16 and ours.config.rel_buckets == 16 and ours.config.rel_max_distance == 24
    assert_parity(ours, hf)


def test_transformers_t5_v1_1_with_untied_head_imports_exactly(tmp_path):
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(_t5_config(feed_forward_proj="gated-gelu", tie_word_embeddings=False))
    # transformers >= 5 ties T5's head on construction whatever the config says; untie it as a v1.1 checkpoint is.
    hf.lm_head.weight = torch.nn.Parameter(torch.randn(V, 32))
    save_hf(hf, tmp_path)
    ours = import_hf(tmp_path)
    cfg = ours.config
    assert (cfg.tie_embeddings, cfg.scale_tied_logits, cfg.activation) == (False, False, "geglu")
    assert ours.lm_head.weight is not ours.tok_emb.weight
    assert_parity(ours, hf)


@pytest.mark.parametrize("preset", ["bart-tiny", "t5-tiny", "t5-v1_1-tiny", "transformer-tiny"])
def test_cached_decoding_equals_full_decoder_forward(preset):
    # float64: T5 v1.1's untied head starts at N(0, 1) (HF's init), so its logits are large enough that float32
    # rounding alone would reach the tolerance.
    model = tiny(preset).double()
    ids, mask = padded_batch(model.config.pad_id, T=12)
    dec = torch.randint(4, V, (3, 10))
    with torch.no_grad():
        full = model(ids, mask, decoder_input_ids=dec).logits
        enc = model.encode(ids, mask)
        out = model(ids, mask, decoder_input_ids=dec[:, :3], encoder_hidden_states=enc, use_cache=True)
        steps, cache = [out.logits], out.cache
        assert all(kv is not None for kv in cache.cross_kv)  # cross-attention keys/values computed once
        for t in range(3, 10):
            # Zeros instead of the encoder output: the cached cross-attention keys/values must be what is used.
            step = model(ids, mask, decoder_input_ids=dec[:, t : t + 1], encoder_hidden_states=enc * 0, cache=cache)
            steps.append(step.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    assert cache.length == 10


def test_cached_decoding_equals_transformers_generate_greedy():
    model = tiny("t5-tiny")
    hf = to_hf_model(model)
    ids, mask = padded_batch(0, T=12)
    with torch.no_grad():
        ref = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, min_new_tokens=8)
        enc = model.encode(ids, mask)
        tok = torch.full((3, 1), model.config.decoder_start_id)
        seq, cache = [tok], None
        for _ in range(8):
            out = model(ids, mask, decoder_input_ids=tok, encoder_hidden_states=enc, cache=cache, use_cache=True)
            cache, tok = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
            seq.append(tok)
    assert torch.equal(torch.cat(seq, 1), ref)


def test_t5_relative_bias_is_one_table_per_stack():
    model = tiny("t5-tiny")
    names = [n for n, _ in model.named_parameters() if "relative_attention_bias" in n]
    assert names == [
        "encoder.rel_bias.relative_attention_bias.weight",
        "decoder.rel_bias.relative_attention_bias.weight",
    ]
    assert model.encoder.rel_bias.bidirectional and not model.decoder.rel_bias.bidirectional


def test_t5_bias_gradient_of_a_batch_is_the_sum_over_its_sequences():
    # Training gives every sequence its own copy of the learned bias (so SDPA can use a fused kernel); the bias
    # table's gradient must still be the sum of the per-sequence gradients, as with one broadcast bias.
    model = tiny("t5-tiny")
    table = model.encoder.rel_bias.relative_attention_bias.weight
    ids = torch.randint(4, V, (3, 12))
    dec = torch.randint(4, V, (3, 5))

    def grad(rows: slice) -> torch.Tensor:
        model.zero_grad()
        model(ids[rows], decoder_input_ids=dec[rows]).logits.square().sum().backward()
        return table.grad.clone()

    whole = grad(slice(None))
    assert torch.allclose(whole, sum(grad(slice(i, i + 1)) for i in range(3)), atol=1e-5)
    assert whole.abs().sum() > 0


def test_t5_v1_0_rescales_tied_logits_and_v1_1_does_not():
    v10, v11 = tiny("t5-tiny"), tiny("t5-v1_1-tiny")
    assert v10.lm_head.weight is v10.tok_emb.weight and v11.lm_head.weight is not v11.tok_emb.weight
    h = torch.randn(2, 5, 64)
    with torch.no_grad():
        torch.testing.assert_close(v10.logits(h), (h * 64**-0.5) @ v10.tok_emb.weight.T)
        torch.testing.assert_close(v11.logits(h), h @ v11.lm_head.weight.T)


def test_share_encoder_decoder_halves_the_layer_parameters_and_still_runs():
    cfg = get_preset("t5-tiny", vocab_size=V)
    base = Transformer(cfg)
    shared = Transformer(get_preset("t5-tiny", vocab_size=V, share_encoder_decoder=True))
    enc_block = base.encoder.blocks[0]
    per_layer = sum(
        p.numel() for m in (enc_block.attn, enc_block.norm1, enc_block.mlp, enc_block.norm2) for p in m.parameters()
    )
    # Each decoder layer keeps only its cross-attention (and its norm); self-attention and MLP are the encoder's.
    assert base.num_params() - shared.num_params() == cfg.decoder_layers * per_layer
    assert shared.decoder.blocks[1].mlp is shared.encoder.blocks[1].mlp
    assert shared.decoder.blocks[1].cross_attn is not shared.encoder.blocks[1].attn
    ids, mask = padded_batch(0)
    out = shared(ids, mask, decoder_input_ids=ids[:, :7])
    assert out.logits.shape == (3, 7, V) and torch.isfinite(out.logits).all()
    # Training updates one tensor for both stacks.
    out.logits.sum().backward()
    grad = shared.encoder.blocks[0].mlp.up.weight.grad
    assert grad is shared.decoder.blocks[0].mlp.up.weight.grad and grad.abs().sum() > 0


def test_bart_decoder_starts_from_eos_and_pads_with_one():
    cfg = get_preset("bart-base")
    assert (cfg.decoder_start_id, cfg.pad_id, cfg.position_offset, cfg.max_seq_len) == (2, 1, 2, 1024)
    assert Transformer(get_preset("bart-tiny")).decoder.pos_emb.emb.weight.shape[0] == 128 + 2


def test_encoder_output_is_independent_of_the_decoder():
    model = tiny("bart-tiny")
    ids, mask = padded_batch(1)
    with torch.no_grad():
        a = model(ids, mask, decoder_input_ids=ids[:, :4]).encoder_last_hidden_state
        b = model(ids, mask, decoder_input_ids=ids[:, 5:12]).encoder_last_hidden_state
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
