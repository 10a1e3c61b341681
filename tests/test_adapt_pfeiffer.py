"""Pfeiffer adapters as AdapterHub's SeqBnConfig (Pfeiffer et al. 2021) runs them: in a post-LN block the adapter
comes after the feed-forward's add & norm, its residual is taken before that norm, and the block's own LayerNorm is
applied again after the sum; reduction factor 16, ReLU. The expected outputs below are AdapterHub's
`Adapter.pre_forward` → `Adapter.forward` → `Adapter.post_forward` with SeqBnConfig's flags, written out."""

from __future__ import annotations

import pytest
import torch
from adapt_testing import run, tiny

from lmforge.adapt import AdapterLayer, PfeifferOptions, apply_peft, apply_pfeiffer
from lmforge.adapt.bottleneck import PostNormAdapter
from lmforge.errors import LMForgeError


def adapterhub_seq_bn(hidden_states, input_tensor, layer_norm, adapter):
    """AdapterHub's bottleneck_layer_forward for one SeqBn adapter: original_ln_before=True,
    residual_before_ln=True, ln_before=ln_after=False, adapter_residual_before_ln=False, scaling 1, no dropout,
    original_ln_after=True. hidden_states: the sublayer's output; input_tensor: the sublayer's input (its
    residual); layer_norm: the block's norm of that sublayer, or None (pre-LN models)."""
    residual = hidden_states  # pre_forward: residual_before_ln is True
    hidden_states = hidden_states + input_tensor  # original_ln_before
    if layer_norm is not None:
        hidden_states = layer_norm(hidden_states)
    up = adapter.up(torch.relu(adapter.down(hidden_states)))  # forward: adapter_down (Linear, ReLU), adapter_up
    output = up + residual  # not adapter_residual_before_ln, no ln_after: the residual after
    output = output + input_tensor  # post_forward: original_ln_after
    return layer_norm(output) if layer_norm is not None else output


def capture(module, store: list, what: str = "output"):
    def hook(m, args, out):
        store.append(args[0] if what == "input" else out)

    return module.register_forward_hook(hook)


@pytest.mark.parametrize("family", ["bert-tiny", "roberta-tiny"])
def test_post_ln_block_output_is_adapterhubs_formula(family):
    model = apply_pfeiffer(tiny(family), PfeifferOptions(init_std=0.3))
    block = model.encoder.blocks[1]
    assert isinstance(block.norm2, PostNormAdapter) and not block.pre
    ffn_in, out = [], []
    handles = [capture(block.norm1, ffn_in), capture(block, out)]  # post-LN: norm1's output feeds the MLP
    with torch.no_grad():
        run(model)
        x = ffn_in[0]
        want = adapterhub_seq_bn(block.mlp(x), x, block.norm2.base_layer, block.norm2.adapter)
        base = block.norm2.base_layer(x + block.mlp(x))  # the block without its adapter
    for h in handles:
        h.remove()
    torch.testing.assert_close(out[0], want, rtol=0, atol=1e-5)
    assert (out[0] - base).abs().max() > 1e-2  # the adapter changed the block


def test_defaults_reduction_factor_16_relu_one_adapter_per_layer_after_the_ffn_norm():
    model, info = apply_peft(tiny("bert-tiny"), "pfeiffer")
    assert info.sites == ["encoder.blocks.0.norm2", "encoder.blocks.1.norm2"]
    adapter = model.encoder.blocks[0].norm2.adapter
    assert adapter.down.weight.shape == (64 // 16, 64) and adapter.act is torch.nn.functional.relu
    assert not any(isinstance(m, AdapterLayer) for m in model.modules())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"encoder.blocks.{i}.norm2.adapter.{w}" for i in (0, 1) for w in
                         ("down.weight", "down.bias", "up.weight", "up.bias")}  # fmt: skip
    assert info.trainable == 2 * (2 * 64 * 4 + 4 + 64)  # the block's LayerNorm stays frozen
    wide = apply_pfeiffer(tiny("bert-tiny"), PfeifferOptions(bottleneck=8))
    assert wide.encoder.blocks[0].norm2.adapter.up.in_features == 8
    assert PfeifferOptions(reduction_factor=3).width(64) == 21 and PfeifferOptions(reduction_factor=100).width(64) == 1


def test_zero_up_projection_keeps_the_base_model_and_training_moves_only_the_adapter():
    base = run(tiny("bert-tiny"))
    model = apply_pfeiffer(tiny("bert-tiny"), PfeifferOptions(zero_init_up=True))
    with torch.no_grad():
        torch.testing.assert_close(run(model), base, rtol=0, atol=1e-6)  # LN(z + 0) = LN(z)
    run(model).square().mean().backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads and all(".adapter." in n for n in grads)


def test_attention_target_goes_after_attention_norm_and_other_targets_are_refused():
    model = apply_pfeiffer(tiny("bert-tiny"), PfeifferOptions(bottleneck=4, targets=["attn.o", "mlp.down"]))
    assert model.peft_config.sites == [f"encoder.blocks.{i}.{n}" for i in (0, 1) for n in ("norm1", "norm2")]
    untouched = tiny("bert-tiny")
    with pytest.raises(LMForgeError) as e:
        apply_pfeiffer(untouched, PfeifferOptions(bottleneck=4, targets=["mlp.up"]))
    assert all(p.requires_grad for p in untouched.parameters()) and getattr(untouched, "peft_config", None) is None
    assert str(e.value) == (
        "pfeiffer.targets: 'encoder.blocks.0.mlp.up' is not a sublayer's output projection (attn.o, cross_attn.o, "
        "mlp.down) of its post-LN block"
    )
    with pytest.raises(LMForgeError, match="^pfeiffer.reduction_factor must be positive, got 0.0$"):
        apply_peft(tiny("bert-tiny"), "pfeiffer", {"reduction_factor": 0})


def test_pre_ln_blocks_keep_the_adapter_on_the_ffn_output():
    """Pre-LN (GPT-2, T5, Llama): no norm closes the sublayer, so the adapter sits after the feed-forward's output
    projection, x + h + adapter(h), not AdapterHub's x + h + adapter(x + h) (its pre-LN models pass no norm)."""
    model = apply_pfeiffer(tiny("gpt-tiny"), PfeifferOptions(init_std=0.3))
    assert model.peft_config.sites == ["decoder.blocks.0.mlp.down", "decoder.blocks.1.mlp.down"]
    block = model.decoder.blocks[0]
    assert block.pre and isinstance(block.mlp.down, AdapterLayer) and not isinstance(block.norm2, PostNormAdapter)


def test_recurrent_and_shared_post_ln_stacks():
    """Transformer-XL's block loop calls the block's norm2 itself; ALBERT's one shared block gets one adapter."""
    xl = apply_pfeiffer(tiny("transformer-xl-tiny"), PfeifferOptions(zero_init_up=True))
    ids = torch.randint(4, 120, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = tiny("transformer-xl-tiny")(ids).last_hidden_state
        torch.testing.assert_close(xl(ids).last_hidden_state, want, rtol=0, atol=1e-6)
        torch.nn.init.normal_(xl.decoder.blocks[0].norm2.adapter.up.weight, std=0.3)
        assert (xl(ids).last_hidden_state - want).abs().max() > 1e-2  # the XL loop goes through the adapter
    albert = apply_pfeiffer(tiny("albert-tiny"), PfeifferOptions(bottleneck=4))
    assert albert.peft_config.sites == ["encoder.blocks.0.norm2"]
    assert isinstance(albert.encoder.blocks[0].norm2, PostNormAdapter)
