"""Encoder-decoder families: BART and T5 (v1.0 and v1.1)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.models import families
from lmforge.models.config import ModelConfig
from lmforge.models.hf.base import (
    ACT2FN_NAMES,
    Converter,
    Pair,
    StateDict,
    act_from_hf,
    act_to_hf,
    build,
    linear,
    register,
)
from lmforge.models.hf.decoders import add_prefix


def _same(hf: dict, a: str, b: str, model_type: str) -> int:
    if hf.get(b, hf[a]) != hf[a]:
        raise LMForgeError(f"Hugging Face {model_type} with {a} != {b} is not supported")
    return hf[a]


def _alias(sd: StateDict, name: str, fallback: str) -> StateDict:
    """Tied embeddings may be stored under only one of their names."""
    if name not in sd and fallback in sd:
        sd = {**sd, name: sd[fallback]}
    return sd


def _tied(head: Tensor | None, shared: Tensor | None) -> bool:
    """A head absent from the checkpoint, or equal to the embedding, is tied (shapes-only tensors: by absence)."""
    if head is None or head is shared:
        return True
    if shared is None or head.is_meta or shared.is_meta:
        return False
    return head.shape == shared.shape and torch.equal(head, shared)


def _kv_split(cfg: ModelConfig) -> tuple[int, int]:
    kv = cfg.kv_heads * cfg.dim_head
    return kv, kv


class BartConverter(Converter):
    """BART: fairseq names (q_proj/k_proj/v_proj/out_proj, fc1/fc2), learned positions with 2 offset rows."""

    model_type = "bart"
    arch = "encoder-decoder"

    def config_from_hf(self, hf: dict, sd: Mapping[str, Tensor]) -> ModelConfig:
        return build(
            families.BART,
            name="bart",
            vocab_size=hf["vocab_size"],
            d_model=hf["d_model"],
            n_layers=hf["encoder_layers"],
            n_decoder_layers=hf.get("decoder_layers", hf["encoder_layers"]),
            n_heads=_same(hf, "encoder_attention_heads", "decoder_attention_heads", "bart"),
            d_ff=_same(hf, "encoder_ffn_dim", "decoder_ffn_dim", "bart"),
            max_seq_len=hf["max_position_embeddings"],
            activation=act_from_hf(hf.get("activation_function", "gelu"), "bart"),
            scale_embeddings=bool(hf.get("scale_embedding", False)),
            tie_embeddings=hf.get("tie_word_embeddings", True),
            lm_head_bias="final_logits_bias" in sd,
            dropout=hf.get("dropout", 0.1),
            attn_dropout=hf.get("attention_dropout", 0.0),
            init_std=hf.get("init_std", 0.02),
            pad_id=hf.get("pad_token_id", 1),
            decoder_start_id=hf.get("decoder_start_token_id", 2),
        )

    def config_to_hf(self, cfg: ModelConfig) -> dict:
        if cfg.position_offset != 2:
            raise LMForgeError("bart export needs model.position_offset = 2")
        return {
            "model_type": "bart",
            "architectures": ["BartForConditionalGeneration"],
            "vocab_size": cfg.vocab_size,
            "d_model": cfg.d_model,
            "encoder_layers": cfg.n_layers,
            "decoder_layers": cfg.decoder_layers,
            "encoder_attention_heads": cfg.n_heads,
            "decoder_attention_heads": cfg.n_heads,
            "encoder_ffn_dim": cfg.d_ff,
            "decoder_ffn_dim": cfg.d_ff,
            "max_position_embeddings": cfg.max_seq_len,
            "activation_function": act_to_hf(cfg.activation, "bart"),
            "scale_embedding": cfg.scale_embeddings,
            "tie_word_embeddings": cfg.tie_embeddings,
            "dropout": cfg.dropout,
            "attention_dropout": cfg.attn_dropout,
            "activation_dropout": 0.0,
            "init_std": cfg.init_std,
            "pad_token_id": cfg.pad_id,
            "decoder_start_token_id": cfg.decoder_start_id,
            "forced_eos_token_id": None,
            "is_encoder_decoder": True,
        }

    def pairs(self, cfg: ModelConfig) -> list[Pair]:
        p = [Pair("tok_emb.weight", ("model.shared.weight",))]
        for stack, n in (("encoder", cfg.n_layers), ("decoder", cfg.decoder_layers)):
            p.append(Pair(f"{stack}.pos_emb.emb.weight", (f"model.{stack}.embed_positions.weight",)))
            p += linear(f"{stack}.emb_norm", f"model.{stack}.layernorm_embedding", True)
            for i in range(n):
                a, b = f"{stack}.blocks.{i}.", f"model.{stack}.layers.{i}."
                qkv = [f"{b}self_attn.{x}_proj" for x in "qkv"]
                p += linear(f"{a}attn.qkv", qkv, True, split=(cfg.d_model,) * 3)
                p += linear(f"{a}attn.o", f"{b}self_attn.out_proj", True)
                p += linear(f"{a}norm1", f"{b}self_attn_layer_norm", True)
                if stack == "decoder":
                    p += linear(f"{a}cross_attn.q", f"{b}encoder_attn.q_proj", True)
                    kv = [f"{b}encoder_attn.{x}_proj" for x in "kv"]
                    p += linear(f"{a}cross_attn.kv", kv, True, split=(cfg.d_model,) * 2)
                    p += linear(f"{a}cross_attn.o", f"{b}encoder_attn.out_proj", True)
                    p += linear(f"{a}norm_cross", f"{b}encoder_attn_layer_norm", True)
                p += linear(f"{a}mlp.up", f"{b}fc1", True)
                p += linear(f"{a}mlp.down", f"{b}fc2", True)
                p += linear(f"{a}norm2", f"{b}final_layer_norm", True)
        if cfg.lm_head_bias:
            p.append(Pair("lm_head.bias", ("final_logits_bias",), hf_shape=(1, cfg.vocab_size)))
        if not cfg.tie_embeddings:
            p.append(Pair("lm_head.weight", ("lm_head.weight",)))
        return p

    def normalize(self, sd: StateDict) -> StateDict:
        sd = add_prefix(sd, "model.", ("encoder.", "decoder.", "shared."))
        return _alias(sd, "model.shared.weight", "model.encoder.embed_tokens.weight")

    def auto_class(self, cfg: ModelConfig) -> str:
        return "AutoModelForSeq2SeqLM"


# T5Config.feed_forward_proj is "ACT" or "gated-ACT" with ACT an ACT2FN name, except that "gated-gelu" means the
# tanh GELU (T5 v1.1's gelu_new). The gated forms we have: GeGLU (tanh GELU) and SwiGLU.
_T5_GATED = {"gelu_tanh": "geglu", "silu": "swiglu"}
_T5_GATED_TO_HF = {"geglu": "gated-gelu", "swiglu": "gated-silu"}


def _t5_activation(ffn: str) -> str:
    """Our activation for a T5 feed_forward_proj."""
    gated, _, act = ffn.rpartition("-")
    if gated not in ("", "gated"):
        raise LMForgeError(f"Hugging Face t5 feed_forward_proj '{ffn}' is not supported")
    if gated and act == "gelu":
        act = "gelu_new"
    ours = act_from_hf(act, "t5")
    if gated and ours not in _T5_GATED:
        raise LMForgeError(f"Hugging Face t5 feed_forward_proj '{ffn}' is not supported (gated: gelu, silu)")
    return _T5_GATED[ours] if gated else ours


def _t5_ffn(activation: str) -> str:
    """The feed_forward_proj of our activation."""
    return _T5_GATED_TO_HF.get(activation) or act_to_hf(activation, "t5")


class T5Converter(Converter):
    """T5: one relative-position table per stack (stored in block 0), RMSNorm without bias, no linear biases."""

    model_type = "t5"
    arch = "encoder-decoder"
    activations = (*ACT2FN_NAMES.to_hf, *_T5_GATED_TO_HF)

    def config_from_hf(self, hf: dict, sd: Mapping[str, Tensor]) -> ModelConfig:
        ffn = hf.get("feed_forward_proj", "relu")
        activation = _t5_activation(ffn)
        # transformers >= 5 always writes tie_word_embeddings=true; the weights say whether the head is tied.
        tied = _tied(sd.get("lm_head.weight"), sd.get("shared.weight"))
        scale = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True) is not False)
        d, heads, d_kv = hf["d_model"], hf["num_heads"], hf["d_kv"]
        fam = families.T5 if ffn == "relu" else families.T5_V1_1
        return build(
            fam,
            name="t5",
            vocab_size=hf["vocab_size"],
            d_model=d,
            n_layers=hf["num_layers"],
            n_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
            n_heads=heads,
            head_dim=None if d % heads == 0 and d_kv == d // heads else d_kv,
            d_ff=hf["d_ff"],
            max_seq_len=hf.get("n_positions", 512),
            norm_eps=hf.get("layer_norm_epsilon", 1e-6),
            activation=activation,
            rel_buckets=hf.get("relative_attention_num_buckets", 32),
            rel_max_distance=hf.get("relative_attention_max_distance", 128),
            tie_embeddings=tied,
            scale_tied_logits=bool(scale),
            dropout=hf.get("dropout_rate", 0.1),
            attn_dropout=hf.get("dropout_rate", 0.1),  # one rate at every site (T5Attention's too)
            init_std=hf.get("initializer_factor", 1.0),  # the t5 init scheme's factor (models/init.py)
            pad_id=hf.get("pad_token_id", 0),
            decoder_start_id=hf.get("decoder_start_token_id", 0),
        )

    def config_to_hf(self, cfg: ModelConfig) -> dict:
        return {
            "model_type": "t5",
            "architectures": ["T5ForConditionalGeneration"],
            "vocab_size": cfg.vocab_size,
            "d_model": cfg.d_model,
            "d_kv": cfg.dim_head,
            "d_ff": cfg.d_ff,
            "num_layers": cfg.n_layers,
            "num_decoder_layers": cfg.decoder_layers,
            "num_heads": cfg.n_heads,
            "n_positions": cfg.max_seq_len,
            "relative_attention_num_buckets": cfg.rel_buckets,
            "relative_attention_max_distance": cfg.rel_max_distance,
            "layer_norm_epsilon": cfg.norm_eps,
            "feed_forward_proj": _t5_ffn(cfg.activation),
            "tie_word_embeddings": cfg.tie_embeddings,
            "scale_decoder_outputs": cfg.scale_tied_logits,
            "dropout_rate": cfg.dropout,
            "initializer_factor": cfg.init_std if cfg.init_scheme == "t5" else 1.0,
            "pad_token_id": cfg.pad_id,
            "decoder_start_token_id": cfg.decoder_start_id,
            "is_encoder_decoder": True,
        }

    def _ffn(self, cfg: ModelConfig, a: str, b: str) -> list[Pair]:
        if cfg.gated:
            p = linear(f"{a}mlp.gate", f"{b}DenseReluDense.wi_0", False)
            p += linear(f"{a}mlp.up", f"{b}DenseReluDense.wi_1", False)
        else:
            p = linear(f"{a}mlp.up", f"{b}DenseReluDense.wi", False)
        return p + linear(f"{a}mlp.down", f"{b}DenseReluDense.wo", False) + linear(f"{a}norm2", f"{b}layer_norm", False)

    def pairs(self, cfg: ModelConfig) -> list[Pair]:
        q, kv = cfg.n_heads * cfg.dim_head, cfg.kv_heads * cfg.dim_head
        p = [Pair("tok_emb.weight", ("shared.weight",))]
        for stack, n in (("encoder", cfg.n_layers), ("decoder", cfg.decoder_layers)):
            bias = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
            p.append(Pair(f"{stack}.rel_bias.relative_attention_bias.weight", (bias,)))
            for i in range(n):
                a, b = f"{stack}.blocks.{i}.", f"{stack}.block.{i}.layer."
                p += linear(f"{a}attn.qkv", [f"{b}0.SelfAttention.{x}" for x in "qkv"], False, split=(q, kv, kv))
                p += linear(f"{a}attn.o", f"{b}0.SelfAttention.o", False)
                p += linear(f"{a}norm1", f"{b}0.layer_norm", False)
                if stack == "decoder":
                    p += linear(f"{a}cross_attn.q", f"{b}1.EncDecAttention.q", False)
                    kv_names = [f"{b}1.EncDecAttention.{x}" for x in "kv"]
                    p += linear(f"{a}cross_attn.kv", kv_names, False, split=_kv_split(cfg))
                    p += linear(f"{a}cross_attn.o", f"{b}1.EncDecAttention.o", False)
                    p += linear(f"{a}norm_cross", f"{b}1.layer_norm", False)
                p += self._ffn(cfg, a, f"{b}{2 if stack == 'decoder' else 1}.")
            p += linear(f"{stack}.final_norm", f"{stack}.final_layer_norm", False)
        if not cfg.tie_embeddings:
            p.append(Pair("lm_head.weight", ("lm_head.weight",)))
        return p

    def normalize(self, sd: StateDict) -> StateDict:
        return _alias(sd, "shared.weight", "encoder.embed_tokens.weight")

    def auto_class(self, cfg: ModelConfig) -> str:
        return "AutoModelForSeq2SeqLM"


register(BartConverter())
register(T5Converter())
