"""Converter machinery shared by every family: tensor-name pairs, the registry, and config comparison.

A converter maps a `transformers` config dict to a ModelConfig and back, and lists (ours, theirs) tensor pairs.
A pair may join several HF tensors into one of ours (separate q/k/v projections -> our fused qkv) and may
transpose (GPT's Conv1D stores (in, out)). Whether an lmforge config can be exported to a family is decided by
round-tripping its config through that family: what comes back must be the same architecture."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.models.config import ModelConfig
from lmforge.models.position_schemes import POSITION_SCHEMES

StateDict = dict[str, Tensor]


@dataclass(frozen=True)
class ActNames:
    """How one family's `transformers` config names the activations its model computes: each name it may hold ->
    our activation computing the same function, and the name we write for each of ours. Read off each model's own
    code, not the docs: OpenAIGPT keeps its own table in which "gelu" is the tanh approximation."""

    field: str
    """The HF config field (`hidden_act`, `activation_function`, `afn`, ...), for messages."""
    from_hf: Mapping[str, str]
    to_hf: Mapping[str, str]
    note: str = ""
    """Said when an activation is refused (what the family's names really compute)."""

    def ours(self, name: str, family: str) -> str:
        if name not in self.from_hf:
            known = ", ".join(self.from_hf)
            raise LMForgeError(f"Hugging Face {family} {self.field} '{name}' is not supported (supported: {known})")
        return self.from_hf[name]

    def theirs(self, activation: str, family: str) -> str:
        if activation not in self.to_hf:
            raise LMForgeError(
                f"Hugging Face {family} cannot compute activation '{activation}' (it computes "
                f"{', '.join(self.to_hf)}){self.note}"
            )
        return self.to_hf[activation]


# transformers.activations.ACT2FN, read by GPT-2, BERT, RoBERTa, ELECTRA, ALBERT, BART, XLNet (ungated MLPs):
# "gelu" is exact (erf), "gelu_new" and "gelu_pytorch_tanh" the tanh approximation, "relu2" ReLU squared.
ACT2FN_NAMES = ActNames(
    "activation",
    from_hf={
        "gelu": "gelu",
        "gelu_new": "gelu_tanh",
        "gelu_pytorch_tanh": "gelu_tanh",
        "relu": "relu",
        "relu2": "relu2",
        "silu": "silu",
        "swish": "silu",
    },
    to_hf={"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "relu2": "relu2", "silu": "silu"},
)


def act_from_hf(name: str, where: str, names: ActNames = ACT2FN_NAMES) -> str:
    """Our activation for the HF activation `name` of family `where` (LMForgeError when it has none)."""
    return names.ours(name, where)


def act_to_hf(activation: str, where: str, names: ActNames = ACT2FN_NAMES) -> str:
    """The HF name of our `activation` in family `where` (LMForgeError when that model cannot compute it)."""
    return names.theirs(activation, where)


def build(family: dict, **fields) -> ModelConfig:
    """A ModelConfig of `family` (models/families.py) with `fields` overriding it."""
    return ModelConfig(**{**family, **fields})


@dataclass(frozen=True)
class Pair:
    """One of our tensors and the HF tensor(s) it is made of."""

    ours: str
    theirs: tuple[str, ...]
    transpose: bool = False
    split: tuple[int, ...] = ()
    """Row counts of each HF tensor when several are concatenated along dim 0 into ours."""
    hf_shape: tuple[int, ...] | None = None
    """HF's shape when it differs from ours by a reshape (BART's final_logits_bias is (1, V))."""


def linear(
    ours: str, theirs: str | Sequence[str], bias: bool, split: Sequence[int] = (), t: bool = False
) -> list[Pair]:
    """Pairs for an nn.Linear (or a norm: same weight/bias names) made of one or several HF modules."""
    names = (theirs,) if isinstance(theirs, str) else tuple(theirs)
    pairs = [Pair(f"{ours}.weight", tuple(f"{n}.weight" for n in names), t, tuple(split))]
    if bias:
        pairs.append(Pair(f"{ours}.bias", tuple(f"{n}.bias" for n in names), False, tuple(split)))
    return pairs


class Converter:
    """Base converter: subclasses set `model_type` and implement the config mapping and `pairs`."""

    model_type: str = ""
    arch: str = ""
    activations: tuple[str, ...] = tuple(ACT2FN_NAMES.to_hf)
    """Our activations this family's `transformers` model computes (its config_to_hf refuses the others)."""

    def config_from_hf(self, hf: dict, sd: Mapping[str, Tensor]) -> ModelConfig:
        """The ModelConfig of an HF config; `sd` (HF names) tells which optional heads the checkpoint has."""
        raise NotImplementedError

    def config_to_hf(self, cfg: ModelConfig) -> dict:
        raise NotImplementedError

    def pairs(self, cfg: ModelConfig) -> list[Pair]:
        raise NotImplementedError

    def auto_class(self, cfg: ModelConfig) -> str:
        """Name of the `transformers` Auto class that loads an exported model of this config."""
        raise NotImplementedError

    def normalize(self, sd: StateDict) -> StateDict:
        """Rewrite legacy or prefix-less HF names to the ones `pairs` uses (default: unchanged)."""
        return sd

    def extra_hf_tensors(self, hf_sd: StateDict, cfg: ModelConfig) -> StateDict:
        """HF tensors that duplicate others (tied biases) and must still be present (default: none)."""
        return {}

    # ---------------------------------------------------------------------------------------- state dicts
    def state_from_hf(self, sd: Mapping[str, Tensor], cfg: ModelConfig) -> StateDict:
        out: StateDict = {}
        for p in self.pairs(cfg):
            missing = [n for n in p.theirs if n not in sd]
            if missing:
                raise LMForgeError(f"Hugging Face {self.model_type} checkpoint is missing tensor '{missing[0]}'")
            parts = [sd[n].t() if p.transpose else sd[n] for n in p.theirs]
            t = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
            out[p.ours] = t.reshape(-1) if p.hf_shape is not None else t
        return out

    def state_to_hf(self, sd: Mapping[str, Tensor], cfg: ModelConfig) -> StateDict:
        out: StateDict = {}
        for p in self.pairs(cfg):
            if p.ours not in sd:
                raise LMForgeError(f"model '{cfg.name}' has no tensor '{p.ours}' for {self.model_type} export")
            t = sd[p.ours]
            parts = t.split(list(p.split), dim=0) if len(p.theirs) > 1 else (t,)
            for name, part in zip(p.theirs, parts):
                part = part.t() if p.transpose else part
                out[name] = part.reshape(p.hf_shape) if p.hf_shape is not None else part
        out.update(self.extra_hf_tensors(out, cfg))
        return out

    def matches(self, cfg: ModelConfig, sd: Mapping[str, Tensor]) -> bool:
        """Whether `cfg` survives a round trip through this family's config unchanged (sizes and structure)."""
        if cfg.arch != self.arch:
            return False
        try:
            hf_sd = self.state_to_hf(sd, cfg)
            back = self.config_from_hf(self.config_to_hf(cfg), hf_sd)
        except (LMForgeError, KeyError, ValueError, RuntimeError):
            return False
        return canonical(back) == canonical(cfg)


_SCHEME_FIELDS = frozenset(f for s in POSITION_SCHEMES.values() for f in s.config_fields)
"""Config fields some position scheme alone reads (rope_base, rel_buckets, rel_max_distance, shaw_values)."""


def canonical(cfg: ModelConfig) -> dict:
    """The fields that decide what a model computes, with unused ones dropped and defaults resolved.

    Two configs with equal canonical forms build models with the same tensors and the same outputs.
    Training-only fields (dropout, init), token ids and the name are left out."""
    d = dataclasses.asdict(cfg)
    for k in ("name", "dropout", "attn_dropout", "dropout_ffn_hidden", "dropout_final_norm", "init_std", "init_scheme",
              "zero_pad_embedding", "zero_init_proj", "pad_id", "decoder_start_id"):  # fmt: skip
        d.pop(k)
    d["n_kv_heads"], d["head_dim"] = cfg.kv_heads, cfg.dim_head
    d["attn_bias"] = cfg.qkv_bias
    d["embedding_dim"] = None if cfg.embedding_dim in (None, cfg.d_model) else cfg.embedding_dim
    d["n_decoder_layers"] = cfg.decoder_layers if cfg.is_encoder_decoder else None
    if cfg.max_positions is None:  # no learned table: max_seq_len and the offset size nothing
        d.pop("max_seq_len"), d.pop("position_offset")
    for k in _SCHEME_FIELDS.difference(cfg.position_scheme.config_fields):  # other schemes' settings
        d.pop(k)
    if cfg.attn_pattern == "dense":
        for k in ("attn_band", "attn_stride", "attn_fixed_c", "attn_sparse_every", "attn_factorize"):
            d.pop(k)
    if not cfg.is_decoder:
        d.pop("mask")
    if not cfg.is_encoder_decoder:
        d.pop("share_encoder_decoder")
    if not cfg.lm_head:
        for k in ("tie_embeddings", "lm_head_transform", "lm_head_bias", "scale_tied_logits"):
            d.pop(k)
    return d


CONVERTERS: dict[str, Converter] = {}


def register(conv: Converter) -> Converter:
    CONVERTERS[conv.model_type] = conv
    return conv


def converter_for(model_type: str) -> Converter:
    if model_type not in CONVERTERS:
        known = ", ".join(sorted(CONVERTERS))
        raise LMForgeError(f"no converter for Hugging Face model_type '{model_type}' (supported: {known})")
    return CONVERTERS[model_type]


def converter_of(cfg: ModelConfig, sd: Mapping[str, Tensor]) -> Converter:
    """The converter whose family `cfg` (with state dict `sd`) exports to without loss."""
    for conv in CONVERTERS.values():
        if conv.matches(cfg, sd):
            return conv
    reason = activation_refusal(cfg, sd)
    if reason is not None:
        raise LMForgeError(f"model '{cfg.name}' has no Hugging Face equivalent: {reason}")
    raise LMForgeError(
        f"model '{cfg.name}' ({cfg.arch}) has no Hugging Face equivalent: its architecture matches none of "
        f"{', '.join(sorted(CONVERTERS))}"
    )


def activation_refusal(cfg: ModelConfig, sd: Mapping[str, Tensor]) -> str | None:
    """Why a family that would take `cfg` with another activation refuses its own, or None when none would.

    Said instead of "matches none" so that a GPT-1 with exact GELU hears that transformers' GPT-1 has none."""
    for conv in CONVERTERS.values():
        for act in conv.activations:
            other = dataclasses.replace(cfg, activation=act)
            if act == cfg.activation or other.gated != cfg.gated:
                continue  # a gated MLP has tensors an ungated one lacks: not a matter of activation
            if conv.matches(other, sd):
                try:
                    conv.config_to_hf(cfg)
                except LMForgeError as e:
                    return str(e)
    return None
