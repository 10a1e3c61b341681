"""Decoder family: HF GPT-2 parity, causal masking, KV-cache decoding, GPT-1 structure."""

import pytest
import torch

from lmforge.errors import LMForgeError
from lmforge.models import Transformer, get_preset
from lmforge.models.hf import to_hf_model


def tiny(name="gpt-tiny", **kw):
    torch.manual_seed(0)
    return Transformer(get_preset(name, vocab_size=300, **kw)).eval()


def test_gpt2_logits_equal_transformers():
    model = tiny()
    hf = to_hf_model(model)
    x = torch.randint(0, 300, (3, 40))
    mask = torch.ones_like(x)
    mask[1, 25:] = 0  # right-padded row
    with torch.no_grad():
        ours = model(x, mask).logits
        theirs = hf(input_ids=x, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=0)
    hidden = model(x, mask).last_hidden_state
    assert hidden.shape == (3, 40, 64)


def test_future_tokens_never_change_past_logits():
    model = tiny()
    x = torch.randint(0, 300, (2, 30))
    y = x.clone()
    y[:, 20:] = torch.randint(0, 300, (2, 10))
    with torch.no_grad():
        a, b = model(x).logits, model(y).logits
    torch.testing.assert_close(a[:, :20], b[:, :20], atol=1e-6, rtol=0)
    assert (a[:, 20:] - b[:, 20:]).abs().max() > 1e-3  # the changed positions do change


@pytest.mark.parametrize("preset", ["gpt-tiny", "gpt1-tiny"])
def test_kv_cache_decoding_equals_full_forward(preset):
    model = tiny(preset)
    x = torch.randint(0, 300, (2, 24))
    with torch.no_grad():
        full = model(x).logits
        out = model(x[:, :9], use_cache=True)
        steps, cache = [out.logits], out.cache
        for t in range(9, 24):
            steps.append(model(x[:, t : t + 1], cache=cache).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_gpt1_is_post_ln_with_tied_embeddings():
    model = tiny("gpt1-tiny")
    assert model.lm_head.weight is model.tok_emb.weight
    assert not hasattr(model.decoder, "final_norm")
    # Post-LN: each block's output is normalised, so per-position features have ~zero mean and unit variance.
    h = model(torch.randint(0, 300, (1, 10))).last_hidden_state
    torch.testing.assert_close(h.mean(-1), torch.zeros(1, 10), atol=1e-5, rtol=0)


def test_parameter_count_of_gpt2_124m():
    with torch.device("meta"):  # shapes only
        n = Transformer(get_preset("gpt2-124m")).num_params()
    assert round(n / 1e6) == 124


def test_learned_positions_past_max_seq_len_is_an_error():
    model = tiny()
    with pytest.raises(LMForgeError, match="exceeds max_seq_len 128"):
        model(torch.zeros(1, 129, dtype=torch.long))
