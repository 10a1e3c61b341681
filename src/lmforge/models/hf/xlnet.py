"""XLNet (`xlnet`): Transformer-XL relative attention with segment encodings and the two-stream query stream.

Hugging Face stores each head projection as one (d_model, n_head, d_head) tensor: q, k, v and r are applied as
x @ W (so ours is W reshaped to (d_model, H·hd) and transposed), the output projection o as vec @ Wᵀ (ours is
W reshaped, not transposed). r_w_bias is the content bias u of Transformer-XL §3.3, r_r_bias the position bias v,
r_s_bias and seg_embed XLNet's segment bias and encodings (§2.5). attn_type 'bi' (XLNet) imports as an encoder,
'uni' (a Transformer-XL-style causal stack) as a decoder."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.models import families
from lmforge.models.config import ModelConfig
from lmforge.models.hf.base import Converter, Pair, StateDict, act_from_hf, act_to_hf, build, linear, register

_TRANSPOSED = {"q": True, "k": True, "v": True, "r": True, "o": False}
"""The rel_attn projections, which HF stores (d, H, hd): whether our 2-d weight is theirs flattened and transposed
(q, k, v, r: HF computes x @ W) or only flattened (o)."""
_MASK_EMB = "transformer.mask_emb"


def _stack(cfg: ModelConfig) -> str:
    return "decoder" if cfg.is_decoder else "encoder"


class XLNetConverter(Converter):
    model_type = "xlnet"
    arch = "encoder"

    def matches(self, cfg: ModelConfig, sd: Mapping[str, Tensor]) -> bool:
        return cfg.position_scheme.recurrent and cfg.arch in ("encoder", "decoder") and self._round_trips(cfg, sd)

    def _round_trips(self, cfg: ModelConfig, sd: Mapping[str, Tensor]) -> bool:
        from lmforge.models.hf.base import canonical

        try:
            back = self.config_from_hf(self.config_to_hf(cfg), self.state_to_hf(sd, cfg))
        except (LMForgeError, KeyError, ValueError, RuntimeError):
            return False
        return canonical(back) == canonical(cfg)

    # ---------------------------------------------------------------------------------------------- config
    def config_from_hf(self, hf: dict, sd: Mapping[str, Tensor]) -> ModelConfig:
        attn_type = hf.get("attn_type", "bi")
        if attn_type not in ("bi", "uni"):
            raise LMForgeError(f"Hugging Face xlnet attn_type '{attn_type}' is not supported (bi or uni)")
        if hf.get("bi_data"):
            raise LMForgeError("Hugging Face xlnet option bi_data=true is not supported")
        if attn_type == "uni" and hf.get("same_length"):
            raise LMForgeError("Hugging Face xlnet option same_length=true is not supported")
        d_model, n_head = hf["d_model"], hf["n_head"]
        if hf.get("d_head") not in (None, d_model // n_head):
            raise LMForgeError(f"Hugging Face xlnet d_head must be d_model // n_head = {d_model // n_head}")
        return build(
            families.XLNET,
            name="xlnet",
            arch="encoder" if attn_type == "bi" else "decoder",
            vocab_size=hf["vocab_size"],
            d_model=d_model,
            n_layers=hf["n_layer"],
            n_heads=n_head,
            d_ff=hf["d_inner"],
            activation=act_from_hf(hf.get("ff_activation", "gelu"), "xlnet"),
            norm_eps=hf.get("layer_norm_eps", 1e-12),
            mem_len=hf.get("mem_len") or 0,
            clamp_len=max(0, hf.get("clamp_len", -1)),
            dropout=hf.get("dropout", 0.1),
            attn_dropout=hf.get("dropout", 0.1),
            init_std=hf.get("initializer_range", 0.02),
            pad_id=hf.get("pad_token_id") or 0,
            lm_head="lm_loss.bias" in sd,
            tie_embeddings=hf.get("tie_word_embeddings", True),
        )

    def config_to_hf(self, cfg: ModelConfig) -> dict:
        if cfg.head_dim not in (None, cfg.d_model // cfg.n_heads) or cfg.d_model % cfg.n_heads:
            raise LMForgeError("xlnet export needs head_dim = d_model // n_heads")
        return {
            "model_type": "xlnet",
            "architectures": ["XLNetLMHeadModel" if cfg.lm_head else "XLNetModel"],
            "attn_type": "bi" if cfg.is_encoder else "uni",
            "vocab_size": cfg.vocab_size,
            "d_model": cfg.d_model,
            "n_layer": cfg.n_layers,
            "n_head": cfg.n_heads,
            "d_head": cfg.d_model // cfg.n_heads,
            "d_inner": cfg.d_ff,
            "ff_activation": act_to_hf(cfg.activation, "xlnet"),
            "layer_norm_eps": cfg.norm_eps,
            "mem_len": cfg.mem_len or None,
            "clamp_len": cfg.clamp_len or -1,
            "bi_data": False,
            "same_length": False,
            "dropout": cfg.dropout,
            "initializer_range": cfg.init_std,
            "pad_token_id": cfg.pad_id,
            "tie_word_embeddings": cfg.tie_embeddings,
        }

    def auto_class(self, cfg: ModelConfig) -> str:
        return "AutoModelForCausalLM" if cfg.lm_head else "AutoModel"

    # ---------------------------------------------------------------------------------------------- tensors
    def pairs(self, cfg: ModelConfig) -> list[Pair]:
        s = _stack(cfg)
        p = [Pair("tok_emb.weight", ("transformer.word_embedding.weight",)), Pair(f"{s}.mask_emb", (_MASK_EMB,))]
        for i in range(cfg.n_layers):
            a, b = f"{s}.blocks.{i}.", f"transformer.layer.{i}."
            att = f"{b}rel_attn."
            p.append(Pair(f"{a}attn.qkv.weight", tuple(f"{att}{n}" for n in "qkv"), split=(cfg.d_model,) * 3))
            p.append(Pair(f"{a}attn.o.weight", (f"{att}o",)))
            p.append(Pair(f"{a}attn.rel.r.weight", (f"{att}r",)))
            for ours, theirs in (("u", "r_w_bias"), ("v", "r_r_bias"), ("seg_bias", "r_s_bias"), ("seg", "seg_embed")):
                p.append(Pair(f"{a}attn.rel.{ours}", (f"{att}{theirs}",)))
            p += linear(f"{a}norm1", f"{att}layer_norm", True)
            p += linear(f"{a}mlp.up", f"{b}ff.layer_1", True)
            p += linear(f"{a}mlp.down", f"{b}ff.layer_2", True)
            p += linear(f"{a}norm2", f"{b}ff.layer_norm", True)
        if cfg.lm_head:
            p.append(Pair("lm_head.bias", ("lm_loss.bias",)))
            if not cfg.tie_embeddings:
                p.append(Pair("lm_head.weight", ("lm_loss.weight",)))
        return p

    def normalize(self, sd: StateDict) -> StateDict:
        """Bare XLNetModel checkpoints lack the `transformer.` prefix."""
        if any(k.startswith("transformer.") for k in sd):
            return sd
        return {(f"transformer.{k}" if k.startswith(("word_embedding", "mask_emb", "layer.")) else k): v
                for k, v in sd.items()}  # fmt: skip

    def state_from_hf(self, sd: Mapping[str, Tensor], cfg: ModelConfig) -> StateDict:
        flat = dict(sd)
        for name, t in sd.items():
            kind = name.rsplit(".", 1)[-1]
            if ".rel_attn." in name and kind in _TRANSPOSED:
                w = t.reshape(t.shape[0], -1)  # (d, H, hd) -> (d, H·hd)
                flat[name] = w.t() if _TRANSPOSED[kind] else w
            elif name == _MASK_EMB:
                flat[name] = t.reshape(-1)
        return super().state_from_hf(flat, cfg)

    def state_to_hf(self, sd: Mapping[str, Tensor], cfg: ModelConfig) -> StateDict:
        out = super().state_to_hf(sd, cfg)
        H, hd = cfg.n_heads, cfg.d_model // cfg.n_heads
        for name, t in out.items():
            kind = name.rsplit(".", 1)[-1]
            if ".rel_attn." in name and kind in _TRANSPOSED:
                out[name] = (t.t() if _TRANSPOSED[kind] else t).reshape(cfg.d_model, H, hd)
            elif name == _MASK_EMB:
                out[name] = t.reshape(1, 1, -1)
        return out


register(XLNetConverter())
