"""LoRA: target patterns, exact merge/unmerge, unloading back to the original module tree, shared layers and the
trainable-parameter fraction of real-size models."""

from __future__ import annotations

import pytest
import torch
from adapt_testing import FAMILIES, run, tiny
from torch import nn

from lmforge.adapt import (
    LoRALinear,
    LoRAOptions,
    apply_lora,
    apply_peft,
    matches,
    merge_and_unload,
    merge_lora,
    trainable_parameters,
    unmerge_lora,
)
from lmforge.errors import LMForgeError
from lmforge.models import Transformer, get_preset


@torch.no_grad()
def randomize_lora(model: nn.Module, seed: int = 1) -> None:
    """B starts at zero (a no-op update); give it values so merging has something to fold in."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, LoRALinear):
            m.lora_B.copy_(0.1 * torch.randn(m.lora_B.shape, generator=g))


@pytest.mark.parametrize(
    "name, pattern, expected",
    [
        ("decoder.blocks.0.attn.qkv", "qkv", True),
        ("decoder.blocks.0.attn.qkv", "attn.*", True),
        ("decoder.blocks.0.cross_attn.q", "attn.*", False),
        ("decoder.blocks.0.cross_attn.q", "*attn.q", True),
        ("decoder.blocks.1.mlp.up", "blocks.1.mlp.up", True),
        ("decoder.blocks.0.mlp.up", "blocks.1.mlp.up", False),
        ("decoder.blocks.0.mlp.up", "mlp", False),
        ("head.out", "decoder.blocks.0.mlp.out", False),
    ],
)
def test_target_patterns_match_the_end_of_module_names(name, pattern, expected):
    assert matches(name, pattern) is expected


def test_lora_init_is_kaiming_a_zero_b_and_a_no_op():
    base = tiny("gpt-tiny")
    model = apply_lora(tiny("gpt-tiny"), LoRAOptions(rank=4, alpha=8.0))
    layer = model.decoder.blocks[0].attn.qkv
    assert isinstance(layer, LoRALinear) and layer.scaling == 2.0
    assert layer.lora_A.shape == (4, 64) and layer.lora_B.shape == (192, 4)
    assert torch.count_nonzero(layer.lora_B) == 0
    bound = 1 / 64**0.5  # kaiming_uniform(a=sqrt(5)) on fan_in 64, as nn.Linear
    assert 0.8 * bound < layer.lora_A.abs().max() <= bound
    torch.testing.assert_close(run(model), run(base), rtol=0, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_merged_forward_equals_unmerged(family):
    model = apply_lora(tiny(family), LoRAOptions(rank=8, alpha=16.0))
    randomize_lora(model)
    o = (model.encoder if family == "bert-tiny" else model.decoder).blocks[0].attn.o
    base_weight = o.base_layer.weight.detach().clone()
    with torch.no_grad():
        unmerged = run(model)
        assert not torch.allclose(unmerged, run(tiny(family)), atol=1e-3)  # the update does change the output
        merge_lora(model)
        merged = run(model)
        assert not torch.equal(o.base_layer.weight, base_weight)
        unmerge_lora(model)
        again = run(model)
    torch.testing.assert_close(merged, unmerged, rtol=0, atol=1e-5)
    torch.testing.assert_close(again, unmerged, rtol=0, atol=1e-5)
    torch.testing.assert_close(o.base_layer.weight, base_weight, rtol=0, atol=1e-6)


def test_merge_and_unload_restores_the_original_module_tree():
    base = tiny("t5-tiny")
    model = apply_lora(tiny("t5-tiny"))
    randomize_lora(model)
    with torch.no_grad():
        expected = run(model)
    merge_and_unload(model)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert list(model.state_dict()) == list(base.state_dict())
    assert all(p.requires_grad for p in model.parameters()) and model.peft_config is None
    with torch.no_grad():
        torch.testing.assert_close(run(model), expected, rtol=0, atol=1e-5)


def test_default_targets_cover_self_and_cross_attention_only():
    model = apply_lora(tiny("t5-tiny"))
    wrapped = sorted({n.split(".", 3)[-1] for n, m in model.named_modules() if isinstance(m, LoRALinear)})
    assert wrapped == ["attn.o", "attn.qkv", "cross_attn.kv", "cross_attn.o", "cross_attn.q"]
    assert len(model.peft_config.sites) == 2 * 2 + 2 * 5  # encoder: qkv, o; decoder: qkv, o, q, kv, o


def test_custom_targets_and_no_match_error():
    model = apply_lora(tiny("gpt-tiny"), LoRAOptions(targets=["blocks.1.mlp.*"]))
    assert model.peft_config.sites == ["decoder.blocks.1.mlp.up", "decoder.blocks.1.mlp.down"]
    with pytest.raises(LMForgeError, match=r"^lora.targets \['nothing'\] match no Linear layer of the model$"):
        apply_lora(tiny("gpt-tiny"), LoRAOptions(targets=["nothing"]))
    with pytest.raises(LMForgeError, match="^lora.rank must be positive, got 0$"):
        apply_lora(tiny("gpt-tiny"), LoRAOptions(rank=0))


def test_shared_layers_keep_sharing_one_adapter():
    # ALBERT reuses one block for every layer; T5 "shared" reuses the encoder's layers in the decoder.
    albert = apply_lora(tiny("albert-tiny"))
    assert len({id(m) for m in albert.modules() if isinstance(m, LoRALinear)}) == 2
    shared = apply_lora(tiny("t5-tiny", share_encoder_decoder=True))
    assert shared.decoder.blocks[1].attn.qkv is shared.encoder.blocks[1].attn.qkv
    assert isinstance(shared.decoder.blocks[1].attn.qkv, LoRALinear)
    randomize_lora(shared)
    with torch.no_grad():
        before = run(shared)
        merge_lora(shared)  # a shared layer must merge once, not once per reference
        torch.testing.assert_close(run(shared), before, rtol=0, atol=1e-5)


@pytest.mark.parametrize("preset, published", [("gpt2-124m", 124_439_808), ("bert-base", 110_106_428)])
def test_lora_r8_on_attention_trains_a_fraction_of_a_percent(preset, published):
    # Real sizes, built on the meta device (shapes only, no memory): 12 layers of d_model 768.
    with torch.device("meta"):
        model = Transformer(get_preset(preset))
    n_base = model.num_params()
    model, info = apply_peft(model, "lora", {"rank": 8})
    per_layer = 8 * (768 + 3 * 768) + 8 * (768 + 768)  # qkv: r(d + 3d), o: r(d + d)
    assert (info.trainable, info.total) == (12 * per_layer, n_base + 12 * per_layer) == trainable_parameters(model)
    assert 0.001 < info.fraction < 0.01
    assert abs(n_base - published) / published < 0.01
