"""Houlsby/Pfeiffer adapters (placement, near-identity init), AdaMix routing and merging, top-k freezing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from adapt_testing import FAMILIES, run, tiny
from torch import nn

from lmforge.adapt import (
    AdaMixOptions,
    AdapterLayer,
    HoulsbyOptions,
    MixtureAdapter,
    PfeifferOptions,
    TopKOptions,
    apply_adamix,
    apply_houlsby,
    apply_peft,
    apply_pfeiffer,
    apply_topk,
)
from lmforge.errors import LMForgeError


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ["houlsby", "pfeiffer"])
def test_zero_up_projection_starts_exactly_at_the_base_model(family, method):
    model, _ = apply_peft(tiny(family), method, {"bottleneck": 8, "zero_init_up": True})
    with torch.no_grad():
        torch.testing.assert_close(run(model), run(tiny(family)), rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_default_init_is_near_identity_but_not_identity(family):
    model = apply_houlsby(tiny(family), HoulsbyOptions(bottleneck=8))
    with torch.no_grad():
        got, base = run(model), run(tiny(family))
    rel = (got - base).norm() / base.norm()
    assert 0 < rel < 0.01  # N(0, 1e-2) projections: a tiny, non-zero perturbation (Houlsby et al. §3.6)


def test_houlsby_wraps_attention_and_ffn_pfeiffer_only_ffn():
    h = apply_houlsby(tiny("t5-tiny"), HoulsbyOptions(bottleneck=8))
    p = apply_pfeiffer(tiny("t5-tiny"), PfeifferOptions(bottleneck=8))
    adapted = [n for n, m in h.named_modules() if isinstance(m, AdapterLayer)]
    assert adapted == [
        f"{s}.blocks.{i}.{site}" for s in ("encoder", "decoder") for i in (0, 1) for site in ("attn.o", "mlp.down")
    ]
    assert [n for n, m in p.named_modules() if isinstance(m, AdapterLayer)] == [
        f"{s}.blocks.{i}.mlp.down" for s in ("encoder", "decoder") for i in (0, 1)
    ]
    block = h.decoder.blocks[0]
    assert block.mlp.down.adapter.down.weight.shape == (8, 64) and block.mlp.down.adapter.up.weight.shape == (64, 8)
    # Houlsby also trains the layer norms; Pfeiffer does not.
    assert block.norm1.weight.requires_grad and not p.decoder.blocks[0].norm1.weight.requires_grad
    # Adapter parameters per site: 2 * d * m + m + d.
    site = 2 * 64 * 8 + 8 + 64
    assert sum(q.numel() for n, q in p.named_parameters() if q.requires_grad) == 4 * site


def test_adapter_output_is_residual_bottleneck_of_the_sublayer_output():
    model = apply_pfeiffer(tiny("gpt-tiny"), PfeifferOptions(bottleneck=4, activation="relu", init_std=0.5))
    layer = model.decoder.blocks[1].mlp.down
    x = torch.randn(3, 256)
    with torch.no_grad():
        h = layer.base_layer(x)
        a = layer.adapter
        expected = h + F.linear(torch.relu(F.linear(h, a.down.weight, a.down.bias)), a.up.weight, a.up.bias)
        torch.testing.assert_close(layer(x), expected)
    assert a.down.weight.abs().max() <= 2 * 0.5  # truncated at two standard deviations


def _mixture(seed: int = 0) -> tuple[nn.Module, MixtureAdapter]:
    model = apply_adamix(tiny("gpt-tiny", seed), AdaMixOptions(bottleneck=4, n_experts=3, init_std=0.5))
    return model, model.decoder.blocks[0].attn.o.adapter


def _expert_output(mix: MixtureAdapter, h: torch.Tensor, i: int, j: int) -> torch.Tensor:
    z = torch.relu(F.linear(h, mix.down_weight[i], mix.down_bias[i]))
    return F.linear(z, mix.up_weight[j], mix.up_bias[j])


def test_adamix_routes_each_training_forward_through_one_random_expert_pair():
    _, mix = _mixture()
    h = torch.randn(2, 5, 64)
    mix.train()
    torch.manual_seed(0)
    combos = {(i, j): _expert_output(mix, h, i, j) for i in range(3) for j in range(3)}
    seen = set()
    with torch.no_grad():
        for _ in range(40):
            out = mix(h)
            hits = [c for c, ref in combos.items() if torch.allclose(out, ref, atol=1e-6)]
            assert len(hits) == 1  # exactly one down/up pair produced it
            seen.add(hits[0])
    assert len(seen) >= 6  # independent down and up choices: most of the 9 pairs show up in 40 draws


def test_adamix_eval_uses_averaged_expert_weights_deterministically():
    model, mix = _mixture()
    h = torch.randn(2, 5, 64)
    mix.eval()
    with torch.no_grad():
        a, b = mix(h), mix(h)
        z = torch.relu(F.linear(h, mix.down_weight.mean(0), mix.down_bias.mean(0)))
        merged = F.linear(z, mix.up_weight.mean(0), mix.up_bias.mean(0))
        mean_of_outputs = torch.stack([_expert_output(mix, h, i, i) for i in range(3)]).mean(0)
    assert torch.equal(a, b)
    torch.testing.assert_close(a, merged)
    assert not torch.allclose(a, mean_of_outputs, atol=1e-4)  # weights are averaged, not outputs
    with torch.no_grad():
        torch.testing.assert_close(run(model), run(model), rtol=0, atol=0)
    assert mix.down_weight.shape == (3, 4, 64) and mix.up_weight.shape == (3, 64, 4)


def _trainable(model: nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def _params_under(model: nn.Module, *prefixes: str) -> set[str]:
    return {n for n, _ in model.named_parameters() if n.startswith(prefixes)}


def test_topk_decoder_trains_top_blocks_and_final_norm_not_the_tied_head():
    model = apply_topk(tiny("gpt-tiny"), TopKOptions(k=1))
    assert _trainable(model) == _params_under(model, "decoder.blocks.1.", "decoder.final_norm.")
    assert not model.tok_emb.weight.requires_grad and model.lm_head.weight is model.tok_emb.weight


def test_topk_encoder_trains_its_output_heads():
    model = apply_topk(tiny("bert-tiny"), TopKOptions(k=1))
    heads = ("pooler.", "nsp_head.", "head_dense.", "head_norm.", "lm_head.bias")
    assert _trainable(model) == _params_under(model, "encoder.blocks.1.", *heads)
    assert not model.encoder.emb_norm.weight.requires_grad  # below the blocks
    no_head = apply_topk(tiny("bert-tiny"), TopKOptions(k=2, train_head=False))
    assert _trainable(no_head) == _params_under(no_head, "encoder.blocks.")


def test_topk_encoder_decoder_counts_decoder_blocks_first():
    model = apply_topk(tiny("t5-tiny"), TopKOptions(k=3, train_head=False))
    expected = _params_under(
        model,
        "decoder.blocks.0.",
        "decoder.blocks.1.",
        "decoder.final_norm.",
        "encoder.blocks.1.",
        "encoder.final_norm.",
    )
    assert _trainable(model) == expected
    assert not model.encoder.rel_bias.relative_attention_bias.weight.requires_grad
    with pytest.raises(LMForgeError, match=r"^topk.k must be in \[1, 4\] \(the model's layers\), got 5$"):
        apply_topk(tiny("t5-tiny"), TopKOptions(k=5))


def test_topk_with_shared_layers_trains_the_one_block():
    model = apply_topk(tiny("albert-tiny"), TopKOptions(k=1, train_head=False))
    assert _trainable(model) == _params_under(model, "encoder.blocks.0.")
