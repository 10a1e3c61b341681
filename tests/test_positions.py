"""Position encodings: invariances, exact values, and parity with transformers' implementations."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.errors import LMForgeError
from lmforge.models.positions import (
    LearnedPositions,
    RotaryEmbedding,
    ShawRelativePosition,
    T5RelativeBias,
    alibi_bias,
    alibi_slopes,
    sinusoidal_table,
    t5_relative_position_bucket,
)

# ---------------------------------------------------------------------------------------- sinusoid


def test_sinusoid_position_zero_is_sin0_cos1() -> None:
    table = sinusoidal_table(4, 8)
    assert torch.equal(table[0, 0::2], torch.zeros(4))
    assert torch.equal(table[0, 1::2], torch.ones(4))
    halves = sinusoidal_table(4, 8, interleaved=False)
    assert torch.equal(halves[0], torch.tensor([0.0] * 4 + [1.0] * 4))


def test_sinusoid_explicit_entries() -> None:
    d = 16
    table = sinusoidal_table(50, d)
    # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))
    assert table[3, 4].item() == pytest.approx(math.sin(3 / 10000 ** (4 / d)), abs=1e-7)
    assert table[3, 5].item() == pytest.approx(math.cos(3 / 10000 ** (4 / d)), abs=1e-7)
    assert table[49, 15].item() == pytest.approx(math.cos(49 / 10000 ** (14 / d)), abs=1e-7)
    halves = sinusoidal_table(50, d, interleaved=False)
    assert halves[7, 2].item() == pytest.approx(math.sin(7 / 10000 ** (4 / d)), abs=1e-7)
    assert halves[7, d // 2 + 2].item() == pytest.approx(math.cos(7 / 10000 ** (4 / d)), abs=1e-7)


@pytest.mark.parametrize("dim", [8, 7])
def test_sinusoid_matches_xlm_and_marian(dim: int) -> None:
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
    from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings

    xlm = create_sinusoidal_embeddings(30, dim, torch.empty(30, dim))
    torch.testing.assert_close(sinusoidal_table(30, dim), xlm, atol=1e-7, rtol=0)
    marian = MarianSinusoidalPositionalEmbedding(30, dim).create_weight()
    torch.testing.assert_close(sinusoidal_table(30, dim, interleaved=False), marian, atol=1e-7, rtol=0)


def test_sinusoid_any_length() -> None:
    table = sinusoidal_table(70_000, 4)
    assert table.shape == (70_000, 4)
    assert table[65_000, 0].item() == pytest.approx(math.sin(65_000), abs=1e-6)


# ----------------------------------------------------------------------------------------- learned


def test_learned_positions_lookup_and_limit() -> None:
    lp = LearnedPositions(max_seq_len=8, d_model=4)
    pos = torch.arange(8).expand(2, 8)
    assert torch.equal(lp(pos), lp.emb.weight[pos])
    # The module is a plain lookup (no device sync); the model checks lengths on Python ints instead.
    from lmforge.models import Transformer, get_preset

    model = Transformer(get_preset("gpt-tiny", max_seq_len=8))
    with pytest.raises(LMForgeError) as err:
        model(torch.zeros(1, 10, dtype=torch.long))
    assert str(err.value) == "sequence of length 10 exceeds max_seq_len 8 for learned positions"
    cache = model(torch.zeros(1, 8, dtype=torch.long), use_cache=True).cache
    with pytest.raises(LMForgeError, match="length 9 exceeds max_seq_len 8"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)  # a single decoding step past the end


# -------------------------------------------------------------------------------------------- RoPE


def test_rope_dot_product_depends_only_on_offset() -> None:
    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim=16)
    # the same unit vectors at every position (unit norm: the tolerance is then relative)
    q = torch.nn.functional.normalize(torch.randn(16), dim=0).expand(1, 1, 48, 16)
    k = torch.nn.functional.normalize(torch.randn(16), dim=0).expand(1, 1, 48, 16)
    pos = torch.arange(48) + 5
    qr, kr = rope(q, k, pos)
    dots = (qr[0, 0] @ kr[0, 0].T).double()  # (T, T): q_m · k_n
    rel = pos[:, None] - pos[None, :]
    for r in rel.unique():
        vals = dots[rel == r]
        assert (vals - vals[0]).abs().max().item() < 1e-5
    # and it does depend on the offset (the test would pass trivially if rotation were the identity)
    assert (dots[0, 1] - dots[0, 0]).abs().item() > 1e-3


def test_rope_preserves_norm_and_position_zero_is_identity() -> None:
    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim=8)
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    qr, kr = rope(q, k, torch.arange(5))
    torch.testing.assert_close(qr.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(qr[:, :, 0], q[:, :, 0])
    assert not torch.allclose(kr[:, :, 1], k[:, :, 1])


@pytest.mark.parametrize("batched_positions", [False, True])
def test_rope_matches_transformers_llama(batched_positions: bool) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
    )
    hf_rope = LlamaRotaryEmbedding(cfg)
    ours = RotaryEmbedding(head_dim=8, base=5000.0)
    torch.testing.assert_close(ours.inv_freq, hf_rope.inv_freq, rtol=0, atol=0)
    # positions past max_position_embeddings, different per row (left padding / cache offsets)
    position_ids = torch.stack([torch.arange(20, 26), torch.arange(3, 9)])  # (B=2, T=6)
    q, k = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8)  # grouped-query: fewer k heads
    cos, sin = hf_rope(q, position_ids)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    if batched_positions:
        q_ours, k_ours = ours(q, k, position_ids)
        torch.testing.assert_close(q_ours, q_hf, rtol=0, atol=1e-6)
        torch.testing.assert_close(k_ours, k_hf, rtol=0, atol=1e-6)
    else:
        q0, k0 = ours(q[:1], k[:1], position_ids[0])
        torch.testing.assert_close(q0, q_hf[:1], rtol=0, atol=1e-6)
        torch.testing.assert_close(k0, k_hf[:1], rtol=0, atol=1e-6)


def test_rope_partial_matches_transformers_neox() -> None:
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

    torch.manual_seed(0)
    ours = RotaryEmbedding(head_dim=16, rotary_dim=4)
    assert ours.inv_freq.shape == (2,)
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    pos = torch.arange(5)[None] + 11
    # transformers' reference: inv_freq over rotary_dim, cos/sin of the rotated slice only
    inv = 1.0 / (10000.0 ** (torch.arange(0, 4, 2, dtype=torch.float) / 4))
    freqs = pos[..., None].float() * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    q_ours, k_ours = ours(q, k, pos)
    torch.testing.assert_close(q_ours, q_hf, rtol=0, atol=1e-6)
    torch.testing.assert_close(k_ours, k_hf, rtol=0, atol=1e-6)
    assert torch.equal(q_ours[..., 4:], q[..., 4:])  # pass-through features untouched


def test_rope_dtype_buffer_and_long_positions() -> None:
    rope = RotaryEmbedding(head_dim=8)
    assert "inv_freq" not in rope.state_dict()
    q = torch.randn(1, 2, 3, 8, dtype=torch.bfloat16)
    pos = torch.tensor([100_000, 100_001, 100_002])  # no maximum length
    qr, kr = rope(q, q.clone(), pos)
    assert qr.dtype == torch.bfloat16 and kr.dtype == torch.bfloat16
    # cos/sin are built in float32 then cast: equal to the float32 path rounded to bf16
    cos32, sin32 = rope.cos_sin(pos, torch.float32)
    cos16, _ = rope.cos_sin(pos, torch.bfloat16)
    assert torch.equal(cos16, cos32.to(torch.bfloat16))
    # a module cast to bf16 still uses float32 frequencies
    assert torch.equal(rope.to(torch.bfloat16).cos_sin(pos, torch.float32)[1], sin32)


def test_rope_bad_rotary_dim() -> None:
    with pytest.raises(LMForgeError, match="rotary_dim must be even"):
        RotaryEmbedding(head_dim=8, rotary_dim=3)
    with pytest.raises(LMForgeError, match="rotary_dim must be even"):
        RotaryEmbedding(head_dim=8, rotary_dim=10)


# ------------------------------------------------------------------------------------------- ALiBi


@pytest.mark.parametrize("n_heads", [4, 6, 8, 12, 16])
def test_alibi_slopes_match_bloom(n_heads: int) -> None:
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    # with an all-ones mask BLOOM's tensor at key position 1 is exactly the slope of each head
    hf = build_alibi_tensor(torch.ones(1, 3, dtype=torch.long), n_heads, torch.float32)  # (H, 1, 3)
    torch.testing.assert_close(alibi_slopes(n_heads), hf[:, 0, 1], rtol=0, atol=0)


def test_alibi_slopes_paper_values() -> None:
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # non-power-of-2: 4 slopes of n=4, then odd powers of the n=8 base
    expected = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    torch.testing.assert_close(alibi_slopes(6), torch.tensor(expected))


def test_alibi_bias_values_and_bloom_equivalence() -> None:
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    torch.manual_seed(0)
    h, t = 6, 5
    slopes = alibi_slopes(h)
    pos = torch.arange(t)
    causal = alibi_bias(slopes, pos, pos, causal=True)
    assert causal.shape == (h, t, t)
    assert causal[2, 4, 1].item() == pytest.approx(-slopes[2].item() * 3)
    assert torch.isneginf(causal[:, 1, 2]).all()
    bidir = alibi_bias(slopes, pos, pos, causal=False)
    torch.testing.assert_close(bidir, bidir.transpose(1, 2))
    assert bidir[1, 0, 3].item() == pytest.approx(-slopes[1].item() * 3)
    # softmax-equivalent to BLOOM's slope * j bias under a causal mask
    logits = torch.randn(h, t, t)
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    bloom = build_alibi_tensor(torch.ones(1, t, dtype=torch.long), h, torch.float32)  # (H, 1, T)
    ref = torch.softmax((logits + bloom).masked_fill(future, float("-inf")), dim=-1)
    torch.testing.assert_close(torch.softmax(logits + causal, dim=-1), ref)


def test_alibi_long_and_cache_offset() -> None:
    slopes = alibi_slopes(4)
    k_pos = torch.arange(5000)
    full = alibi_bias(slopes, k_pos, k_pos, causal=True)
    step = alibi_bias(slopes, torch.tensor([4999]), k_pos, causal=True)  # one cached decoding step
    assert torch.equal(step, full[:, -1:])
    assert step[3, 0, 0].item() == pytest.approx(-slopes[3].item() * 4999)


# ---------------------------------------------------------------------------------------------- T5


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (8, 20), (64, 256)])
def test_t5_buckets_match_transformers(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(-600, 601)[None, :] + torch.arange(0, 3)[:, None]  # (3, 1201) grid
    ours = t5_relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    hf = T5Attention._relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, hf)
    assert ours.min() >= 0 and ours.max() < num_buckets


@pytest.mark.parametrize("is_decoder", [False, True])
def test_t5_bias_matches_transformers_compute_bias(is_decoder: bool) -> None:
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    cfg = T5Config(d_model=16, d_kv=4, num_heads=4, relative_attention_num_buckets=8,
                   relative_attention_max_distance=20, is_decoder=is_decoder)  # fmt: skip
    hf = T5Attention(cfg, has_relative_attention_bias=True)
    ours = T5RelativeBias(4, num_buckets=8, max_distance=20, bidirectional=not is_decoder)
    ours.load_state_dict({"relative_attention_bias.weight": hf.relative_attention_bias.weight})
    torch.testing.assert_close(ours(7, 7), hf.compute_bias(7, 7), rtol=0, atol=0)
    # KV-cache step: the query at cache position 9 against 10 keys, past any training length
    torch.testing.assert_close(ours(1, 10, q_offset=9), hf.compute_bias(1, 10, past_seen_tokens=9))
    long = ours(1, 3000, q_offset=2999)
    assert long.shape == (1, 4, 1, 3000)
    torch.testing.assert_close(long[..., -10:], ours(10, 10)[..., -1:, :])


# -------------------------------------------------------------------------------------------- Shaw


def test_shaw_matches_naive_loop() -> None:
    torch.manual_seed(0)
    b, h, hd, m = 2, 3, 4, 2
    shaw = ShawRelativePosition(head_dim=hd, max_relative_position=m)
    q = torch.randn(b, h, 3, hd)
    q_pos, k_pos = torch.tensor([4, 5, 6]), torch.arange(7)  # a query block after a cached prefix
    out = shaw(q, q_pos, k_pos)
    table = shaw.embeddings.weight
    naive = torch.empty(b, h, 3, 7)
    for i in range(3):
        for j in range(7):
            offset = max(-m, min(m, int(k_pos[j]) - int(q_pos[i])))
            naive[:, :, i, j] = (q[:, :, i] * table[offset + m]).sum(-1) / math.sqrt(hd)
    torch.testing.assert_close(out, naive)


def test_shaw_as_sdpa_mask_equals_relative_keys() -> None:
    torch.manual_seed(0)
    shaw = ShawRelativePosition(head_dim=8, max_relative_position=3)
    q, k, v = torch.randn(3, 1, 2, 6, 8).unbind(0)
    pos = torch.arange(6)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=shaw(q, pos, pos))
    # Shaw eq. 5: e_ij = q_i · (k_j + a_ij) / sqrt(d)
    a = shaw.embeddings.weight[torch.clamp(pos[None] - pos[:, None], -3, 3) + 3]  # (Tq, Tk, hd)
    e = (torch.einsum("bhqd,bhkd->bhqk", q, k) + torch.einsum("bhqd,qkd->bhqk", q, a)) / math.sqrt(8)
    torch.testing.assert_close(out, torch.softmax(e, -1) @ v)
