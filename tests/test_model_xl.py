"""Transformer-XL in the one stack: segments with memory equal an independent full-context computation of Dai et al.
§3.3 restricted the same way; parity with transformers' relative attention (XLNet with attn_type='uni', the
Transformer-XL layer); stop-gradient memory of the right length; KV-cache decoding; config errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from model_testing import ATOL, V, save_hf, tiny
from xl_testing import boost_relative

from lmforge.errors import LMForgeError
from lmforge.models import Transformer, get_preset
from lmforge.models.generate import generate
from lmforge.models.hf import import_hf

# ----------------------------------------------------------------------------------------------------------------
# An independent reference: the paper's four score terms written out, over the whole concatenated text at once
# ----------------------------------------------------------------------------------------------------------------


def _sinusoid(dist: torch.Tensor, d: int) -> torch.Tensor:
    """R_{i-j} (..., d): [sin(dist * f_k) for k] + [cos(dist * f_k) for k], f_k = 10000^(-2k/d)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = dist.to(torch.float64)[..., None] * inv_freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1).float()


@torch.no_grad()
def naive_xl(model: Transformer, ids: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Final hidden states (B, N, d) with key j visible to query i iff visible[i, j]; no memory, no cache."""
    cfg = model.config
    stack = model.decoder
    B, N = ids.shape
    H, hd, d = cfg.n_heads, cfg.dim_head, cfg.d_model
    h = model.tok_emb(ids) * (math.sqrt(d) if cfg.scale_embeddings else 1.0)
    R = _sinusoid(torch.arange(N)[:, None] - torch.arange(N)[None, :], d)  # (N, N, d): R_{i-j}
    for block in stack.blocks:
        attn, rel = block.attn, block.attn.rel
        x = block.norm1(h) if block.pre else h
        q, k, v = (x @ attn.qkv.weight.t()).split(H * hd, dim=-1)
        q, k, v = (t.view(B, N, H, hd) for t in (q, k, v))
        rk = (R @ rel.r.weight.t()).view(N, N, H, hd)  # W_{k,R} R_{i-j}
        a = torch.einsum("bihd,bjhd->bhij", q, k)  # (a) content
        b = torch.einsum("bihd,ijhd->bhij", q, rk)  # (b) content-dependent position
        c = torch.einsum("hd,bjhd->bhj", rel.u, k)[:, :, None, :]  # (c) global content bias
        dd = torch.einsum("hd,ijhd->hij", rel.v, rk)[None]  # (d) global position bias
        scores = ((a + b + c + dd) / math.sqrt(hd)).masked_fill(~visible, float("-inf"))
        y = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v).reshape(B, N, H * hd)
        y = attn.o(y)
        h = h + y if block.pre else block.norm1(h + y)
        h = h + block.mlp(block.norm2(h)) if block.pre else block.norm2(h + block.mlp(h))
    return stack.final_norm(h) if cfg.final_norm else h


def segment_mask(n_seg: int, T: int, M: int) -> torch.Tensor:
    """Visibility of a text of n_seg segments of T tokens scored segment by segment with memory M: query i of
    segment s sees keys from the last M tokens of segment s - 1 up to itself."""
    i = torch.arange(n_seg * T)[:, None]
    j = torch.arange(n_seg * T)[None, :]
    first = (i // T) * T - M  # first visible key of i's segment
    return (j <= i) & (j >= first.clamp(min=0))


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("mem_len", [8, 5])
def test_segments_with_memory_equal_a_full_context_forward_restricted_the_same_way(norm_position, mem_len):
    model = boost_relative(tiny("transformer-xl-tiny", norm_position=norm_position, final_norm=norm_position == "pre"))
    T, n_seg = 8, 3
    ids = torch.randint(0, V, (2, n_seg * T + 1))
    ref = naive_xl(model, ids[:, :-1], segment_mask(n_seg, T, mem_len))  # (B, n_seg * T, d)
    mems, losses, ref_losses = None, [], []
    with torch.no_grad():
        for s in range(n_seg):
            x, y = ids[:, s * T : (s + 1) * T], ids[:, s * T + 1 : (s + 1) * T + 1]
            out = model(x, mems=mems, use_mems=True, mem_len=mem_len)
            mems = out.mems
            torch.testing.assert_close(out.last_hidden_state, ref[:, s * T : (s + 1) * T], atol=ATOL, rtol=0)
            losses.append(F.cross_entropy(out.logits.flatten(0, 1), y.flatten()))
            ref_losses.append(F.cross_entropy(model.logits(ref[:, s * T : (s + 1) * T]).flatten(0, 1), y.flatten()))
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), atol=1e-5, rtol=0)
    # Memory changes the answer: without it the later segments score differently.
    alone = model(ids[:, T : 2 * T]).last_hidden_state
    assert (alone - ref[:, T : 2 * T]).abs().max() > 1e-2


def test_memory_is_the_last_mem_len_layer_inputs_and_carries_no_gradient():
    model = tiny("transformer-xl-tiny").train()
    a, b = torch.randint(0, V, (2, 2, 6))
    first = model(a, use_mems=True, mem_len=10, output_hidden_states=True)
    assert len(first.mems) == model.config.n_layers
    for mem, hs in zip(first.mems, first.hidden_states[:-1]):
        assert mem.shape == (2, 6, 64) and torch.equal(mem, hs.detach())
        assert not mem.requires_grad
    second = model(b, mems=first.mems, use_mems=True, mem_len=10, output_hidden_states=True)
    for old, mem, hs in zip(first.mems, second.mems, second.hidden_states[:-1]):
        assert mem.shape == (2, 10, 64)  # the last 10 of 6 old + 6 new
        torch.testing.assert_close(mem, torch.cat([old, hs.detach()], dim=1)[:, -10:])
    second.logits.sum().backward()  # gradients stop at the memory: the first segment's graph is not reached
    assert first.last_hidden_state.grad_fn is not None and all(m.grad_fn is None for m in second.mems)


def test_model_mem_len_is_the_default_and_zero_returns_none():
    model = tiny("transformer-xl-tiny", mem_len=3)
    out = model(torch.randint(0, V, (1, 7)), use_mems=True)
    assert out.mems[0].shape[1] == 3
    assert model(torch.randint(0, V, (1, 7)), use_mems=True, mem_len=0).mems is None
    assert model(torch.randint(0, V, (1, 7))).mems is None


def _hf_uni(tmp_path, clamp_len: int):
    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(
        vocab_size=V, d_model=32, n_layer=2, n_head=4, d_inner=64, attn_type="uni", mem_len=6, clamp_len=clamp_len,
        ff_activation="relu", dropout=0.0,
    )  # fmt: skip
    hf = boost_relative(transformers.XLNetLMHeadModel(cfg))
    save_hf(hf, tmp_path)
    return hf.eval()


@pytest.mark.parametrize("clamp_len", [-1, 3])
def test_relative_attention_and_memory_match_transformers(clamp_len, tmp_path):
    """transformers' XLNet with attn_type='uni' is a Transformer-XL stack (§3.3 attention, memory, clamp_len)."""
    hf = _hf_uni(tmp_path, clamp_len)
    ours = import_hf(tmp_path)
    assert (ours.config.arch, ours.config.position, ours.config.clamp_len) == ("decoder", "xl", max(clamp_len, 0))
    theirs_mems = ours_mems = None
    with torch.no_grad():
        for _ in range(3):
            x = torch.randint(0, V, (2, 5))
            a = hf(x, mems=theirs_mems, use_mems=True)
            b = ours(x, mems=ours_mems, use_mems=True)
            torch.testing.assert_close(b.logits, a.logits, atol=ATOL, rtol=0)
            for m_hf, m in zip(a.mems, b.mems):  # transformers keeps memory as (M, B, d)
                torch.testing.assert_close(m, m_hf.transpose(0, 1), atol=ATOL, rtol=0)
            theirs_mems, ours_mems = a.mems, b.mems


def test_kv_cache_decoding_equals_a_full_forward():
    model = boost_relative(tiny("transformer-xl-tiny"))
    ids = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :5], use_cache=True)
        steps = [out.logits]
        for t in range(5, 12):
            out = model(ids[:, t : t + 1], cache=out.cache)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)
    # Greedy generation runs on that cache and continues past the training length (relative positions).
    new = generate(model, ids[:, :3], max_new_tokens=40, temperature=0.0)
    assert new.shape == (2, 43)


def test_published_parameter_counts():
    with torch.device("meta"):
        base = Transformer(get_preset("transformer-xl-base"))
        xlnet = Transformer(get_preset("xlnet-base"))
        hf = transformers.XLNetLMHeadModel(transformers.XLNetConfig(d_model=768, n_layer=12, n_head=12, d_inner=3072))
    assert round(base.num_params() / 1e6) == 151  # Dai et al. Table 1, WikiText-103 base
    assert xlnet.num_params() == hf.num_parameters()
    cfg = base.config
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.dim_head, cfg.d_ff, cfg.mem_len) == (16, 410, 10, 41, 2100, 150)


BAD_CONFIGS = [
    (dict(preset="gpt-tiny", mem_len=4), "model.mem_len needs model.position='xl' (Transformer-XL relative attention)"),
    (
        dict(preset="t5-tiny", position="xl"),
        "model.position='xl' applies to causal decoders and encoders, not encoder-decoders",
    ),
    (dict(preset="transformer-xl-tiny", mem_len=-1), "model.mem_len must be >= 0, got -1"),
    (
        dict(preset="transformer-xl-tiny", n_kv_heads=2),
        "model.position='xl' needs multi-head attention (model.n_kv_heads null or n_heads)",
    ),
]


@pytest.mark.parametrize("overrides, message", BAD_CONFIGS)
def test_bad_configs_get_one_clear_error(overrides, message):
    name = overrides.pop("preset")
    with pytest.raises(LMForgeError) as e:
        Transformer(get_preset(name, **overrides))
    assert str(e.value) == message


def test_xl_only_arguments_are_refused_by_other_models():
    with pytest.raises(LMForgeError, match="has no Transformer-XL recurrence"):
        tiny("gpt-tiny")(torch.randint(0, V, (1, 4)), use_mems=True)


def test_memory_keeps_its_strides_once_full():
    """A full memory is contiguous, so every later step sees the same shape and strides (one compiled graph)."""
    from lmforge.models.recurrence import update_memory

    hs = [torch.randn(2, 5, 8) for _ in range(4)]
    mems = [update_memory(None, hs[0], 7)]
    for h in hs[1:]:
        mems.append(update_memory(mems[-1], h, 7))
    assert [m.shape for m in mems[1:]] == [torch.Size([2, 7, 8])] * 3
    assert len({m.stride() for m in mems[1:]}) == 1 and all(m.is_contiguous() for m in mems)
    assert torch.equal(mems[2][:, :2], mems[1][:, 5:]) and torch.equal(mems[2][:, 2:], hs[2])
