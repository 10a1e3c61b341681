"""Activation names in Hugging Face configs: every name lmforge writes is one the transformers model accepts and
computes as the same function (GPT-1's `afn: gelu` is the tanh GELU), and what a family cannot compute is refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from model_testing import V, tiny

from lmforge.errors import LMForgeError
from lmforge.models import Transformer, get_preset
from lmforge.models.hf import export_hf, import_hf, to_hf_model
from lmforge.models.hf.base import converter_for, converter_of
from lmforge.models.layers import activation_fn

# One tiny preset per converter: its model_type, and where the bare transformers model (AutoModel) keeps layer 0's
# MLP activation (the gate's, for gated MLPs).
FAMILIES = {
    "gpt-tiny": ("gpt2", "h.0.mlp.act"),
    "gpt1-tiny": ("openai-gpt", "h.0.mlp.act"),
    "llama-tiny": ("llama", "layers.0.mlp.act_fn"),
    "bert-tiny": ("bert", "encoder.layer.0.intermediate.intermediate_act_fn"),
    "roberta-tiny": ("roberta", "encoder.layer.0.intermediate.intermediate_act_fn"),
    "electra-tiny": ("electra", "encoder.layer.0.intermediate.intermediate_act_fn"),
    "albert-tiny": ("albert", "encoder.albert_layer_groups.0.albert_layers.0.activation"),
    "bart-tiny": ("bart", "encoder.layers.0.activation_fn"),
    "t5-tiny": ("t5", "encoder.block.0.layer.1.DenseReluDense.act"),
    "xlnet-tiny": ("xlnet", "layer.0.ff.activation_function"),
}
HEADLESS = {"lm_head": False, "lm_head_transform": False}
"""RoBERTa's MLM head always applies exact GELU in transformers: its layers' other activations are checked bare."""


def _config(preset: str, activation: str):
    extra = HEADLESS if preset == "roberta-tiny" and activation != "gelu" else {}
    return get_preset(preset, vocab_size=V, activation=activation, **extra)


def _cases() -> list[tuple[str, str]]:
    return [(preset, act) for preset, (family, _) in FAMILIES.items() for act in converter_for(family).activations]


def _walk(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


@pytest.mark.parametrize("preset,activation", _cases())
def test_every_activation_written_is_read_by_transformers_as_the_same_function(preset, activation):
    cfg = _config(preset, activation)
    with torch.device("meta"):
        sd = Transformer(cfg).state_dict()
    conv = converter_of(cfg, sd)
    assert conv.model_type == FAMILIES[preset][0]  # the family still takes the model with this activation
    hf_cfg = transformers.AutoConfig.for_model(**conv.config_to_hf(cfg))
    hf = transformers.AutoModel.from_config(hf_cfg)  # raises on a name the model does not know
    theirs = _walk(hf, FAMILIES[preset][1])
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 4  # |x| up to ~15: tanh GELU != GELU
    torch.testing.assert_close(theirs(x), activation_fn(activation)(x), atol=1e-6, rtol=1e-6)
    assert conv.config_from_hf(conv.config_to_hf(cfg), conv.state_to_hf(sd, cfg)).activation == activation


def test_the_check_tells_gelu_from_tanh_gelu():
    x = torch.linspace(-6, 6, 1001)
    assert (activation_fn("gelu")(x) - activation_fn("gelu_tanh")(x)).abs().max() > 1e-4


@torch.no_grad()
def _stress_mlp(model: Transformer) -> Transformer:
    """Pre-activations of std ~3 and a large down projection: GELU's two forms then differ in the logits."""
    g = torch.Generator().manual_seed(2)
    for block in model.decoder.blocks:
        block.mlp.up.weight.copy_(torch.randn(block.mlp.up.weight.shape, generator=g) * 3 / model.config.d_model**0.5)
        block.mlp.down.weight.mul_(10)
    return model


def _max_logit_error(ours: Transformer, hf) -> float:
    ids = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = ours(ids).logits, hf(input_ids=ids).logits
    assert a.std() > 0.1  # logits of real size
    return float((a - b).abs().max())


def test_gpt1_exports_tanh_gelu_as_afn_gelu_and_matches_transformers_with_a_stressed_mlp(tmp_path):
    model = _stress_mlp(tiny("gpt1-tiny", activation="gelu_tanh"))
    export_hf(model, tmp_path)
    assert transformers.AutoConfig.from_pretrained(tmp_path).afn == "gelu"
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert _max_logit_error(model, hf) <= 1e-6
    # The same weights with exact GELU are measurably off: the bound above can fail.
    exact = Transformer(dataclasses.replace(model.config, activation="gelu")).eval()
    exact.load_state_dict(model.state_dict())
    assert _max_logit_error(exact, hf) > 1e-5


def test_gpt1_imports_afn_gelu_as_tanh_gelu(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.OpenAIGPTConfig(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    assert cfg.afn == "gelu"
    transformers.OpenAIGPTLMHeadModel(cfg).save_pretrained(tmp_path)
    ours = _stress_mlp(import_hf(tmp_path))
    assert ours.config.activation == "gelu_tanh"
    assert _max_logit_error(ours, to_hf_model(ours)) <= 1e-6


@pytest.mark.parametrize(
    "preset,activation,line",
    [
        ("gpt1-tiny", "gelu", "model 'gpt1-tiny' has no Hugging Face equivalent: Hugging Face openai-gpt cannot "
         "compute activation 'gelu' (it computes gelu_tanh, relu, silu); its afn 'gelu' is the tanh approximation"),
        ("roberta-tiny", "gelu_tanh", "model 'roberta-tiny' has no Hugging Face equivalent: Hugging Face roberta "
         "with an MLM head needs activation 'gelu': transformers' RobertaForMaskedLM applies it in the head whatever "
         "hidden_act says, lmforge's head uses 'gelu_tanh' like the layers"),
        ("electra-tiny-generator", "relu", "model 'electra-tiny-generator' has no Hugging Face equivalent: Hugging "
         "Face electra with an MLM head needs activation 'gelu': transformers' ElectraForMaskedLM applies it in the "
         "head whatever hidden_act says, lmforge's head uses 'relu' like the layers"),
    ],
)  # fmt: skip
def test_an_activation_the_family_cannot_compute_is_refused_in_one_line(preset, activation, line, tmp_path):
    model = Transformer(get_preset(preset, vocab_size=V, activation=activation))
    with pytest.raises(LMForgeError) as e:
        export_hf(model, tmp_path)
    assert str(e.value) == line and not any(tmp_path.iterdir())
