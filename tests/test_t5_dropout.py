"""Dropout in training drops where the family's reference drops: the same sites, in the same order, at the same
rates, as `transformers`' own modules on identical weights (T5 v1.0 and v1.1: after the embedding, on the attention
probabilities, on the feed-forward hidden activation, on each sublayer's output and after each stack's final norm;
GPT-2, BERT and BART as their twins).

Each forward is traced through torch.nn.functional: every `dropout` call with p > 0 and every
`scaled_dot_product_attention` call with dropout_p > 0 (the attention probabilities, (B, H, Tq, Tk)). With the masks
fixed (the i-th dropout of a forward draws the i-th of a fixed list of masks on both sides, attention run as its
math definition), the two models' training-mode logits are equal."""

from __future__ import annotations

import math
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from model_testing import V, padded_batch

from lmforge.models import Transformer, get_preset
from lmforge.models.hf import to_hf_model

P = 0.1
SDPA = F.scaled_dot_product_attention
DROPOUT = F.dropout


@contextmanager
def traced(monkeypatch, fixed_masks: bool):
    """Record (site, shape, p, via) of every active dropout; fixed_masks: draw mask i from a generator seeded i and
    run attention as softmax(q kᵀ · scale + mask) with that dropout, instead of the kernels' own random draws."""
    events: list[tuple[str, tuple[int, ...], float, str]] = []

    def drop(x, p):
        if not fixed_masks:
            return None
        g = torch.Generator().manual_seed(len(events))
        keep = torch.rand(x.shape, generator=g, dtype=torch.float64) >= p
        return x * keep.to(x.dtype) / (1 - p)

    def dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return DROPOUT(x, p, training, inplace)
        out = drop(x, p)
        events.append(("attn" if x.dim() == 4 else "hidden", tuple(x.shape), p, "dropout"))
        return DROPOUT(x, p, training, inplace) if out is None else out

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        if dropout_p == 0:
            return SDPA(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, **kw)
        shape = (*q.shape[:-1], k.shape[-2])  # the probabilities it drops: (B, H, Tq, Tk)
        if not fixed_masks:
            events.append(("attn", shape, dropout_p, "sdpa"))
            return SDPA(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, **kw)
        scores = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
        if is_causal:
            scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
        if attn_mask is not None:
            scores = scores + attn_mask if attn_mask.dtype != torch.bool else scores.masked_fill(~attn_mask, -1e9)
        probs = drop(scores.float().softmax(-1).to(q.dtype), dropout_p)
        events.append(("attn", shape, dropout_p, "sdpa"))
        return probs @ v

    monkeypatch.setattr(torch.nn.functional, "dropout", dropout)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    yield events


def pair(preset: str, attn: str = "sdpa", **kw) -> tuple[Transformer, torch.nn.Module]:
    """(lmforge model, its transformers twin with identical weights), both in training mode."""
    torch.manual_seed(0)
    ours = Transformer(get_preset(preset, vocab_size=V, **kw))
    hf = to_hf_model(ours)
    hf.set_attn_implementation(attn)
    return ours.train(), hf.train()


def forward(model, cfg, hf: bool) -> torch.Tensor:
    ids, mask = padded_batch(cfg.pad_id, T=12)
    kw: dict = {"input_ids": ids, "attention_mask": mask}
    if cfg.is_encoder_decoder:
        kw["decoder_input_ids"] = padded_batch(cfg.pad_id, T=7, seed=1)[0]
    if hf and cfg.is_encoder_decoder:
        kw["use_cache"] = False
    out = model(**kw)
    return out.prediction_logits if hasattr(out, "prediction_logits") else out.logits  # BertForPreTraining's name


def trace(model, cfg, hf: bool, monkeypatch, fixed_masks: bool = False):
    with monkeypatch.context() as m, traced(m, fixed_masks) as events:
        logits = forward(model, cfg, hf)
    return logits, events


def sites(events) -> list[tuple[str, tuple[int, ...], float]]:
    return [e[:3] for e in events]


T5_RATES = {"dropout": P, "attn_dropout": P}
"""T5 v1.1 pre-trains without dropout: the sites are tested with a fine-tune's rate."""


@pytest.mark.parametrize(("preset", "kw"), [("t5-tiny", {}), ("t5-v1_1-tiny", T5_RATES)])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_t5_drops_where_transformers_t5_drops(preset, kw, attn, monkeypatch):
    ours, hf = pair(preset, attn, n_decoder_layers=3, **kw)
    cfg = ours.config
    _, mine = trace(ours, cfg, False, monkeypatch)
    _, theirs = trace(hf, cfg, True, monkeypatch)
    assert sites(mine) == sites(theirs)
    enc, dec = cfg.n_layers, cfg.decoder_layers
    # Per stack: the embedding, each sublayer's output, the FFN hidden activation, the final norm's output.
    hidden = [e for e in mine if e[0] == "hidden"]
    assert len(hidden) == 2 + 2 + 3 * enc + 4 * dec
    assert [e[1][-1] for e in hidden].count(cfg.d_ff) == enc + dec  # the FFN hidden activation
    # Self-attention probabilities per layer, plus the decoder's cross-attention ones; through SDPA's dropout_p.
    attn_events = [e for e in mine if e[0] == "attn"]
    assert len(attn_events) == enc + 2 * dec and {e[3] for e in attn_events} == {"sdpa"}
    assert {e[2] for e in mine} == {P}


@pytest.mark.parametrize(("preset", "kw"), [("t5-tiny", {}), ("t5-v1_1-tiny", T5_RATES)])
def test_t5_with_fixed_masks_equals_transformers_in_training(preset, kw, monkeypatch):
    ours, hf = pair(preset, "eager", n_decoder_layers=3, **kw)
    cfg = ours.config
    mine, n_mine = trace(ours, cfg, False, monkeypatch, fixed_masks=True)
    theirs, n_theirs = trace(hf, cfg, True, monkeypatch, fixed_masks=True)
    assert sites(n_mine) == sites(n_theirs)
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
    plain = forward(ours, cfg, False)  # the kernels' own masks: another draw, another output
    assert not torch.allclose(plain, mine, atol=1e-2)


def test_t5_presets_carry_the_sites_and_v1_1_pretrains_without_dropout():
    v10, v11 = get_preset("t5-small"), get_preset("t5-v1_1-small")
    assert (v10.dropout, v10.attn_dropout, v10.dropout_ffn_hidden, v10.dropout_final_norm) == (P, P, True, True)
    assert (v11.dropout, v11.attn_dropout, v11.dropout_ffn_hidden, v11.dropout_final_norm) == (0.0, 0.0, True, True)
    torch.manual_seed(0)
    model = Transformer(get_preset("t5-v1_1-tiny", vocab_size=V)).train()
    ids = torch.randint(4, V, (2, 9))
    a, b = model(ids, decoder_input_ids=ids).logits, model(ids, decoder_input_ids=ids).logits
    assert torch.equal(a, b)  # no dropout anywhere


@pytest.mark.parametrize("preset", ["gpt-tiny", "bert-tiny", "roberta-tiny", "bart-tiny"])
def test_other_families_drop_where_their_twins_drop(preset, monkeypatch):
    """GPT-2 (embedding, attention probabilities, residuals), BERT/RoBERTa (the same, post-LN) and BART (no
    activation dropout in its export) keep their references' sites: no FFN-hidden or final-norm dropout."""
    ours, hf = pair(preset, dropout=P, attn_dropout=P)
    cfg = ours.config
    assert not (cfg.dropout_ffn_hidden or cfg.dropout_final_norm)
    _, mine = trace(ours, cfg, False, monkeypatch)
    _, theirs = trace(hf, cfg, True, monkeypatch)
    assert sites(mine) == sites(theirs) and len(mine) > 0
    assert all(e[1][-1] != cfg.d_ff for e in mine if e[0] == "hidden")


def test_an_imported_t5_drops_at_every_site_with_its_dropout_rate(tmp_path):
    import transformers
    from model_testing import save_hf

    from lmforge.models.hf import import_hf

    cfg = transformers.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                dropout_rate=0.2)  # fmt: skip
    save_hf(transformers.T5ForConditionalGeneration(cfg), tmp_path)
    c = import_hf(tmp_path).config
    assert (c.dropout, c.attn_dropout, c.dropout_ffn_hidden, c.dropout_final_norm) == (0.2, 0.2, True, True)
