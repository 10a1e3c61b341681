"""Encoder families: BERT, RoBERTa, ELECTRA (generator and discriminator) and ALBERT.

Optional parts (pooler, MLM head, replaced-token-detection head, NSP / SOP classifier) are taken from the tensors a
checkpoint holds, not from `architectures`: Google's BERT checkpoints say BertForMaskedLM yet carry the pooler too."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.models import families
from lmforge.models.config import ModelConfig
from lmforge.models.hf.base import Converter, Pair, StateDict, act_from_hf, act_to_hf, build, linear, register
from lmforge.models.hf.decoders import add_prefix


def _legacy_norm_names(sd: StateDict) -> StateDict:
    """TF-era checkpoints name LayerNorm parameters gamma/beta."""
    out = {}
    for k, v in sd.items():
        if "LayerNorm." in k:
            k = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        out[k] = v
    return out


class _BertLike(Converter):
    """BERT's module names under a model prefix; subclasses name the heads and the family defaults."""

    arch = "encoder"
    prefix = "bert"
    pooler_name: str | None = "bert.pooler.dense"
    head_dense = "cls.predictions.transform.dense"
    head_norm = "cls.predictions.transform.LayerNorm"
    head_bias = "cls.predictions.bias"
    head_decoder = "cls.predictions.decoder"
    mlm_class = "BertForMaskedLM"
    base_class = "BertModel"
    nsp_name: str | None = "cls.seq_relationship"
    """The next-sentence (sentence-order) classifier over the pooled output, None when the family has none."""
    pretraining_class: str | None = "BertForPreTraining"
    """The HF class holding both the MLM head and that classifier."""
    head_act: str | None = None
    """The activation of transformers' MLM head when it ignores hidden_act (ours applies model.activation)."""

    # ---------------------------------------------------------------------------------------------- config
    def _family(self, sd: Mapping[str, Tensor]) -> dict:
        return families.BERT

    def _sizes_from_hf(self, hf: dict, sd: Mapping[str, Tensor]) -> dict:
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise LMForgeError(f"Hugging Face {self.model_type} position_embedding_type must be 'absolute'")
        lm_head = f"{self.head_dense}.weight" in sd
        return dict(
            name=self.model_type,
            vocab_size=hf["vocab_size"],
            d_model=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"],
            d_ff=hf["intermediate_size"],
            max_seq_len=hf["max_position_embeddings"],
            type_vocab_size=hf.get("type_vocab_size", 2),
            norm_eps=hf.get("layer_norm_eps", 1e-12),
            activation=self._check_head_act(act_from_hf(hf.get("hidden_act", "gelu"), self.model_type), lm_head),
            dropout=hf.get("hidden_dropout_prob", 0.1),
            attn_dropout=hf.get("attention_probs_dropout_prob", 0.1),
            init_std=hf.get("initializer_range", 0.02),
            pad_id=hf.get("pad_token_id") or 0,
            pooler=self.pooler_name is not None and f"{self.pooler_name}.weight" in sd,
            lm_head=lm_head,
            nsp_head=self.nsp_name is not None and f"{self.nsp_name}.weight" in sd,
            tie_embeddings=hf.get("tie_word_embeddings", True),
        )

    def config_from_hf(self, hf: dict, sd: Mapping[str, Tensor]) -> ModelConfig:
        return build(self._family(sd), **self._sizes_from_hf(hf, sd))

    def _check_head_act(self, activation: str, lm_head: bool) -> str:
        if lm_head and self.head_act is not None and activation != self.head_act:
            raise LMForgeError(
                f"Hugging Face {self.model_type} with an MLM head needs activation '{self.head_act}': transformers' "
                f"{self.mlm_class} applies it in the head whatever hidden_act says, lmforge's head uses "
                f"'{activation}' like the layers"
            )
        return activation

    def config_to_hf(self, cfg: ModelConfig) -> dict:
        if cfg.type_vocab_size < 1:
            raise LMForgeError(f"{self.model_type} export needs model.type_vocab_size >= 1")
        return {
            "model_type": self.model_type,
            "architectures": [self._pretraining(cfg) or (self.mlm_class if cfg.lm_head else self.base_class)],
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads,
            "intermediate_size": cfg.d_ff,
            "max_position_embeddings": cfg.max_seq_len,
            "type_vocab_size": cfg.type_vocab_size,
            "layer_norm_eps": cfg.norm_eps,
            "hidden_act": act_to_hf(self._check_head_act(cfg.activation, cfg.lm_head), self.model_type),
            "hidden_dropout_prob": cfg.dropout,
            "attention_probs_dropout_prob": cfg.attn_dropout,
            "initializer_range": cfg.init_std,
            "pad_token_id": cfg.pad_id,
            "position_embedding_type": "absolute",
            "tie_word_embeddings": cfg.tie_embeddings,
        }

    # ---------------------------------------------------------------------------------------------- tensors
    def _embedding_pairs(self, cfg: ModelConfig) -> list[Pair]:
        e = f"{self.prefix}.embeddings."
        p = [Pair("tok_emb.weight", (f"{e}word_embeddings.weight",))]
        p.append(Pair("encoder.pos_emb.emb.weight", (f"{e}position_embeddings.weight",)))
        if cfg.type_vocab_size:
            p.append(Pair("encoder.type_emb.weight", (f"{e}token_type_embeddings.weight",)))
        p += linear("encoder.emb_norm", f"{e}LayerNorm", True)
        return p

    def _layer_pairs(self, cfg: ModelConfig) -> list[Pair]:
        p = []
        for i in range(cfg.n_layers):
            a, b = f"encoder.blocks.{i}.", f"{self.prefix}.encoder.layer.{i}."
            qkv = [f"{b}attention.self.{n}" for n in ("query", "key", "value")]
            p += linear(f"{a}attn.qkv", qkv, True, split=(cfg.d_model,) * 3)
            p += linear(f"{a}attn.o", f"{b}attention.output.dense", True)
            p += linear(f"{a}norm1", f"{b}attention.output.LayerNorm", True)
            p += linear(f"{a}mlp.up", f"{b}intermediate.dense", True)
            p += linear(f"{a}mlp.down", f"{b}output.dense", True)
            p += linear(f"{a}norm2", f"{b}output.LayerNorm", True)
        return p

    def _head_pairs(self, cfg: ModelConfig) -> list[Pair]:
        p = []
        if cfg.pooler and self.pooler_name is not None:
            p += linear("pooler", self.pooler_name, True)
        if cfg.lm_head:
            p += linear("head_dense", self.head_dense, True)
            p += linear("head_norm", self.head_norm, True)
            p.append(Pair("lm_head.bias", (self.head_bias,)))
            if not cfg.tie_embeddings:
                p.append(Pair("lm_head.weight", (f"{self.head_decoder}.weight",)))
        if cfg.nsp_head and self.nsp_name is not None:
            p += linear("nsp_head", self.nsp_name, True)
        return p

    def pairs(self, cfg: ModelConfig) -> list[Pair]:
        return self._embedding_pairs(cfg) + self._layer_pairs(cfg) + self._head_pairs(cfg)

    def extra_hf_tensors(self, hf_sd: StateDict, cfg: ModelConfig) -> StateDict:
        # The decoder's bias is the same tensor as the head's bias in transformers; store both names.
        if cfg.lm_head and self.head_bias in hf_sd and self.head_decoder:
            return {f"{self.head_decoder}.bias": hf_sd[self.head_bias]}
        return {}

    def normalize(self, sd: StateDict) -> StateDict:
        return add_prefix(_legacy_norm_names(sd), f"{self.prefix}.", ("embeddings.", "encoder.", "pooler."))

    def _pretraining(self, cfg: ModelConfig) -> str | None:
        """The *ForPreTraining class when the model has both the MLM head and the sentence classifier."""
        return self.pretraining_class if cfg.lm_head and cfg.nsp_head else None

    def auto_class(self, cfg: ModelConfig) -> str:
        if self._pretraining(cfg):
            return "AutoModelForPreTraining"
        return "AutoModelForMaskedLM" if cfg.lm_head else "AutoModel"


class BertConverter(_BertLike):
    model_type = "bert"


class RobertaConverter(_BertLike):
    """RoBERTa: BERT with positions starting at pad_token_id + 1 and an `lm_head` module."""

    model_type = "roberta"
    prefix = "roberta"
    pooler_name = "roberta.pooler.dense"
    head_dense, head_norm, head_bias, head_decoder = (
        "lm_head.dense",
        "lm_head.layer_norm",
        "lm_head.bias",
        "lm_head.decoder",
    )
    mlm_class, base_class = "RobertaForMaskedLM", "RobertaModel"
    nsp_name = pretraining_class = None
    head_act = "gelu"  # RobertaLMHead calls gelu() itself

    def _family(self, sd: Mapping[str, Tensor]) -> dict:
        return families.ROBERTA

    def _sizes_from_hf(self, hf: dict, sd: Mapping[str, Tensor]) -> dict:
        d = super()._sizes_from_hf(hf, sd)
        pad = hf.get("pad_token_id", 1)
        offset = pad + 1  # fairseq numbers positions from padding_idx + 1
        return {**d, "pad_id": pad, "position_offset": offset, "max_seq_len": hf["max_position_embeddings"] - offset}

    def config_to_hf(self, cfg: ModelConfig) -> dict:
        if cfg.position_offset < 1:
            raise LMForgeError("roberta export needs model.position_offset >= 1 (pad_token_id + 1)")
        hf = super().config_to_hf(cfg)
        hf["pad_token_id"] = cfg.position_offset - 1
        hf["max_position_embeddings"] = cfg.max_seq_len + cfg.position_offset
        return hf


class ElectraConverter(_BertLike):
    """ELECTRA: BERT layers, embeddings of size E projected to H when they differ; generator or discriminator."""

    model_type = "electra"
    prefix = "electra"
    pooler_name = None
    head_dense, head_norm, head_bias = (
        "generator_predictions.dense",
        "generator_predictions.LayerNorm",
        "generator_lm_head.bias",
    )
    head_decoder = "generator_lm_head"
    mlm_class, base_class = "ElectraForMaskedLM", "ElectraModel"
    nsp_name = pretraining_class = None
    head_act = "gelu"  # ElectraGeneratorPredictions: get_activation("gelu")

    def _family(self, sd: Mapping[str, Tensor]) -> dict:
        rtd = "discriminator_predictions.dense.weight" in sd
        return families.ELECTRA_DISCRIMINATOR if rtd else families.ELECTRA_GENERATOR

    def _sizes_from_hf(self, hf: dict, sd: Mapping[str, Tensor]) -> dict:
        d = super()._sizes_from_hf(hf, sd)
        e = hf.get("embedding_size", 128)  # transformers' default
        rtd = "discriminator_predictions.dense.weight" in sd
        return {**d, "embedding_dim": None if e == d["d_model"] else e, "rtd_head": rtd}

    def config_to_hf(self, cfg: ModelConfig) -> dict:
        hf = super().config_to_hf(cfg)
        hf["embedding_size"] = cfg.embedding_dim or cfg.d_model
        if cfg.rtd_head:
            hf["architectures"] = ["ElectraForPreTraining"]
        return hf

    def _embedding_pairs(self, cfg: ModelConfig) -> list[Pair]:
        p = super()._embedding_pairs(cfg)
        if (cfg.embedding_dim or cfg.d_model) != cfg.d_model:
            p += linear("encoder.emb_proj", "electra.embeddings_project", True)
        return p

    def _head_pairs(self, cfg: ModelConfig) -> list[Pair]:
        p = super()._head_pairs(cfg)
        if cfg.rtd_head:
            p += linear("rtd_head.dense", "discriminator_predictions.dense", True)
            p += linear("rtd_head.out", "discriminator_predictions.dense_prediction", True)
        return p

    def extra_hf_tensors(self, hf_sd: StateDict, cfg: ModelConfig) -> StateDict:
        return {}  # generator_lm_head has its own bias, no duplicate

    def normalize(self, sd: StateDict) -> StateDict:
        return add_prefix(_legacy_norm_names(sd), "electra.", ("embeddings.", "embeddings_project.", "encoder."))

    def auto_class(self, cfg: ModelConfig) -> str:
        return "AutoModelForPreTraining" if cfg.rtd_head else super().auto_class(cfg)


class AlbertConverter(_BertLike):
    """ALBERT: one shared layer group, an E -> H mapping at the encoder's input, an MLM head back to E."""

    model_type = "albert"
    prefix = "albert"
    pooler_name = "albert.pooler"
    head_dense, head_norm, head_bias, head_decoder = (
        "predictions.dense",
        "predictions.LayerNorm",
        "predictions.bias",
        "predictions.decoder",
    )
    mlm_class, base_class = "AlbertForMaskedLM", "AlbertModel"
    nsp_name, pretraining_class = "sop_classifier.classifier", "AlbertForPreTraining"

    def _family(self, sd: Mapping[str, Tensor]) -> dict:
        return families.ALBERT

    def _sizes_from_hf(self, hf: dict, sd: Mapping[str, Tensor]) -> dict:
        if hf.get("num_hidden_groups", 1) != 1 or hf.get("inner_group_num", 1) != 1:
            raise LMForgeError("Hugging Face albert with num_hidden_groups or inner_group_num != 1 is not supported")
        d = super()._sizes_from_hf({"hidden_act": "gelu_new", **hf}, sd)
        e = hf.get("embedding_size", 128)
        if e == d["d_model"]:
            raise LMForgeError("Hugging Face albert with embedding_size == hidden_size is not supported")
        return {**d, "embedding_dim": e, "dropout": hf.get("hidden_dropout_prob", 0.0),
                "attn_dropout": hf.get("attention_probs_dropout_prob", 0.0)}  # fmt: skip

    def config_to_hf(self, cfg: ModelConfig) -> dict:
        hf = super().config_to_hf(cfg)
        hf.update(embedding_size=cfg.embedding_dim or cfg.d_model, num_hidden_groups=1, inner_group_num=1)
        return hf

    def _embedding_pairs(self, cfg: ModelConfig) -> list[Pair]:
        return super()._embedding_pairs(cfg) + linear(
            "encoder.emb_proj", "albert.encoder.embedding_hidden_mapping_in", True
        )

    def _layer_pairs(self, cfg: ModelConfig) -> list[Pair]:
        a, b = "encoder.blocks.0.", "albert.encoder.albert_layer_groups.0.albert_layers.0."
        qkv = [f"{b}attention.{n}" for n in ("query", "key", "value")]
        p = linear(f"{a}attn.qkv", qkv, True, split=(cfg.d_model,) * 3)
        p += linear(f"{a}attn.o", f"{b}attention.dense", True)
        p += linear(f"{a}norm1", f"{b}attention.LayerNorm", True)
        p += linear(f"{a}mlp.up", f"{b}ffn", True)
        p += linear(f"{a}mlp.down", f"{b}ffn_output", True)
        p += linear(f"{a}norm2", f"{b}full_layer_layer_norm", True)
        return p

    def normalize(self, sd: StateDict) -> StateDict:
        return add_prefix(_legacy_norm_names(sd), "albert.", ("embeddings.", "encoder.", "pooler."))


register(BertConverter())
register(RobertaConverter())
register(ElectraConverter())
register(AlbertConverter())
