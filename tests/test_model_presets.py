"""Presets: published parameter counts, exact agreement with transformers' counts, and field coverage.

`Transformer.num_params()` counts every parameter the model holds once (tied/shared tensors once), heads
included: BERT's pooler and MLM transform, ALBERT's pooler and MLM head, ELECTRA's RTD head, BART's logits bias."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from lmforge.models import ModelConfig, Transformer, get_preset
from lmforge.models.hf.base import converter_of
from lmforge.models.presets import PRESET_FIELDS
from lmforge.registry import MODELS


def _count(name: str) -> int:
    with torch.device("meta"):  # shapes only: no memory, no init time
        return Transformer(get_preset(name)).num_params()


# preset -> (published millions, decimals it is given to, source)
PUBLISHED = {
    "gpt2-124m": (124, 0, "OpenAI GPT-2 release (corrected count of the 117M model)"),
    "gpt2-350m": (355, 0, "OpenAI GPT-2 release (corrected count of the 345M model)"),
    "gpt2-1.5b": (1558, 0, "OpenAI GPT-2 release (the 1558M model)"),
    "llama-1b": (1240, -1, "Meta Llama 3.2 model card (1.23B)"),
    "llama-3b": (3210, -1, "Meta Llama 3.2 model card (3.21B)"),
    "llama-8b": (8030, -1, "Meta Llama 3.1 model card (8.03B)"),
    "bert-base": (110, 0, "Devlin et al. 2019 §3"),
    "bert-large": (340, -1, "Devlin et al. 2019 §3"),
    "roberta-base": (125, 0, "fairseq RoBERTa README"),
    "albert-base": (12, 0, "Lan et al. 2020 Table 1"),
    "electra-small": (14, 0, "Clark et al. 2020 Table 1"),
    "bart-base": (140, -1, "fairseq BART README"),
    "bart-large": (400, -2, "fairseq BART README"),
    "t5-small": (60, -1, "Raffel et al. 2020 §3.7 / T5 release"),
    "t5-base": (220, -1, "Raffel et al. 2020 §3.7"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_counts(name):
    millions, decimals, _source = PUBLISHED[name]
    assert round(_count(name) / 1e6, decimals) == millions


# preset -> (transformers class counting the same parts, what to add to its count for parts it lacks or has)
SAME_PARTS = {
    "gpt1": ("OpenAIGPTLMHeadModel", 0),
    "gpt2-124m": ("GPT2LMHeadModel", 0),
    "roberta-base": ("RobertaForMaskedLM", 0),
    "electra-small": ("ElectraForPreTraining", 0),
    "electra-small-generator": ("ElectraForMaskedLM", 0),
    "t5-base": ("T5ForConditionalGeneration", 0),
    "llama-60m": ("LlamaForCausalLM", 0),
    "llama-1b": ("LlamaForCausalLM", 0),
    "llama-3b": ("LlamaForCausalLM", 0),
    "llama-8b": ("LlamaForCausalLM", 0),
    "gpt2-1.5b": ("GPT2LMHeadModel", 0),
    "bert-base": ("BertForPreTraining", 0),
    "albert-base": ("AlbertForPreTraining", 0),
    "bart-base": ("BartForConditionalGeneration", 50265),  # plus the logits bias: a buffer in transformers
}


@pytest.mark.parametrize("name", sorted(SAME_PARTS))
def test_counts_equal_transformers_exactly(name):
    cls, adjust = SAME_PARTS[name]
    cfg = get_preset(name)
    with torch.device("meta"):
        ours = Transformer(cfg)
        conv = converter_of(cfg, ours.state_dict())
        hf = getattr(transformers, cls)(transformers.AutoConfig.for_model(**conv.config_to_hf(cfg)))
    assert ours.num_params() == hf.num_parameters() + adjust


def test_non_embedding_count_leaves_out_token_and_position_tables():
    cfg = get_preset("gpt2-124m")
    with torch.device("meta"):
        m = Transformer(cfg)
    assert m.num_params() - m.num_params(non_embedding=True) == cfg.vocab_size * 768 + cfg.max_seq_len * 768


def test_presets_are_registered_under_their_name():
    for name in MODELS.names():
        assert get_preset(name).name == name


def test_every_family_has_a_tiny_test_size():
    tiny = {n for n in MODELS.names() if "tiny" in n}
    for family in (
        "gpt",
        "gpt1",
        "llama",
        "prefix-lm",
        "bert",
        "roberta",
        "albert",
        "electra",
        "bart",
        "t5",
        "t5-v1_1",
    ):
        assert f"{family}-tiny" in tiny
    for name in tiny:
        assert _count(name) < 400_000


def test_every_config_field_is_set_by_some_preset():
    used = set().union(*PRESET_FIELDS.values())
    assert used == {f.name for f in dataclasses.fields(ModelConfig)}
    assert set(PRESET_FIELDS) == set(MODELS.names())


def test_t5_sizes_follow_the_paper():
    small, v11 = get_preset("t5-small"), get_preset("t5-v1_1-small")
    assert (small.d_model, small.n_heads, small.d_ff, small.n_layers, small.dim_head) == (512, 8, 2048, 6, 64)
    # v1.1 small: 8 layers, 6 heads of width 64 (not 512 / 6), gated-GELU FFN of 1024.
    assert (v11.n_layers, v11.n_heads, v11.dim_head, v11.d_ff, v11.activation) == (8, 6, 64, 1024, "geglu")
