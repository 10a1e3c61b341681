"""Position schemes as stack components (models/position_components.py): one component per scheme, built once per
stack through the one table, and no string comparison of `position` left in the stack, its layers or the static
cache."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from lmforge.models import Transformer, get_preset
from lmforge.models.position_components import POSITIONS, Positions, Rotary, build_positions
from lmforge.models.position_schemes import POSITION_SCHEMES

MODELS = Path(__file__).resolve().parents[1] / "src" / "lmforge" / "models"
# The same pattern test_model_facts.py holds code outside models/ to.
POSITION_CHECK = re.compile(r"\bposition\s*(==|!=|not\s+in\b|in\b)")

# A small config of each scheme: (preset, overrides).
CONFIGS = {
    "learned": ("bart-tiny", {}),
    "sinusoidal": ("llama-tiny", {"position": "sinusoidal"}),
    "rope": ("llama-tiny", {}),
    "alibi": ("llama-tiny", {"position": "alibi"}),
    "t5_bias": ("t5-tiny", {}),
    "shaw": ("transformer-shaw-tiny", {}),
    "xl": ("transformer-xl-tiny", {}),
    "none": ("llama-tiny", {"position": "none"}),
}
LAYER_MODULES = {"rope": "rope", "shaw": "shaw", "xl": "rel"}
"""The attribute each scheme's per-layer module takes on a self-attention layer."""


def _stacks(model: Transformer) -> list:
    return [s for s in (getattr(model, "encoder", None), getattr(model, "decoder", None)) if s is not None]


def test_one_component_per_scheme():
    assert list(POSITIONS) == list(POSITION_SCHEMES) == list(CONFIGS)
    for name, cls in POSITIONS.items():
        assert issubclass(cls, Positions)
        assert cls.name == name and cls.scheme is POSITION_SCHEMES[name]


@pytest.mark.parametrize("scheme", list(CONFIGS))
def test_each_stack_builds_its_component_once_through_the_table(scheme, monkeypatch):
    preset, overrides = CONFIGS[scheme]
    cfg = get_preset(preset, **overrides)
    assert cfg.position == scheme
    built: list[Positions] = []

    class Counting(POSITIONS[scheme]):
        @classmethod
        def build(cls, cfg, kind):
            component = super().build(cfg, kind)
            built.append(component)
            return component

    monkeypatch.setitem(POSITIONS, scheme, Counting)
    model = Transformer(cfg)
    stacks = _stacks(model)
    assert len(built) == len(stacks) > 0
    for stack, component in zip(stacks, built):
        assert stack.pos is component and isinstance(component, Counting)
        assert getattr(stack, component.attr) is component  # registered under its own name
        assert component.max_positions(cfg) == cfg.max_positions
        attn = stack.blocks[0].attn
        layer_attr = LAYER_MODULES.get(scheme)
        for attr in LAYER_MODULES.values():
            module = getattr(attn, attr, None)
            assert (module is not None) == (attr == layer_attr), (scheme, attr)


def test_parameters_keep_their_checkpoint_names():
    learned = Transformer(get_preset("bart-tiny"))
    assert "decoder.pos_emb.emb.weight" in learned.state_dict()
    t5 = Transformer(get_preset("t5-tiny"))
    assert "encoder.rel_bias.relative_attention_bias.weight" in t5.state_dict()
    assert t5.encoder.rel_bias.bidirectional and not t5.decoder.rel_bias.bidirectional
    llama = Transformer(get_preset("llama-tiny"))
    assert "decoder.blocks.0.attn.rope.inv_freq" in dict(llama.named_buffers())
    alibi = Transformer(get_preset("llama-tiny", position="alibi"))
    assert not any("slopes" in k for k in alibi.state_dict())  # derived from n_heads: never in a checkpoint


def test_hooks_of_the_stateless_schemes_change_nothing():
    cfg = get_preset("llama-tiny")
    component = build_positions(cfg, "causal")
    assert type(component) is Rotary and not list(component.parameters())
    x = torch.randn(2, 5, cfg.d_model)
    index = torch.arange(5)
    assert component.embed(x, index) is x
    assert component.attention_bias(index, index, 0, causal=True) is None
    assert component.step_bias(torch.tensor([3]), torch.arange(8)) is None


def test_alibi_step_bias_is_the_last_row_of_the_full_bias():
    component = build_positions(get_preset("llama-tiny", position="alibi"), "causal")
    index = torch.arange(8)
    full = component.attention_bias(index, index, 0, causal=True)  # (1, H, 8, 8)
    step = component.step_bias(torch.tensor([5]), index)  # (1, H, 1, 8)
    assert torch.equal(step, full[:, :, 5:6])


def test_t5_step_bias_is_the_row_of_the_full_bias():
    component = build_positions(get_preset("t5-tiny"), "causal")
    index = torch.arange(8)
    full = component.attention_bias(index, index, 0, causal=True)
    step = component.step_bias(torch.tensor([5]), index)
    assert torch.equal(step, full[:, :, 5:6])


@pytest.mark.parametrize("file", ["stack.py", "layers.py", "static_cache.py"])
def test_no_position_string_checks_in_the_stack(file):
    lines = (MODELS / file).read_text(encoding="utf-8").splitlines()
    hits = [f"{file}:{n}: {line.strip()}" for n, line in enumerate(lines, start=1) if POSITION_CHECK.search(line)]
    assert hits == []


def test_the_grep_can_fail():
    assert POSITION_CHECK.search('if cfg.position == "learned":')
    assert POSITION_CHECK.search('self.cfg.position != "shaw"')
    assert not POSITION_CHECK.search('self.pre = cfg.norm_position == "pre"')
