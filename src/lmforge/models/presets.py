"""Named architectures. Presets are data: a family (models/families.py) plus sizes, registered in MODELS.

Sizes follow the papers and the published Hugging Face configs; `<family>-tiny` presets are test sizes.

`Transformer(get_preset(name)).num_params()` counts every parameter the preset's model holds, heads included
(BERT's pooler and MLM transform, ALBERT's pooler and MLM head, ELECTRA's RTD head, BART's logits bias), tied
tensors once. Papers quote backbones, so counts can exceed theirs by up to ~1%; tests/test_model_presets.py lists
the published figures and the exact `transformers` counts each preset reproduces."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from lmforge.config import all_keys, build_dataclass
from lmforge.models import families as F
from lmforge.models.config import ModelConfig
from lmforge.models.gpt3 import GPT3_SIZES, preset_sizes
from lmforge.registry import MODELS

PRESET_FIELDS: dict[str, frozenset[str]] = {}
"""Preset name -> the ModelConfig fields it sets explicitly (the rest keep their defaults)."""


def preset(name: str, family: dict, **sizes) -> None:
    kw = {**family, **sizes}
    PRESET_FIELDS[name] = frozenset({"name", *kw})
    MODELS.register(name)(ModelConfig(name=name, **kw))


def _enc_dec(n_layers: int, **kw) -> dict:
    return dict(n_layers=n_layers, n_decoder_layers=n_layers, **kw)


# --- decoders ------------------------------------------------------------------------------------------------------
# GPT-1 (Radford et al. 2018 §4.1): 12 layers, 768 wide, 12 heads, 3072 FFN, 512 context, 40,478-token BPE.
preset("gpt1", F.GPT1, vocab_size=40478, d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_seq_len=512)
preset("gpt1-tiny", F.GPT1, vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128)

# GPT-2 (Radford et al. 2019 Table 2): 1024 context, 50,257 byte-level BPE.
_GPT2_VOCAB = dict(vocab_size=50257, max_seq_len=1024)
preset("gpt2-124m", F.GPT2, d_model=768, n_layers=12, n_heads=12, d_ff=3072, **_GPT2_VOCAB)
preset("gpt2-350m", F.GPT2, d_model=1024, n_layers=24, n_heads=16, d_ff=4096, **_GPT2_VOCAB)
preset("gpt2-774m", F.GPT2, d_model=1280, n_layers=36, n_heads=20, d_ff=5120, **_GPT2_VOCAB)
preset("gpt2-1.5b", F.GPT2, d_model=1600, n_layers=48, n_heads=25, d_ff=6400, **_GPT2_VOCAB)
# Small sizes for CPU runs: `gpt-tiny` for tests, `gpt-mini` for the README demo.
preset("gpt-tiny", F.GPT2, vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128)
preset("gpt-mini", F.GPT2, vocab_size=4096, d_model=192, n_layers=4, n_heads=6, d_ff=768, max_seq_len=256)
# GPT-2 small's shape with the fast-training architecture (recipe gpt-fast); the vocabulary padded to 50304 (a
# multiple of 128) for GPT-2's tokenizer, as nanoGPT does.
preset("gpt-fast-124m", F.GPT_FAST, vocab_size=50304, d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_seq_len=1024)
preset("gpt-fast-tiny", F.GPT_FAST, vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128)
# Single-GPU study size (~30M parameters with a 16k vocabulary), paired with `roberta-small`.
preset("gpt-small", F.GPT2, vocab_size=16384, d_model=512, n_layers=8, n_heads=8, d_ff=2048, max_seq_len=512)
# GPT-1's shape (12 layers of 768, 512 context; Radford et al. 2018) with the study's 16k vocabulary: 98.0M.
preset("gpt-base", F.GPT2, vocab_size=16384, d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_seq_len=512)

# GPT-3 (Brown et al. 2020 Table 2.1, models/gpt3.py): GPT-2 layers, 2048 context, dense and banded layers alternate.
for _row in GPT3_SIZES:
    preset(_row.preset, F.GPT2, **preset_sizes(_row))
# Test and CPU sizes: the band is shorter than the context, so the banded layers are sparse.
preset(
    "gpt3-tiny", F.GPT2, vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=256,
    attn_pattern="banded", attn_band=32, attn_sparse_every=2,
)  # fmt: skip
preset(
    "gpt3-mini", F.GPT2, vocab_size=4096, d_model=192, n_layers=4, n_heads=6, d_ff=768, max_seq_len=512,
    attn_pattern="banded", attn_band=64, attn_sparse_every=2,
)  # fmt: skip
# Sparse Transformer (Child et al. 2019 §4.2) factorised patterns at test size: every layer sparse.
_SPARSE_TINY = dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128, attn_sparse_every=1)
preset("sparse-strided-tiny", F.GPT2, attn_pattern="strided", attn_stride=8, attn_factorize="heads", **_SPARSE_TINY)
preset(
    "sparse-fixed-tiny", F.GPT2, attn_pattern="fixed", attn_stride=16, attn_fixed_c=4, attn_factorize="union",
    **_SPARSE_TINY,
)  # fmt: skip
preset(
    "sparse-fixed-interleaved-tiny", F.GPT2, attn_pattern="fixed", attn_stride=16, attn_fixed_c=4,
    attn_factorize="interleaved", **_SPARSE_TINY,
)  # fmt: skip

# Llama-style sizes of the GaLore paper (Zhao et al. 2024, Table 2 / its configs): 32k vocab, 1024 context.
_LLAMA = dict(vocab_size=32000, max_seq_len=1024, rope_base=10000.0, init_std=0.02)
preset("llama-60m", F.LLAMA, d_model=512, n_layers=8, n_heads=8, d_ff=1376, **_LLAMA)
preset("llama-130m", F.LLAMA, d_model=768, n_layers=12, n_heads=12, d_ff=2048, **_LLAMA)
preset("llama-350m", F.LLAMA, d_model=1024, n_layers=24, n_heads=16, d_ff=2736, **_LLAMA)
# Llama 3.2 shapes (Meta's published 1B and 3B configs): 128,256-token vocabulary, grouped-query attention with 8
# key/value heads, RoPE base 500,000, RMSNorm eps 1e-5, tied input/output embeddings, 8,192-token pretraining
# context (the released models stretch RoPE to 128k with llama3 frequency scaling, which is not modelled here).
_LLAMA32 = dict(vocab_size=128256, max_seq_len=8192, rope_base=500000.0, norm_eps=1e-5, n_kv_heads=8,
                tie_embeddings=True, init_std=0.02)  # fmt: skip
preset("llama-1b", F.LLAMA, d_model=2048, n_layers=16, n_heads=32, d_ff=8192, **_LLAMA32)
preset("llama-3b", F.LLAMA, d_model=3072, n_layers=28, n_heads=24, d_ff=8192, **_LLAMA32)
# Llama 3.1 8B's shape (untied embeddings; 8.03B parameters).
preset("llama-8b", F.LLAMA, d_model=4096, n_layers=32, n_heads=32, d_ff=14336, **{**_LLAMA32, "tie_embeddings": False})
# Test size with grouped-query attention (2 key/value heads serve 4 query heads).
preset(
    "llama-tiny", F.LLAMA, vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=172, max_seq_len=128
)

# Prefix LM (T5 §3.2.1; UniLM): a decoder whose prefix (the input) is fully visible, causal after it.
preset(
    "prefix-lm-tiny", F.LLAMA, mask="prefix", vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=172,
    max_seq_len=128,
)  # fmt: skip

# Multi-token prediction test sizes: Gloeckle et al. 2024's parallel heads (one block each, on the shared trunk)
# and DeepSeek-V3's sequential module (§2.2, one depth as in the released model).
_TINY_DECODER = dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, max_seq_len=128)
preset("gpt-mtp-tiny", F.GPT2, d_ff=256, mtp_heads=2, mtp_sequential=False, mtp_head="block", **_TINY_DECODER)
preset("llama-mtp-tiny", F.LLAMA, d_ff=172, mtp_heads=1, mtp_sequential=True, **_TINY_DECODER)

# Transformer-XL (Dai et al. 2019; the released WikiText-103 base script): 16 layers, d_model 410, 10 heads of 41,
# d_inner 2100, segments of 150 tokens with 150 of memory; relative distances clamped at 400 as in its evaluation
# (training never reaches them). The paper's 267,735-word vocabulary (151M parameters with the tied table).
preset(
    "transformer-xl-base", F.TRANSFORMER_XL, vocab_size=267735, d_model=410, n_layers=16, n_heads=10, head_dim=41,
    d_ff=2100, max_seq_len=512, mem_len=150, clamp_len=400,
)  # fmt: skip
preset(
    "transformer-xl-tiny", F.TRANSFORMER_XL, vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256,
    max_seq_len=256, mem_len=64,
)  # fmt: skip

# --- encoders ------------------------------------------------------------------------------------------------------
# BERT (Devlin et al. 2019 §3): 30,522 WordPiece vocab, 512 positions, 2 segment types.
_BERT_VOCAB = dict(vocab_size=30522, max_seq_len=512, init_std=0.02)
preset("bert-base", F.BERT, d_model=768, n_layers=12, n_heads=12, d_ff=3072, **_BERT_VOCAB)
preset("bert-large", F.BERT, d_model=1024, n_layers=24, n_heads=16, d_ff=4096, **_BERT_VOCAB)
preset("bert-tiny", F.BERT, vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128)

# RoBERTa (Liu et al. 2019): BERT-base layers, 50,265 byte-level BPE, 512 positions (+2 offset rows).
preset("roberta-base", F.ROBERTA, vocab_size=50265, d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_seq_len=512)
preset("roberta-tiny", F.ROBERTA, vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128)
preset("roberta-small", F.ROBERTA, vocab_size=16384, d_model=512, n_layers=8, n_heads=8, d_ff=2048, max_seq_len=512)
# Its modern twin (ModernBERT-style, Warner et al. 2024: rotary positions, pre-LN, a final norm). With learned
# absolute positions an encoder sits on the unigram plateau of the MLM loss until it has learned where its
# neighbours are (thousands of steps at this size); rotary attention sees relative offsets from the first step.
preset(
    "roberta-small-rope", F.ROBERTA, vocab_size=16384, d_model=512, n_layers=8, n_heads=8, d_ff=2048, max_seq_len=512,
    position="rope", norm_position="pre", final_norm=True,
)  # fmt: skip
# encoder-fast (recipe encoder-fast): RoBERTa-base's size with the changes the fast-encoder work found (cramming,
# Geiping & Goldstein 2023; MosaicBERT, Portes et al. 2023; ModernBERT, Warner et al. 2024): rotary positions,
# pre-LN with a final norm, a gated-GELU MLP (d_ff 2048 keeps the parameters of a 3072-wide GELU MLP), no biases.
_FAST_ENCODER = dict(position="rope", norm_position="pre", final_norm=True, activation="geglu", bias=False)
preset(
    "encoder-fast-base", F.ROBERTA, vocab_size=50265, d_model=768, n_layers=12, n_heads=12, d_ff=2048,
    max_seq_len=512, **_FAST_ENCODER,
)  # fmt: skip
# Its BERT-medium shape (Turc et al. 2019: 8 layers × 512), 26.0M parameters besides the embeddings: for budgets of
# minutes, where fewer parameters see more tokens (classify-1gpu).
preset(
    "encoder-fast-medium", F.ROBERTA, vocab_size=32768, d_model=512, n_layers=8, n_heads=8, d_ff=1408,
    max_seq_len=512, **_FAST_ENCODER,
)  # fmt: skip
preset(
    "encoder-fast-tiny", F.ROBERTA, vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=176, max_seq_len=128,
    **_FAST_ENCODER,
)  # fmt: skip

# UniLM (Dong et al. 2019 §2.4): BERT-large's shape (24 layers, 1024 wide, 16 heads; 340M), the cased 28,996-token
# WordPiece vocabulary, 512 positions; base = the released unilm-base-cased's 12 x 768.
_UNILM = dict(vocab_size=28996, max_seq_len=512)
preset("unilm-base", F.UNILM, d_model=768, n_layers=12, n_heads=12, d_ff=3072, **_UNILM)
preset("unilm-large", F.UNILM, d_model=1024, n_layers=24, n_heads=16, d_ff=4096, **_UNILM)
preset("unilm-tiny", F.UNILM, vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128)
# MAE-LM (Meng et al. 2024 §3-4): a RoBERTa-style encoder pretrained with [MASK] tokens removed from its input and
# predicted by a shallow decoder (objectives/mae_lm.py builds the decoder); the encoder has no head of its own.
preset(
    "mae-lm-base", F.ROBERTA, vocab_size=50265, d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_seq_len=512,
    lm_head=False,
)  # fmt: skip
preset(
    "mae-lm-tiny", F.ROBERTA, vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128,
    lm_head=False,
)  # fmt: skip

# ALBERT (Lan et al. 2020 Table 1): base = E 128, H 768, 12 shared layers, 30k SentencePiece vocab.
preset(
    "albert-base", F.ALBERT, vocab_size=30000, embedding_dim=128, d_model=768, n_layers=12, n_heads=12, d_ff=3072,
    max_seq_len=512,
)  # fmt: skip
preset(
    "albert-tiny", F.ALBERT, vocab_size=512, embedding_dim=32, d_model=64, n_layers=3, n_heads=4, d_ff=256,
    max_seq_len=128,
)  # fmt: skip

# ELECTRA (Clark et al. 2020 Table 6): Small = E 128, H 256, 4 heads, 1024 FFN, 12 layers; the released small
# generator has the discriminator's sizes. `electra-small` is the discriminator (the model the paper evaluates).
_ELECTRA_SMALL = dict(
    vocab_size=30522, embedding_dim=128, d_model=256, n_layers=12, n_heads=4, d_ff=1024, max_seq_len=512
)
preset("electra-small", F.ELECTRA_DISCRIMINATOR, **_ELECTRA_SMALL)
preset("electra-small-generator", F.ELECTRA_GENERATOR, **_ELECTRA_SMALL)
# The small discriminator with rotary positions, pre-LN and a final norm (as roberta-small-rope), for short runs.
preset(
    "electra-small-rope", F.ELECTRA_DISCRIMINATOR, **{**_ELECTRA_SMALL, "vocab_size": 16384},
    position="rope", norm_position="pre", final_norm=True,
)  # fmt: skip
_ELECTRA_TINY = dict(vocab_size=512, embedding_dim=32, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128)
preset("electra-tiny", F.ELECTRA_DISCRIMINATOR, **_ELECTRA_TINY)
preset("electra-tiny-generator", F.ELECTRA_GENERATOR, **_ELECTRA_TINY)

# XLNet (Yang et al. 2019 §3.1; BERT-Base sizes): 32,000-piece SentencePiece vocabulary; pretraining segments of
# 512 tokens with 384 of memory (the released pretraining scripts' seq_len / mem_len).
preset(
    "xlnet-base", F.XLNET, vocab_size=32000, d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_seq_len=512,
    mem_len=384, pad_id=5,
)  # fmt: skip
preset("xlnet-tiny", F.XLNET, vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128, mem_len=32)

# --- encoder-decoders ----------------------------------------------------------------------------------------------
# BART (Lewis et al. 2020 §2.1): base = 6 + 6 layers, large = 12 + 12; 50,265 BPE, 1024 positions.
_BART = dict(vocab_size=50265, max_seq_len=1024)
preset("bart-base", F.BART, d_model=768, n_heads=12, d_ff=3072, **_enc_dec(6), **_BART)
preset("bart-large", F.BART, d_model=1024, n_heads=16, d_ff=4096, **_enc_dec(12), **_BART)
preset("bart-tiny", F.BART, vocab_size=512, d_model=64, n_heads=4, d_ff=256, max_seq_len=128, **_enc_dec(2))

# T5 (Raffel et al. 2020 §3.1.1 and §3.7): 32,128-entry SentencePiece vocab (32k + 100 sentinels, padded),
# 32 relative-position buckets up to distance 128, head width 64 whatever d_model / n_heads is.
_T5 = dict(vocab_size=32128, max_seq_len=512, head_dim=64, rel_buckets=32, rel_max_distance=128)
preset("t5-small", F.T5, d_model=512, n_heads=8, d_ff=2048, **_enc_dec(6), **_T5)
preset("t5-base", F.T5, d_model=768, n_heads=12, d_ff=3072, **_enc_dec(12), **_T5)
preset("t5-large", F.T5, d_model=1024, n_heads=16, d_ff=4096, **_enc_dec(24), **_T5)
# T5 Table 2 "Enc-dec, shared": the decoder reuses the encoder's self-attention and feed-forward weights.
preset("t5-base-shared", F.T5, d_model=768, n_heads=12, d_ff=3072, share_encoder_decoder=True, **_enc_dec(12), **_T5)
preset("t5-v1_1-small", F.T5_V1_1, d_model=512, n_heads=6, d_ff=1024, **_enc_dec(8), **_T5)
preset("t5-v1_1-base", F.T5_V1_1, d_model=768, n_heads=12, d_ff=2048, **_enc_dec(12), **_T5)
_T5_TINY = dict(vocab_size=512, max_seq_len=128, head_dim=8, rel_buckets=8, rel_max_distance=20)
preset("t5-tiny", F.T5, d_model=64, n_heads=4, d_ff=128, **_enc_dec(2), **_T5_TINY)
preset("t5-v1_1-tiny", F.T5_V1_1, d_model=64, n_heads=4, d_ff=96, **_enc_dec(2), **_T5_TINY)

# The original Transformer (Vaswani et al. 2017 Table 3, base): post-LN, ReLU, sinusoidal positions, embeddings
# scaled by sqrt(d_model) and shared with the output layer; 37k shared BPE (WMT EN-DE). Init: the authors'
# tensor2tensor transformer_base (Glorot-uniform dense layers, the embedding N(0, d_model^-0.5); init_scheme t2t).
_VASWANI = dict(
    init_scheme="t2t",
    init_std=1.0,
    arch="encoder-decoder",
    norm_position="post",
    final_norm=False,
    activation="relu",
    position="sinusoidal",
    scale_embeddings=True,
    tie_embeddings=True,
    dropout=0.1,
)
preset(
    "transformer-base", _VASWANI, vocab_size=37000, d_model=512, n_heads=8, d_ff=2048, max_seq_len=512, **_enc_dec(6)
)
preset("transformer-tiny", _VASWANI, vocab_size=512, d_model=64, n_heads=4, d_ff=256, max_seq_len=128, **_enc_dec(2))
# Shaw et al. 2018: the base Transformer with relative position representations in place of the sinusoids, on the
# keys (eq. 4) and the values (eq. 3), one table per layer shared by the heads; clipping distance k = 20 as the
# authors' tensor2tensor `transformer_relative` (the paper finds no gain beyond k >= 2, Table 3).
_SHAW = {**_VASWANI, "position": "shaw", "rel_max_distance": 20, "shaw_values": True}
preset(
    "transformer-base-shaw", _SHAW, vocab_size=37000, d_model=512, n_heads=8, d_ff=2048, max_seq_len=512, **_enc_dec(6)
)
preset(
    "transformer-shaw-tiny", {**_SHAW, "rel_max_distance": 4}, vocab_size=512, d_model=64, n_heads=4, d_ff=256,
    max_seq_len=128, **_enc_dec(2),
)  # fmt: skip


# --- pretraining learning rates ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PretrainDefaults:
    """The peak learning rate and warmup a preset brings to a pretraining run in place of its recipe's, as it brings
    its vocabulary and context (pretraining/config.py `fit_to_model`; the user's train.lr, train.warmup_steps or
    train.warmup_ratio win). The papers set both by size, at batches of 16k-4M tokens; these are for the recipes'
    batches of 2-8k tokens and runs of 1-2k steps. A post-LN stack that trains at its recipe's lr 1e-3 at 2 layers
    of 64 sits on the unigram plateau of its loss at 6 layers of 512 (docs/train-parity.md)."""

    lr: float
    warmup_steps: int


# The recipes' lr (1e-3; t5 2e-3) is tuned at their tiny presets. Measured with bench/train_parity.py --size small
# (presets cut to 20-40M parameters; 16 x 256 tokens a step) on the bundled corpus, one H100, 2026-12-07, seed 0,
# 1,000 steps, validation loss against the loss of a predictor that reads no context (tests/test_recipes_train_at_
# every_preset.py): at the recipes' lr post-LN stacks of 6 layers of 512 sat on that plateau for all 2,000 steps
# (docs/train-parity.md) and t5-small diverged (8.2 nats); at the values below each left it, by 0.2 (T5) to 1.7
# nats (bert-base, bart-base and t5-base at full size too). Wider presets take less, as Adam's usable lr falls about as
# 1/d_model; each value is the paper's own at the smallest batch it trains that size with, where it gives one:
# - BERT (Devlin et al. 2019 App. A.2): 1e-4 for base and large at 256 x 512 tokens, 10k of 1M steps warmup.
# - RoBERTa (Liu et al. 2019): Table 3, BERT-base's size at 256 sequences, 1e-4; Table 9 at 8k sequences, base 6e-4
#   and large 4e-4 (2/3 of base's: so every large preset here), 24k / 30k of 500k steps warmup. roberta-small:
#   2e-4, which trained in lmforge and transformers alike on corpora nobody tuned to (5.96 nats; 1e-3: 6.8).
# - ELECTRA (Clark et al. 2020 Tables 6-7): small 5e-4 at 128 x 128 tokens (the batch nearest the recipes'), base
#   and large 2e-4; 10k steps warmup.
# - BART (Lewis et al. 2020 §5.1) gives no pretraining lr; it trains as RoBERTa does, so RoBERTa's values by size.
# - T5 (Raffel et al. 2020 §3.1.2) trains every size with Adafactor at 1e-2 (inverse square root); the t5 recipe's
#   AdamW is not scale-free: 5e-4 measured best of 2e-3, 1e-3 and 5e-4 at t5-small's width, and trained at
#   t5-base's full size. The T5 v1.1 presets are not measured and keep the recipe's value.
# Warmup: the papers warm up over 1-6% of runs ~500x longer than the recipes' 1,000 steps, but a post-LN stack
# needs its warmup in steps more than in share of the run (Xiong et al. 2020 §3): presets of 12-24 layers warm up
# over 200 and 250 steps (RoBERTa's 24k : 30k), electra-small's 12 narrow layers over 100, roberta-small over the
# 50 it was measured with; t5-small at 2e-3 did no better with 200 (5.96).
PRETRAIN_DEFAULTS: dict[str, PretrainDefaults] = {
    "bert-base": PretrainDefaults(lr=1e-4, warmup_steps=200),
    "bert-large": PretrainDefaults(lr=7e-5, warmup_steps=250),
    "roberta-small": PretrainDefaults(lr=2e-4, warmup_steps=50),
    "roberta-base": PretrainDefaults(lr=1e-4, warmup_steps=200),
    "electra-small": PretrainDefaults(lr=5e-4, warmup_steps=100),
    "bart-base": PretrainDefaults(lr=1e-4, warmup_steps=200),
    "bart-large": PretrainDefaults(lr=7e-5, warmup_steps=250),
    "t5-small": PretrainDefaults(lr=5e-4, warmup_steps=200),
    "t5-base": PretrainDefaults(lr=5e-4, warmup_steps=200),
    "t5-base-shared": PretrainDefaults(lr=5e-4, warmup_steps=200),
    "t5-large": PretrainDefaults(lr=3e-4, warmup_steps=250),
}
"""Preset name -> its pretraining lr and warmup. Test sizes (`*-tiny`) have none: their recipes' values are theirs."""


def pretrain_defaults(name: str) -> PretrainDefaults | None:
    """The preset's own pretraining lr and warmup, None where the recipe's stand."""
    return PRETRAIN_DEFAULTS.get(name)


def get_preset(name: str, **overrides) -> ModelConfig:
    """The preset's config with field overrides applied."""
    cfg = MODELS.get(name)
    return replace(cfg, **overrides)


def preset_fields() -> set[str]:
    return {f.name for f in fields(ModelConfig)}


def model_config_from_dict(d: dict) -> ModelConfig:
    """A validated ModelConfig from a model section (a checkpoint's config.yaml, or `preset` and fields over it)."""
    raw = dict(d)
    preset = raw.pop("preset", None)
    if preset is not None:
        raw = {**asdict(get_preset(str(preset))), **raw}
    known = [f"model.{k}" for k in all_keys(ModelConfig)] + ["model.preset"]
    cfg = build_dataclass(ModelConfig, raw, "model.", known)
    cfg.validate()
    return cfg
