"""Hugging Face checkpoint conversion: config.json + state-dict names, per model family.

Each converter maps a `transformers` config dict to a ModelConfig and back, and renames/reshapes tensors both
ways; `CONVERTERS` is keyed by the HF `model_type`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.models.config import ModelConfig

StateDict = dict[str, Tensor]


class Converter(Protocol):
    model_type: str

    def config_from_hf(self, hf: dict) -> ModelConfig: ...
    def config_to_hf(self, cfg: ModelConfig) -> dict: ...
    def state_from_hf(self, sd: StateDict, cfg: ModelConfig) -> StateDict: ...
    def state_to_hf(self, sd: StateDict, cfg: ModelConfig) -> StateDict: ...


CONVERTERS: dict[str, Converter] = {}


def register(conv: Converter) -> Converter:
    CONVERTERS[conv.model_type] = conv
    return conv


def converter_for(model_type: str) -> Converter:
    if model_type not in CONVERTERS:
        known = ", ".join(sorted(CONVERTERS))
        raise LMForgeError(f"no converter for Hugging Face model_type '{model_type}' (supported: {known})")
    return CONVERTERS[model_type]


def family_of(cfg: ModelConfig) -> str:
    """The HF model_type an lmforge config exports to."""
    for conv in CONVERTERS.values():
        if conv.matches(cfg):  # type: ignore[attr-defined]
            return conv.model_type
    raise LMForgeError(f"model '{cfg.name}' has no Hugging Face equivalent to export to")


@dataclass
class GPT2Converter:
    """GPT-2: fused c_attn Conv1D weights are stored (in, out), the transpose of nn.Linear's."""

    model_type: str = "gpt2"

    def matches(self, cfg: ModelConfig) -> bool:
        return (
            cfg.arch == "decoder"
            and cfg.norm_position == "pre"
            and cfg.norm == "layernorm"
            and cfg.position == "learned"
            and cfg.activation == "gelu_tanh"
            and cfg.bias
            and cfg.tie_embeddings
        )

    def config_from_hf(self, hf: dict) -> ModelConfig:
        return ModelConfig(
            name=hf.get("_name_or_path") or "gpt2",
            arch="decoder",
            vocab_size=hf["vocab_size"],
            d_model=hf["n_embd"],
            n_layers=hf["n_layer"],
            n_heads=hf["n_head"],
            d_ff=hf.get("n_inner") or 4 * hf["n_embd"],
            max_seq_len=hf["n_positions"],
            norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            activation="gelu_tanh",
            position="learned",
        )

    def config_to_hf(self, cfg: ModelConfig) -> dict:
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "vocab_size": cfg.vocab_size,
            "n_embd": cfg.d_model,
            "n_layer": cfg.n_layers,
            "n_head": cfg.n_heads,
            "n_inner": cfg.d_ff,
            "n_positions": cfg.max_seq_len,
            "layer_norm_epsilon": cfg.norm_eps,
            "activation_function": "gelu_new",
            "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.attn_dropout,
            "tie_word_embeddings": True,
        }

    def _pairs(self, cfg: ModelConfig) -> list[tuple[str, str, bool]]:
        """(lmforge name, HF name, transpose) for every tensor."""
        p = [("tok_emb.weight", "transformer.wte.weight", False)]
        p.append(("decoder.pos_emb.emb.weight", "transformer.wpe.weight", False))
        for i in range(cfg.n_layers):
            a, b = f"decoder.blocks.{i}.", f"transformer.h.{i}."
            for ours, theirs, t in [
                ("norm1", "ln_1", False),
                ("attn.qkv", "attn.c_attn", True),
                ("attn.o", "attn.c_proj", True),
                ("norm2", "ln_2", False),
                ("mlp.up", "mlp.c_fc", True),
                ("mlp.down", "mlp.c_proj", True),
            ]:
                p.append((f"{a}{ours}.weight", f"{b}{theirs}.weight", t))
                p.append((f"{a}{ours}.bias", f"{b}{theirs}.bias", False))
        p += [("decoder.final_norm.weight", "transformer.ln_f.weight", False)]
        p += [("decoder.final_norm.bias", "transformer.ln_f.bias", False)]
        return p

    def state_from_hf(self, sd: StateDict, cfg: ModelConfig) -> StateDict:
        return _rename(sd, [(theirs, ours, t) for ours, theirs, t in self._pairs(cfg)])

    def state_to_hf(self, sd: StateDict, cfg: ModelConfig) -> StateDict:
        out = _rename(sd, self._pairs(cfg))
        out["lm_head.weight"] = out["transformer.wte.weight"]
        return out


def _rename(sd: StateDict, pairs: list[tuple[str, str, bool]]) -> StateDict:
    out: StateDict = {}
    for src, dst, transpose in pairs:
        if src not in sd:
            raise LMForgeError(f"checkpoint is missing tensor '{src}'")
        t = sd[src]
        out[dst] = t.t().contiguous() if transpose else t
    return out


register(GPT2Converter())


def to_hf_model(model: torch.nn.Module):
    """Build the equivalent `transformers` model with identical weights (for parity tests and export)."""
    import transformers

    cfg: ModelConfig = model.config
    conv = CONVERTERS[family_of(cfg)]
    hf_cfg = conv.config_to_hf(cfg)
    config = transformers.AutoConfig.for_model(**hf_cfg)
    hf_model = transformers.AutoModelForCausalLM.from_config(config)
    sd = conv.state_to_hf(model.state_dict(), cfg)
    missing, unexpected = hf_model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith(("attn.bias", "attn.masked_bias"))]
    if missing or unexpected:
        raise LMForgeError(f"conversion mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return hf_model.eval()
