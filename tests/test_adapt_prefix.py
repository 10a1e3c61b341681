"""Prefix-tuning (attention to learned per-layer keys/values, with the KV cache and generation) and prompt tuning
(soft input tokens: positions, masks, segments, prefix-LM length and generation shift correctly)."""

from __future__ import annotations

import copy

import pytest
import torch

from lmforge.adapt import PrefixEncoder, apply_peft, bake_prefix
from lmforge.errors import LMForgeError
from lmforge.models import Transformer, get_preset
from lmforge.models.generate import decoding_steps, generate

V = 120
P = 3


def tiny(name: str, seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    kw = {"vocab_size": V, "dropout": 0.0, "attn_dropout": 0.0, **kw}
    if name == "t5-tiny":
        kw["init_std"] = 0.5  # peaked distributions: greedy decoding far from ties
    return Transformer(get_preset(name, **kw)).eval()


def ids(B: int, T: int, seed: int) -> torch.Tensor:
    return torch.randint(4, V, (B, T), generator=torch.Generator().manual_seed(seed))


def prefixed(model: Transformer, reparam: int = 16) -> Transformer:
    model, _ = apply_peft(model, "prefix", {"n_prefix": P, "reparam_hidden": reparam})
    return model


# --- prefix-tuning ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
@pytest.mark.parametrize("padded", [False, True])
def test_prefix_acts_as_attention_to_virtual_tokens(name, padded):
    """With position encoding off, a prefix holding the keys/values that P real tokens produce at every layer
    gives exactly the outputs of the model run on those tokens followed by the input (Li & Liang §4.2)."""
    base = tiny(name, position="none")
    model = prefixed(copy.deepcopy(base), reparam=0)
    p, x = ids(1, P, 1), ids(2, 8, 2)
    mask = torch.ones_like(x)
    if padded:  # an explicit padding mask instead of SDPA's causal path
        mask[1, 5:] = 0
    with torch.no_grad():
        cache = base(p, use_cache=True).cache
        enc = model.decoder.kv_prefix
        for i, (k, v) in enumerate(cache.self_kv):  # (1, n_kv, P, hd) each
            enc.prefix[i] = torch.stack([k[0], v[0]])
        full_mask = torch.cat([torch.ones(2, P, dtype=mask.dtype), mask], 1)
        expected = base(torch.cat([p.expand(2, -1), x], 1), full_mask).logits[:, P:]
        got = model(x, mask if padded else None).logits  # no mask: SDPA's causal path, which the prefix shifts
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny", "t5-tiny"])
def test_prefix_cached_decoding_equals_the_full_forward(name):
    model = prefixed(tiny(name))
    seq = ids(2, 9, 3)
    with torch.no_grad():
        if model.config.arch == "encoder-decoder":
            src = ids(2, 7, 4)
            full = model(src, decoder_input_ids=seq).logits
            base = tiny(name)(src, decoder_input_ids=seq).logits
            memory, cache, steps = model.encode(src), None, []
            for t in range(seq.shape[1]):
                out = model(src, decoder_input_ids=seq[:, t : t + 1], encoder_hidden_states=memory, cache=cache,
                            use_cache=True)  # fmt: skip
                cache = out.cache
                steps.append(out.logits[:, 0])
        else:
            full = model(seq).logits
            base = tiny(name)(seq).logits
            out = model(seq[:, :4], use_cache=True)  # a multi-token first step, then one token at a time
            cache, steps = out.cache, list(out.logits.unbind(1))
            for t in range(4, seq.shape[1]):
                steps.append(model(seq[:, t : t + 1], cache=cache).logits[:, 0])
            assert cache.length == seq.shape[1]  # the cache holds the sequence's own keys, not the prefix
    assert not torch.allclose(full, base, atol=1e-3)  # the prefix is attended to
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=0, atol=1e-5)


def greedy_by_full_forwards(model: Transformer, prompt: torch.Tensor, n: int) -> torch.Tensor:
    seq = prompt
    with torch.no_grad():
        for _ in range(n):
            seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return seq


def test_prefix_generation_matches_full_forwards_and_ignores_left_padding():
    model = prefixed(tiny("gpt-tiny", init_std=0.3))
    a, b = ids(1, 6, 5), ids(1, 3, 6)
    batch = torch.cat([a, torch.cat([torch.zeros(1, 3, dtype=torch.long), b], 1)])
    mask = torch.ones_like(batch)
    mask[1, :3] = 0
    out = generate(model, batch, mask, max_new_tokens=6, temperature=0)
    assert torch.equal(out[0], greedy_by_full_forwards(model, a, 6)[0])
    assert torch.equal(out[1, 3:], greedy_by_full_forwards(model, b, 6)[0])


def test_prefix_reparameterisation_and_baking():
    model = prefixed(tiny("gpt-tiny"), reparam=16)
    enc = model.decoder.kv_prefix
    assert isinstance(enc, PrefixEncoder) and enc.reparameterised
    # P' (P, d), MLP d -> 16 -> n_layers * 2 * n_kv * hd
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        "decoder.kv_prefix.embedding", "decoder.kv_prefix.mlp_in.weight", "decoder.kv_prefix.mlp_in.bias",
        "decoder.kv_prefix.mlp_out.weight", "decoder.kv_prefix.mlp_out.bias",
    }  # fmt: skip
    assert enc.mlp_out.weight.shape == (2 * 2 * 64, 16)
    x = ids(2, 7, 7)
    with torch.no_grad():
        before = model(x).logits
        bake_prefix(model)
        after = model(x).logits
    assert not enc.reparameterised and enc.prefix.shape == (2, 2, 4, P, 16) and enc.prefix.requires_grad
    assert model.peft_config.options.reparam_hidden == 0
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)


def test_prefix_on_encoder_decoder_covers_both_stacks_and_albert_shares_one_block():
    t5 = prefixed(tiny("t5-tiny"))
    assert t5.peft_config.sites == ["encoder.kv_prefix", "decoder.kv_prefix"]
    assert t5.decoder.blocks[0].cross_attn.kv_prefix is None  # cross-attention untouched
    albert = prefixed(tiny("albert-tiny"), reparam=0)
    assert albert.encoder.kv_prefix.prefix.shape[0] == albert.config.n_layers  # per layer, though the block is one


# --- prompt tuning ---------------------------------------------------------------------------------------------------


def prompted_like_tokens(base: Transformer, p: torch.Tensor) -> Transformer:
    """A prompt-tuned copy whose soft prompt is the embedding of the real tokens p (1, P)."""
    model, _ = apply_peft(copy.deepcopy(base), "prompt", {"n_prompt": P})
    stack = model.decoder if base.config.arch == "decoder" else model.encoder
    with torch.no_grad():
        stack.prompt.copy_(base.tok_emb.weight[p[0]])
    return model


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny", "bert-tiny", "prefix-lm-tiny"])
def test_prompt_equals_real_prefix_tokens_with_shifted_positions(name):
    base = tiny(name)
    p, x = ids(1, P, 8), ids(2, 8, 9)
    model = prompted_like_tokens(base, p)
    mask = torch.ones_like(x)
    kw, kw_base = {}, {}
    if name == "bert-tiny":
        mask[1, 6:] = 0  # right padding and a second segment
        kw["token_type_ids"] = (torch.arange(8) >= 4).long().expand(2, -1)
        kw_base["token_type_ids"] = torch.cat([torch.zeros(2, P, dtype=torch.long), kw["token_type_ids"]], 1)
    if name == "prefix-lm-tiny":
        kw["prefix_len"], kw_base["prefix_len"] = 5, 5 + P
    full = torch.cat([p.expand(2, -1), x], 1)
    full_mask = torch.cat([torch.ones(2, P, dtype=mask.dtype), mask], 1)
    with torch.no_grad():
        out = model(x, mask, **kw)
        ref = base(full, full_mask, **kw_base)
    real = mask.bool()
    assert out.last_hidden_state.shape == (2, 8, 64)
    torch.testing.assert_close(out.last_hidden_state[real], ref.last_hidden_state[:, P:][real], rtol=0, atol=1e-5)
    if name == "bert-tiny":  # the pooler still reads the first real token ([CLS])
        torch.testing.assert_close(out.pooled, torch.tanh(base.pooler(ref.last_hidden_state[:, P])), atol=1e-5, rtol=0)


def test_prompt_on_encoder_decoder_prefixes_the_encoder_input():
    base = tiny("t5-tiny")
    p, src, dec = ids(1, P, 10), ids(2, 7, 11), ids(2, 5, 12)
    model = prompted_like_tokens(base, p)
    mask = torch.ones_like(src)
    mask[1, 5:] = 0
    full_mask = torch.cat([torch.ones(2, P, dtype=mask.dtype), mask], 1)
    with torch.no_grad():
        out = model(src, mask, decoder_input_ids=dec)
        ref = base(torch.cat([p.expand(2, -1), src], 1), full_mask, decoder_input_ids=dec)
    assert out.encoder_last_hidden_state.shape == (2, P + 7, 64)  # the decoder cross-attends to the prompt too
    torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-5)
    got = generate(model, src, mask, max_new_tokens=5, temperature=0)
    want = generate(base, torch.cat([p.expand(2, -1), src], 1), full_mask, max_new_tokens=5, temperature=0)
    assert torch.equal(got, want)


def test_prompt_generation_with_cache_and_left_padding_keeps_positions_shifted():
    base = tiny("gpt-tiny", init_std=0.3)
    p = ids(1, P, 13)
    model = prompted_like_tokens(base, p)
    a, b = ids(1, 6, 14), ids(1, 3, 15)
    batch = torch.cat([a, torch.cat([torch.zeros(1, 3, dtype=torch.long), b], 1)])
    mask = torch.ones_like(batch)
    mask[1, :3] = 0
    got = generate(model, batch, mask, max_new_tokens=6, temperature=0)
    for row, prompt in ((0, a), (1, b)):
        want = generate(base, torch.cat([p, prompt], 1), max_new_tokens=6, temperature=0)[:, P + prompt.shape[1] :]
        assert torch.equal(got[row, -6:], want[0])
    # Teacher-forced cached steps equal the full forward, positions counted past the prompt.
    steps = decoding_steps(model, a)
    with torch.no_grad():
        logits = [steps.start()] + [steps.step(t) for t in ids(1, 4, 16).T]
        full = model(torch.cat([a, ids(1, 4, 16)], 1)).logits[:, 5:]
    torch.testing.assert_close(torch.stack(logits, 1), full, rtol=0, atol=1e-5)
    # The same without explicit positions: the model's default would count the prompt's cached keys.
    seq = ids(2, 9, 18)
    with torch.no_grad():
        out = model(seq[:, :5], use_cache=True)
        cached = [out.logits] + [model(seq[:, t : t + 1], cache=out.cache).logits for t in range(5, 9)]
        torch.testing.assert_close(torch.cat(cached, 1), model(seq).logits, rtol=0, atol=1e-5)


def test_prompt_initialisation_and_length_limit():
    base = tiny("gpt-tiny", max_seq_len=16)
    vocab, _ = apply_peft(copy.deepcopy(base), "prompt", {"n_prompt": 4})
    rows = vocab.decoder.prompt.detach()
    assert all(any(torch.equal(r, e) for e in base.tok_emb.weight.detach()) for r in rows)
    rand, _ = apply_peft(copy.deepcopy(base), "prompt", {"n_prompt": 4, "init": "random"})
    assert rand.decoder.prompt.abs().max() <= 0.5 and rand.decoder.prompt.std() > 0.2
    with pytest.raises(
        LMForgeError, match=r"^sequence of length 17 \(4 prompt tokens included\) exceeds max_seq_len 16$"
    ):
        vocab(ids(1, 13, 17))
    assert vocab(ids(1, 12, 17)).logits.shape == (1, 12, V)
