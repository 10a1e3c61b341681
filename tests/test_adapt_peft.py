"""`apply_peft` over every method and family: only adapter parameters get gradients; adapter-only checkpoints
reload onto a fresh base model and reproduce its outputs exactly; option validation and errors."""

from __future__ import annotations

import json

import pytest
import torch
from adapt_testing import FAMILIES, V, forward, tiny
from safetensors import safe_open
from torch import nn

from lmforge.adapt import (
    ADAPTERS,
    LoRAOptions,
    adapter_state_dict,
    apply_peft,
    load_adapter,
    save_adapter,
    trainable_parameters,
)
from lmforge.errors import LMForgeError
from lmforge.tasks.heads import SequenceHead
from lmforge.tasks.model import TaskModel

METHODS = ["lora", "houlsby", "pfeiffer", "prefix", "prompt", "topk", "adamix"]
SMALL = {
    "lora": {"rank": 4},
    "houlsby": {"bottleneck": 8},
    "pfeiffer": {"bottleneck": 8},
    "prefix": {"n_prefix": 4, "reparam_hidden": 16},
    "prompt": {"n_prompt": 4},
    "topk": {"k": 1},
    "adamix": {"bottleneck": 8, "n_experts": 2},
}
# Where each method's trainable parameters live (houlsby and adamix also train the layer norms).
OWN = {
    "lora": (".lora_A", ".lora_B"),
    "houlsby": (".adapter.", "norm"),
    "pfeiffer": (".adapter.",),
    "prefix": (".kv_prefix.",),
    "prompt": (".prompt",),
    "topk": ("blocks.1.", "final_norm", "pooler", "head_", "nsp_head", "lm_head.bias"),
    "adamix": (".adapter.", "norm"),
}


def run(model: nn.Module, seed: int = 0) -> torch.Tensor:
    """Every output of a padded batch (hidden states, logits, pooler, NSP logits), flattened into one vector."""
    out = forward(model, seed)
    parts = (out.last_hidden_state, out.logits, out.pooled, out.nsp_logits)
    return torch.cat([t.flatten() for t in parts if t is not None])


def train_steps(model: nn.Module, n: int = 3) -> None:
    """A few AdamW steps so every trainable tensor moves away from its initial value."""
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for i in range(n):
        loss = run(model, seed=i).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", METHODS)
def test_only_adapter_parameters_receive_gradients(family, method):
    model, info = apply_peft(tiny(family), method, SMALL[method])
    model.train()
    train_steps(model, n=1)  # makes zero-initialised factors (LoRA's B, zero up-projections) non-zero
    model.train()
    run(model, seed=5).pow(2).mean().backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(any(s in n for s in OWN[method]) for n in trainable), sorted(trainable)
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, name
        else:
            assert p.grad is None, name
    assert any(p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)
    assert info.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert (info.trainable, info.total) == trainable_parameters(model)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", METHODS)
def test_adapter_checkpoint_reloads_onto_a_fresh_base_exactly(tmp_path, method, family):
    model, info = apply_peft(tiny(family), method, SMALL[method])
    train_steps(model, n=2)
    with torch.no_grad():
        expected = run(model)
    save_adapter(tmp_path, model)
    fresh = tiny(family)  # the same pretrained weights (same seed), no adapter
    with torch.no_grad():
        assert not torch.allclose(run(fresh), expected, atol=1e-4)
    loaded, loaded_info = load_adapter(tmp_path, fresh)
    with torch.no_grad():
        assert torch.equal(run(loaded), expected)
    assert (loaded_info.method, loaded_info.trainable) == (method, info.trainable)
    with safe_open(str(tmp_path / "adapter.safetensors"), "pt") as f:
        assert sorted(f.keys()) == sorted(adapter_state_dict(model))  # adapter weights only
    meta = json.loads((tmp_path / "adapter_config.json").read_text())
    assert meta["method"] == method and meta["trainable"] == info.trainable
    assert {k: meta["options"][k] for k in SMALL[method]} == SMALL[method]


@pytest.mark.parametrize("family", ["bert-tiny", "t5-tiny"])
def test_lora_checkpoint_of_a_task_model_holds_adapter_and_head(tmp_path, family):
    def task_model() -> TaskModel:
        backbone = tiny(family)
        torch.manual_seed(1)
        return TaskModel(backbone, SequenceHead(64, 3, dropout=0.0), "bert").eval()

    model, info = apply_peft(task_model(), "lora", {"rank": 4})
    assert model.head.out.weight.requires_grad and not model.backbone.tok_emb.weight.requires_grad
    batch = {"input_ids": torch.randint(4, V, (2, 6)), "attention_mask": torch.ones(2, 6, dtype=torch.long)}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        nn.functional.cross_entropy(model(batch).logits, torch.tensor([0, 2])).backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        expected = model(batch).logits
    save_adapter(tmp_path, model)
    keys = set(adapter_state_dict(model))
    assert {"head.out.weight", "head.out.bias"} <= keys and all(
        "lora_" in k for k in keys - {"head.out.weight", "head.out.bias"}
    )
    loaded, _ = load_adapter(tmp_path, task_model())
    with torch.no_grad():
        assert torch.equal(loaded(batch).logits, expected)


def test_options_from_dicts_are_validated():
    model, info = apply_peft(tiny("gpt-tiny"), "lora", {"rank": 4, "targets": "o", "alpha": 8})
    assert info.options == LoRAOptions(rank=4, alpha=8.0, targets=["o"])
    assert info.sites == ["decoder.blocks.0.attn.o", "decoder.blocks.1.attn.o"]
    assert (
        str(info)
        == f"peft lora: 1,024 trainable of {info.total:,} parameters ({100 * 1024 / info.total:.3f}%), 2 sites"
    )
    with pytest.raises(LMForgeError, match=r"^unknown config key 'peft.rnak' — did you mean 'peft.rank'\?$"):
        apply_peft(tiny("gpt-tiny"), "lora", {"rnak": 4})
    with pytest.raises(LMForgeError, match=r"^peft.rank: expected an integer, got 'big'$"):
        apply_peft(tiny("gpt-tiny"), "lora", {"rank": "big"})
    with pytest.raises(LMForgeError, match=r"^unknown adapter 'loar' — did you mean 'lora'\?$"):
        apply_peft(tiny("gpt-tiny"), "loar")
    with pytest.raises(LMForgeError, match=r"^peft method 'prefix' takes PrefixOptions, got LoRAOptions$"):
        apply_peft(tiny("gpt-tiny"), "prefix", LoRAOptions())
    assert ADAPTERS.names() == sorted(METHODS)


def test_a_model_is_adapted_once_and_new_modules_follow_its_mode():
    model, _ = apply_peft(tiny("gpt-tiny"), "lora", {"dropout": 0.5})
    assert not model.decoder.blocks[0].attn.qkv.training and not model.decoder.blocks[0].attn.qkv.dropout.training
    with pytest.raises(LMForgeError, match=r"^the model is already adapted with 'lora'$"):
        apply_peft(model, "houlsby")


def test_loading_errors(tmp_path):
    with pytest.raises(LMForgeError, match=r"^no adapter_config.json in .*: not an adapter directory$"):
        load_adapter(tmp_path, tiny("gpt-tiny"))
    model, _ = apply_peft(tiny("gpt-tiny"), "lora", {"rank": 4})
    save_adapter(tmp_path, model)
    with pytest.raises(LMForgeError, match=r"^adapter .* needs a base model with arch=decoder, this one has encoder$"):
        load_adapter(tmp_path, tiny("bert-tiny"))
    meta = json.loads((tmp_path / "adapter_config.json").read_text())
    meta["options"]["rank"] = 2  # options that no longer match the saved weights
    (tmp_path / "adapter_config.json").write_text(json.dumps(meta))
    with pytest.raises(LMForgeError, match=r"'decoder.blocks.0.attn.qkv.lora_A' has shape \(4, 64\), not \(2, 64\)$"):
        load_adapter(tmp_path, tiny("gpt-tiny"))
    with pytest.raises(LMForgeError, match=r"^the model has no adaptation method applied: nothing to save"):
        save_adapter(tmp_path / "other", tiny("gpt-tiny"))
