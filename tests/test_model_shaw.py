"""Shaw et al. 2018 relative positions with the value term (eq. 3): the layer equals a naive computation of
eqs. 3-4, KV-cache decoding equals the full forward, the value term is the only difference to the key-only
variant, and checkpoints saved before the value term existed load as key-only models."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import lmforge
from lmforge.checkpoint.read import read_config, upgrade_saved_model
from lmforge.checkpoint.write import write_checkpoint_dir
from lmforge.models import Transformer, get_preset
from lmforge.models.layers import Attention, AttnInputs
from lmforge.models.positions import ShawRelativePosition

V = 512


def test_value_term_matches_a_naive_loop():
    torch.manual_seed(0)
    m = 2
    shaw = ShawRelativePosition(head_dim=4, max_relative_position=m, values=True)
    probs = torch.softmax(torch.randn(2, 3, 3, 7), -1)
    q_pos, k_pos = torch.tensor([4, 5, 6]), torch.arange(7)
    out = shaw.value_term(probs, q_pos, k_pos)
    table = shaw.value_embeddings.weight
    naive = torch.zeros(2, 3, 3, 4)
    for i in range(3):
        for j in range(7):
            offset = max(-m, min(m, int(k_pos[j]) - int(q_pos[i])))
            naive[:, :, i] += probs[:, :, i, j, None] * table[offset + m]
    torch.testing.assert_close(out, naive)


def _naive_attention(att: Attention, x: torch.Tensor, k_clip: int, causal: bool) -> torch.Tensor:
    """Eqs. 3-4 per head: e_ij = q_i (k_j + a^K_ij) / sqrt(d_z), z_i = Σ_j softmax(e)_ij (v_j + a^V_ij)."""
    B, T, _ = x.shape
    H, hd = att.n_heads, att.hd
    q, k, v = att.qkv(x).split(H * hd, -1)
    q, k, v = (t.view(B, T, H, hd) for t in (q, k, v))
    aK, aV = att.shaw.embeddings.weight, att.shaw.value_embeddings.weight
    z = torch.zeros(B, T, H, hd)
    for i in range(T):
        js = range(i + 1) if causal else range(T)
        rel = [max(-k_clip, min(k_clip, j - i)) + k_clip for j in js]
        e = torch.stack([(q[:, i] * (k[:, j] + aK[r])).sum(-1) for j, r in zip(js, rel)], -1) / math.sqrt(hd)
        alpha = torch.softmax(e, -1)  # (B, H, |js|)
        z[:, i] = sum(alpha[..., n, None] * (v[:, j] + aV[r]) for n, (j, r) in enumerate(zip(js, rel)))
    return att.o(z.reshape(B, T, H * hd))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_layer_equals_equations_3_and_4(causal):
    cfg = get_preset("transformer-shaw-tiny", rel_max_distance=3, init_std=0.3)
    torch.manual_seed(1)
    att = Attention(cfg).eval()
    torch.nn.init.normal_(att.shaw.value_embeddings.weight, std=1.0)
    x = torch.randn(2, 9, cfg.d_model)
    idx = torch.arange(9)
    mask = None
    if causal:
        mask = torch.zeros(9, 9).masked_fill(idx[None, :] > idx[:, None], torch.finfo(torch.float32).min)[None, None]
    out = att(x, AttnInputs(mask, False, idx, idx, idx), 0)
    torch.testing.assert_close(out, _naive_attention(att, x, 3, causal), atol=1e-5, rtol=1e-5)


def test_decoder_kv_cache_equals_full_forward_with_values():
    torch.manual_seed(2)
    m = Transformer(get_preset("gpt-tiny", position="shaw", rel_max_distance=4)).eval()
    assert m.decoder.blocks[0].attn.shaw.value_embeddings is not None  # on by default, as in the paper
    x = torch.randint(0, V, (2, 25))
    with torch.no_grad():
        full = m(x).logits
        out = m(x[:, :6], use_cache=True)
        steps = [out.logits] + [m(x[:, t : t + 1], cache=out.cache).logits for t in range(6, 25)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_encoder_decoder_with_values_decodes_with_cache():
    torch.manual_seed(3)
    m = Transformer(get_preset("transformer-shaw-tiny")).eval()
    x, y = torch.randint(0, V, (2, 11)), torch.randint(0, V, (2, 9))
    with torch.no_grad():
        full = m(x, decoder_input_ids=y).logits
        enc = m.encode(x)
        out = m(x, decoder_input_ids=y[:, :3], encoder_hidden_states=enc, use_cache=True)
        steps = [out.logits]
        for t in range(3, 9):
            steps.append(m(x, decoder_input_ids=y[:, t : t + 1], encoder_hidden_states=enc, cache=out.cache).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_value_term_is_the_only_difference_to_the_key_only_model():
    torch.manual_seed(4)
    with_values = Transformer(get_preset("transformer-shaw-tiny")).eval()
    key_only = Transformer(get_preset("transformer-shaw-tiny", shaw_values=False)).eval()
    sd = {k: v for k, v in with_values.state_dict().items() if "value_embeddings" not in k}
    assert set(key_only.state_dict()) == set(sd)
    key_only.load_state_dict(sd)
    x, y = torch.randint(0, V, (2, 10)), torch.randint(0, V, (2, 7))
    with torch.no_grad():
        assert (with_values(x, decoder_input_ids=y).logits - key_only(x, decoder_input_ids=y).logits).abs().max() > 1e-3
        for name, p in with_values.named_parameters():
            if "value_embeddings" in name:
                p.zero_()  # a^V = 0: eq. 3 reduces to the key-only attention
        torch.testing.assert_close(
            with_values(x, decoder_input_ids=y).logits, key_only(x, decoder_input_ids=y).logits, atol=1e-5, rtol=0
        )


def test_checkpoints_saved_before_the_value_term_load_as_key_only(tmp_path):
    torch.manual_seed(5)
    old = Transformer(get_preset("gpt-tiny", position="shaw", rel_max_distance=4, shaw_values=False)).eval()
    section = dataclasses.asdict(old.config)
    del section["shaw_values"]  # what a run written before the field existed has in its config.yaml
    path = write_checkpoint_dir(tmp_path / "ckpt", old, config={"model": section})
    assert read_config(path)["model"]["shaw_values"] is False
    model, _ = lmforge.load(path)
    assert model.config.shaw_values is False
    x = torch.randint(0, V, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, old(x).logits, atol=0, rtol=0)


def test_upgrade_leaves_other_models_alone():
    assert "shaw_values" not in upgrade_saved_model({"position": "learned"})
    assert upgrade_saved_model({"position": "shaw", "shaw_values": True})["shaw_values"] is True
    assert upgrade_saved_model({"d_model": 16}) == {"d_model": 16}
