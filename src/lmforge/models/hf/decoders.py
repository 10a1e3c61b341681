"""Decoder families: GPT-2, GPT-1 (`openai-gpt`) and Llama."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.models import families
from lmforge.models.config import ModelConfig
from lmforge.models.hf.base import (
    ActNames,
    Converter,
    Pair,
    StateDict,
    act_from_hf,
    act_to_hf,
    build,
    linear,
    register,
)


def add_prefix(sd: StateDict, prefix: str, owned: tuple[str, ...]) -> StateDict:
    """Checkpoints saved from a bare base model (GPT2Model, BertModel) lack the task model's prefix."""
    if any(k.startswith(prefix) for k in sd):
        return sd
    return {(prefix + k if k.startswith(owned) else k): v for k, v in sd.items()}


# transformers' OpenAIGPT does not use ACT2FN but its own table (models/openai/modeling_openai.py, ACT_FNS), in
# which "gelu" is the tanh approximation (`gelu_new`), as in the original GPT-1 code; it has no exact GELU.
GPT1_ACT_NAMES = ActNames(
    "afn",
    from_hf={"gelu": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"},
    to_hf={"gelu_tanh": "gelu", "relu": "relu", "silu": "silu"},
    note="; its afn 'gelu' is the tanh approximation",
)
# Llama's MLP is act(gate) * up with ACT2FN[hidden_act]: silu gives our SwiGLU, a tanh GELU our GeGLU (Gemma's).
LLAMA_ACT_NAMES = ActNames(
    "hidden_act",
    from_hf={"silu": "swiglu", "swish": "swiglu", "gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"},
    to_hf={"swiglu": "silu", "geglu": "gelu_pytorch_tanh"},
)


def _qkv_split(cfg: ModelConfig) -> tuple[int, int, int]:
    q, kv = cfg.n_heads * cfg.dim_head, cfg.kv_heads * cfg.dim_head
    return q, kv, kv


class _GPTBase(Converter):
    """GPT-1 and GPT-2 share names: Conv1D weights stored (in, out), one fused c_attn."""

    arch = "decoder"
    emb = ("wte", "wpe")
    final_norm = "ln_f"

    def pairs(self, cfg: ModelConfig) -> list[Pair]:
        wte, wpe = self.emb
        p = [Pair("tok_emb.weight", (f"transformer.{wte}.weight",))]
        p.append(Pair("decoder.pos_emb.emb.weight", (f"transformer.{wpe}.weight",)))
        for i in range(cfg.n_layers):
            a, b = f"decoder.blocks.{i}.", f"transformer.h.{i}."
            p += linear(f"{a}norm1", f"{b}ln_1", True)
            p += linear(f"{a}attn.qkv", f"{b}attn.c_attn", True, t=True)
            p += linear(f"{a}attn.o", f"{b}attn.c_proj", True, t=True)
            p += linear(f"{a}norm2", f"{b}ln_2", True)
            p += linear(f"{a}mlp.up", f"{b}mlp.c_fc", True, t=True)
            p += linear(f"{a}mlp.down", f"{b}mlp.c_proj", True, t=True)
        if cfg.final_norm:
            p += linear("decoder.final_norm", f"transformer.{self.final_norm}", True)
        if not cfg.tie_embeddings:
            p.append(Pair("lm_head.weight", ("lm_head.weight",)))
        return p

    def normalize(self, sd: StateDict) -> StateDict:
        return add_prefix(sd, "transformer.", ("h.", *self.emb, self.final_norm))

    def auto_class(self, cfg: ModelConfig) -> str:
        return "AutoModelForCausalLM"


class GPT2Converter(_GPTBase):
    model_type = "gpt2"

    def config_from_hf(self, hf: dict, sd: Mapping[str, Tensor]) -> ModelConfig:
        for flag in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
            if hf.get(flag):
                raise LMForgeError(f"Hugging Face gpt2 option {flag}=true is not supported")
        return build(
            families.GPT2,
            name="gpt2",
            tie_embeddings=hf.get("tie_word_embeddings", True),
            vocab_size=hf["vocab_size"],
            d_model=hf["n_embd"],
            n_layers=hf["n_layer"],
            n_heads=hf["n_head"],
            d_ff=hf.get("n_inner") or 4 * hf["n_embd"],
            max_seq_len=hf["n_positions"],
            norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            activation=act_from_hf(hf.get("activation_function", "gelu_new"), "gpt2"),
            scale_attention=hf.get("scale_attn_weights", True),
            dropout=hf.get("resid_pdrop", 0.1),
            attn_dropout=hf.get("attn_pdrop", 0.1),
            init_std=hf.get("initializer_range", 0.02),
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
            "activation_function": act_to_hf(cfg.activation, "gpt2"),
            "scale_attn_weights": cfg.scale_attention,
            "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.attn_dropout,
            "initializer_range": cfg.init_std,
            "tie_word_embeddings": cfg.tie_embeddings,
        }


class OpenAIGPTConverter(_GPTBase):
    """GPT-1: post-LN blocks, no final norm, FFN fixed at 4 * d_model."""

    model_type = "openai-gpt"
    emb = ("tokens_embed", "positions_embed")
    activations = tuple(GPT1_ACT_NAMES.to_hf)

    def config_from_hf(self, hf: dict, sd: Mapping[str, Tensor]) -> ModelConfig:
        return build(
            families.GPT1,
            name="openai-gpt",
            vocab_size=hf["vocab_size"],
            d_model=hf["n_embd"],
            n_layers=hf["n_layer"],
            n_heads=hf["n_head"],
            d_ff=4 * hf["n_embd"],
            max_seq_len=hf["n_positions"],
            norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            activation=act_from_hf(hf.get("afn", "gelu"), "openai-gpt", GPT1_ACT_NAMES),
            dropout=hf.get("resid_pdrop", 0.1),
            attn_dropout=hf.get("attn_pdrop", 0.1),
            init_std=hf.get("initializer_range", 0.02),
        )

    def config_to_hf(self, cfg: ModelConfig) -> dict:
        return {
            "model_type": "openai-gpt",
            "architectures": ["OpenAIGPTLMHeadModel"],
            "vocab_size": cfg.vocab_size,
            "n_embd": cfg.d_model,
            "n_layer": cfg.n_layers,
            "n_head": cfg.n_heads,
            "n_positions": cfg.max_seq_len,
            "layer_norm_epsilon": cfg.norm_eps,
            "afn": act_to_hf(cfg.activation, "openai-gpt", GPT1_ACT_NAMES),
            "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.attn_dropout,
            "initializer_range": cfg.init_std,
        }


class LlamaConverter(Converter):
    """Llama: separate q/k/v/o and gate/up/down projections, RMSNorm, RoPE in the rotate_half layout."""

    model_type = "llama"
    arch = "decoder"
    activations = tuple(LLAMA_ACT_NAMES.to_hf)

    def config_from_hf(self, hf: dict, sd: Mapping[str, Tensor]) -> ModelConfig:
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise LMForgeError(f"Hugging Face llama rope_type '{rope.get('rope_type')}' is not supported")
        bias = hf.get("attention_bias", False)
        if hf.get("mlp_bias", False) != bias:
            raise LMForgeError("Hugging Face llama with attention_bias != mlp_bias is not supported")
        d, heads = hf["hidden_size"], hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or d // heads
        return build(
            families.LLAMA,
            name="llama",
            activation=act_from_hf(hf.get("hidden_act", "silu"), "llama", LLAMA_ACT_NAMES),
            bias=bias,
            tie_embeddings=hf.get("tie_word_embeddings", False),
            vocab_size=hf["vocab_size"],
            d_model=d,
            n_layers=hf["num_hidden_layers"],
            n_heads=heads,
            n_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=None if head_dim == d // heads else head_dim,
            d_ff=hf["intermediate_size"],
            max_seq_len=hf.get("max_position_embeddings", 2048),
            norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_base=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
            attn_dropout=hf.get("attention_dropout", 0.0),
            init_std=hf.get("initializer_range", 0.02),
            pad_id=hf.get("pad_token_id") or 0,
        )

    def config_to_hf(self, cfg: ModelConfig) -> dict:
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model,
            "intermediate_size": cfg.d_ff,
            "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.kv_heads,
            "head_dim": cfg.dim_head,
            "max_position_embeddings": cfg.max_seq_len,
            "rms_norm_eps": cfg.norm_eps,
            "hidden_act": act_to_hf(cfg.activation, "llama", LLAMA_ACT_NAMES),
            "rope_theta": cfg.rope_base,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
            "attention_bias": cfg.bias,
            "mlp_bias": cfg.bias,
            "attention_dropout": cfg.attn_dropout,
            "initializer_range": cfg.init_std,
            "tie_word_embeddings": cfg.tie_embeddings,
        }

    def pairs(self, cfg: ModelConfig) -> list[Pair]:
        p = [Pair("tok_emb.weight", ("model.embed_tokens.weight",))]
        for i in range(cfg.n_layers):
            a, b = f"decoder.blocks.{i}.", f"model.layers.{i}."
            qkv = [f"{b}self_attn.{n}_proj" for n in "qkv"]
            p += linear(f"{a}attn.qkv", qkv, cfg.bias, split=_qkv_split(cfg))
            p += linear(f"{a}attn.o", f"{b}self_attn.o_proj", cfg.bias)
            p += linear(f"{a}mlp.gate", f"{b}mlp.gate_proj", cfg.bias)
            p += linear(f"{a}mlp.up", f"{b}mlp.up_proj", cfg.bias)
            p += linear(f"{a}mlp.down", f"{b}mlp.down_proj", cfg.bias)
            p += linear(f"{a}norm1", f"{b}input_layernorm", False)
            p += linear(f"{a}norm2", f"{b}post_attention_layernorm", False)
        p += linear("decoder.final_norm", "model.norm", False)
        if not cfg.tie_embeddings:
            p.append(Pair("lm_head.weight", ("lm_head.weight",)))
        return p

    def normalize(self, sd: StateDict) -> StateDict:
        return add_prefix(sd, "model.", ("layers.", "embed_tokens.", "norm."))

    def auto_class(self, cfg: ModelConfig) -> str:
        return "AutoModelForCausalLM"


register(GPT2Converter())
register(OpenAIGPTConverter())
register(LlamaConverter())
