"""Initialisation parity: every family starts as its reference starts it (models/init.py, ModelConfig.init_scheme).

Families with a `transformers` twin (GPT-2, GPT-1, Llama, BERT, RoBERTa, ALBERT, ELECTRA generator and discriminator,
BART, T5 v1.0 and v1.1, XLNet; UniLM and MAE-LM through their BERT / RoBERTa shapes): lmforge's model is built from
its preset with lmforge's own init, the twin from the converter's `config_to_hf` with `from_config`, so HF's own
`_init_weights` runs. Every tensor the converter maps is compared with its HF counterpart (a fused q/k/v split back
into HF's three): the std within 5% relative — or 4 standard errors of the difference for tensors too small for 5% to
be tight (relative-position tables, the NSP and RTD outputs) — the mean within 4 standard errors, constant tensors
(norm gains, biases) exactly, and the token-embedding rows that start at zero (HF's padding_idx) are the same rows.
Every lmforge parameter must be covered. Widths of 256 and a 2,000-token vocabulary keep the estimates tight: a
256 x 256 matrix's std has a standard error of 0.3%.

T5 v1.1's untied head follows the twin, N(0, initializer_factor); Mesh TF's own `logits` layer is a fan-in dense layer,
N(0, d_model^-0.5) (a known difference of transformers: its PR #26441, t5x issue #1477).

HF RoBERTa also zeroes row pad_id (1) of its position table; lmforge's RoBERTa never reads that row (its positions
start at row 2), so its stats are compared but its zero row is not.

Families without a twin are held to their reference code's rule:
- Transformer-XL: transformers 5 has no TransfoXL class. The released PyTorch code (kimiyoung/transformer-xl,
  train.py `weights_init`, init='normal', init_std=0.02): linear weights, embeddings and the u, v biases N(0, 0.02),
  biases 0, LayerNorm gains N(1, 0.02) and biases 0; no residual rescale.
- gpt-fast (the gpt-fast recipe's gpt-fast-124m and its test size): GPT-2's N(0, 0.02) for the embedding, q/k/v, MLP
  input and untied head; attention-output and MLP-down projections zero (the modded-nanoGPT speedrun's zero init);
  RMSNorm gains, QK-norm gains included, 1.
- MTP heads (Gloeckle et al. 2024; DeepSeek-V3 §2.2; neither publishes an init): the trunk's scheme, so a GPT-2
  trunk's head blocks get GPT-2's residual rescale and a Llama trunk's get none.
- MAE-LM's decoder (Meng et al. 2024; fairseq RoBERTa's init_bert_params): N(0, 0.02), pad row zero, no rescale.
- The Transformer of Vaswani et al. 2017 and its Shaw et al. 2018 variant (transformer-*): their tensor2tensor code,
  transformer_base's initializer "uniform_unit_scaling" (optimize.get_variable_initializer: variance scaling, fan_avg,
  uniform, gain 1.0 = Glorot-uniform) for every dense kernel (q, k, v separate layers there) and for Shaw's relative
  tables; the token embedding (shared with the softmax) N(0, d_model^-0.5) (modalities.get_weights); biases 0,
  LayerNorm 1 and 0."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import transformers
from torch import Tensor, nn

from lmforge.checkpoint.read import upgrade_saved_model
from lmforge.models import Transformer, get_preset
from lmforge.models.hf.base import converter_of
from lmforge.models.init import token_embedding_std
from lmforge.models.presets import model_config_from_dict
from lmforge.objectives.electra import ElectraModel, generator_config
from lmforge.objectives.mae_lm import decoder_config

transformers.logging.set_verbosity_error()

SIZE = dict(vocab_size=2000, d_model=256, n_heads=4, d_ff=1024, n_layers=2, dropout=0.0, attn_dropout=0.0)
ENC_DEC = dict(SIZE, n_decoder_layers=2)
T5_SIZE = dict(ENC_DEC, n_heads=8, head_dim=32, rel_buckets=32, rel_max_distance=128)

TWINS = {
    "gpt2": ("gpt-tiny", SIZE),
    "gpt1": ("gpt1-tiny", SIZE),
    "llama": ("llama-tiny", SIZE),
    "bert": ("bert-tiny", SIZE),
    "roberta": ("roberta-tiny", SIZE),
    "albert": ("albert-tiny", dict(SIZE, embedding_dim=128)),
    "electra-discriminator": ("electra-tiny", dict(SIZE, embedding_dim=128)),
    "electra-generator": ("electra-tiny-generator", dict(SIZE, embedding_dim=128)),
    "bart": ("bart-tiny", ENC_DEC),
    "t5-v1.0": ("t5-tiny", T5_SIZE),
    "t5-v1.1": ("t5-v1_1-tiny", T5_SIZE),
    "t5-factor-0.5": ("t5-tiny", dict(T5_SIZE, init_std=0.5)),  # HF initializer_factor 0.5: every std halves
    "xlnet": ("xlnet-tiny", SIZE),
    "unilm": ("unilm-tiny", SIZE),  # BERT with six segment types
    "mae-lm-encoder": ("mae-lm-tiny", SIZE),  # RoBERTa without a head
}


def build(preset: str, **overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(get_preset(preset, **overrides))


def hf_twin(model: Transformer) -> tuple[object, nn.Module]:
    """The converter of `model` and its `transformers` twin, initialised by HF's own `_init_weights`."""
    cfg = model.config
    conv = converter_of(cfg, model.state_dict())
    hf = conv.config_to_hf(cfg)
    hf_cfg = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
    torch.manual_seed(1)
    return conv, getattr(transformers, conv.auto_class(cfg)).from_config(hf_cfg)


def zero_rows(t: Tensor) -> list[int]:
    return torch.nonzero(t.detach().flatten(1).abs().sum(1) == 0).flatten().tolist()


def assert_same_init(ours: Tensor, theirs: Tensor, label: str) -> None:
    """ours and theirs were drawn from the same distribution (std, mean), or are the same constant."""
    a, b = ours.detach().double().flatten(), theirs.detach().double().flatten()
    if b.numel() == 1 or b.std() == 0:
        assert a.numel() == 1 or a.std() == 0, f"{label}: ours varies (std {a.std():.4g}), theirs is constant"
        assert abs(a.mean() - b.mean()) < 1e-6, f"{label}: constant {a.mean():.6g} vs {b.mean():.6g}"
        return
    rel = math.sqrt(1 / (2 * a.numel()) + 1 / (2 * b.numel()))  # relative standard error of the std difference
    tol = max(0.05, 4 * rel)
    ratio = float(a.std() / b.std())
    assert abs(ratio - 1) < tol, f"{label}: std {a.std():.4g} vs HF {b.std():.4g} (ratio {ratio:.3f}, tol {tol:.3f})"
    se_mean = float(b.std()) * math.sqrt(1 / a.numel() + 1 / b.numel())
    assert abs(a.mean() - b.mean()) < 4 * se_mean, f"{label}: mean {a.mean():.4g} vs HF {b.mean():.4g}"


def assert_init_parity(model: Transformer) -> None:
    """Every lmforge parameter against the HF tensor(s) the converter maps it to."""
    cfg = model.config
    conv, hf = hf_twin(model)
    ours, theirs = model.state_dict(), conv.normalize(dict(hf.state_dict()))  # bare models lack the prefix
    covered = set()
    for p in conv.pairs(cfg):
        covered.add(p.ours)
        t = ours[p.ours]
        parts = t.split(list(p.split), dim=0) if len(p.theirs) > 1 else (t,)
        for name, part in zip(p.theirs, parts):
            assert_same_init(part, theirs[name], f"{p.ours} ~ {name}")
        if p.ours == "tok_emb.weight":  # HF's padding_idx row
            assert zero_rows(t) == zero_rows(theirs[p.theirs[0]]), "zero rows of the token embedding"
    params = {n for n, _ in model.named_parameters()}  # tied tensors once, under their owner's name
    assert params <= covered, f"not compared: {sorted(params - covered)}"


@pytest.mark.parametrize("family", sorted(TWINS))
def test_init_matches_the_transformers_twin(family):
    preset, size = TWINS[family]
    assert_init_parity(build(preset, **size))


def test_electra_objective_generator_and_discriminator_match_their_twins():
    """The pair the electra objective trains: a quarter-width generator sharing the discriminator's embeddings."""
    disc = get_preset("electra-tiny", **dict(SIZE, n_heads=8, embedding_dim=128))
    torch.manual_seed(0)
    pair = ElectraModel(disc, generator_config(disc, 0.25, None))
    assert pair.generator.tok_emb is pair.discriminator.tok_emb
    assert_init_parity(pair.discriminator)
    assert_init_parity(pair.generator)


def test_t5_v1_0_tied_embedding_has_std_1():
    """Mesh TF / HF T5: the shared embedding is N(0, 1); the head reads it after a d_model^-0.5 rescale."""
    model = build("t5-tiny")
    assert model.lm_head.weight is model.tok_emb.weight
    assert abs(float(model.tok_emb.weight.std()) - 1.0) < 0.03
    assert token_embedding_std(model.config) == 1.0  # what rows added to the vocabulary later are drawn from
    # Logits of unit scale at init: RMS-normalised states x d_model^-0.5 against a unit-variance embedding.
    with torch.no_grad():
        out = model(torch.randint(0, 512, (2, 16)), decoder_input_ids=torch.randint(0, 512, (2, 8)))
    assert 0.3 < float(out.logits.std()) < 3.0


def test_imported_configs_keep_their_family_init():
    """config_from_hf builds through the family, so a converted model keeps its scheme, pad row and std."""
    for family, (preset, size) in TWINS.items():
        model = build(preset, **size)
        cfg = model.config
        conv = converter_of(cfg, model.state_dict())
        back = conv.config_from_hf(conv.config_to_hf(cfg), conv.state_to_hf(model.state_dict(), cfg))
        got = (back.init_scheme, back.zero_pad_embedding, back.init_std)
        assert got == (cfg.init_scheme, cfg.zero_pad_embedding, cfg.init_std), family


def test_saved_configs_from_before_init_schemes_rebuild_their_init():
    """A model section written before init_scheme existed rebuilds the init it was trained with (GPT-2's, for every
    family then), so resuming or re-initialising an old run changes nothing."""
    old = dataclasses.asdict(get_preset("t5-tiny", init_std=0.02))
    for k in ("init_scheme", "zero_pad_embedding"):
        old.pop(k)
    cfg = model_config_from_dict(upgrade_saved_model(old))
    assert (cfg.init_scheme, cfg.zero_pad_embedding, cfg.init_std) == ("gpt2", False, 0.02)


def _expect(t: Tensor, std: float, label: str, mean: float = 0.0) -> None:
    """t was drawn from N(mean, std) (std 0: t is the constant `mean`)."""
    t = t.detach().double().flatten()
    if std == 0:
        assert torch.all(t == mean), f"{label}: expected the constant {mean}"
        return
    tol = max(0.05, 4 / math.sqrt(2 * t.numel()))
    assert abs(float(t.std()) / std - 1) < tol, f"{label}: std {t.std():.4g}, expected {std:.4g}"
    assert abs(float(t.mean()) - mean) < 4 * std / math.sqrt(t.numel()), f"{label}: mean {t.mean():.4g}"


def test_transformer_xl_follows_the_released_code():
    model = build("transformer-xl-tiny", **SIZE)
    seen = 0
    for name, p in model.named_parameters():
        if "norm" in name:
            _expect(p, 0.02 if name.endswith("weight") else 0.0, name, mean=1.0 if name.endswith("weight") else 0.0)
        elif name.endswith("bias"):
            _expect(p, 0.0, name)
        else:  # tok_emb, qkv, o (not rescaled), r, u, v, MLP
            _expect(p, 0.02, name)
        seen += 1
    assert seen > 20


def test_gpt_fast_follows_gpt2_with_zero_output_projections():
    for preset in ("gpt-fast-tiny", "gpt-fast-124m"):
        cfg = get_preset(preset, **SIZE)
        assert cfg.init_scheme == "gpt2" and cfg.zero_init_proj and not cfg.tie_embeddings
    model = build("gpt-fast-tiny", **SIZE)
    for name, p in model.named_parameters():
        if name.endswith(("attn.o.weight", "mlp.down.weight")):
            _expect(p, 0.0, name)
        elif "norm" in name:
            _expect(p, 0.0, name, mean=1.0)
        else:  # tok_emb, qkv, mlp.up, lm_head
            _expect(p, 0.02, name)


@pytest.mark.parametrize("preset", ["gpt-mtp-tiny", "llama-mtp-tiny"])
def test_mtp_heads_follow_the_trunk_scheme(preset):
    model = build(preset, **SIZE)
    cfg = model.config
    residual = 0.02 / math.sqrt(2 * cfg.n_layers) if cfg.init_scheme == "gpt2" else 0.02
    for name, p in model.mtp.named_parameters():
        if "norm" in name:
            _expect(p, 0.0, name, mean=1.0 if name.endswith("weight") else 0.0)
        elif name.endswith("bias"):
            _expect(p, 0.0, name)
        elif name.endswith(("attn.o.weight", "mlp.down.weight")):
            _expect(p, residual, name)
        else:
            _expect(p, 0.02, name)
    # The trunk starts exactly as without heads.
    trunk = build(preset, **dict(SIZE, mtp_heads=0))
    for name, t in trunk.state_dict().items():
        assert torch.equal(t, model.state_dict()[name]), name


def test_mae_lm_decoder_follows_roberta():
    enc = get_preset("mae-lm-tiny", **SIZE)
    torch.manual_seed(0)
    dec = Transformer(decoder_config(enc, 2))
    assert (dec.config.init_scheme, dec.config.zero_pad_embedding) == ("normal", True)
    assert zero_rows(dec.tok_emb.weight) == [enc.pad_id]
    for name, p in dec.named_parameters():
        if "norm" in name:
            _expect(p, 0.0, name, mean=1.0 if name.endswith("weight") else 0.0)
        elif name.endswith("bias"):
            _expect(p, 0.0, name)
        else:
            _expect(p, 0.02, name)


def _expect_uniform(t: Tensor, limit: float, label: str) -> None:
    """t was drawn from U(-limit, limit): the std of one, and its range filled but not exceeded."""
    _expect(t, limit / math.sqrt(3), label)
    top = float(t.detach().abs().max())
    assert 0.95 * limit < top <= limit, f"{label}: max |w| {top:.4g}, limit {limit:.4g}"


def _glorot(rows: int, cols: int) -> float:
    return math.sqrt(6 / (rows + cols))


def test_vaswani_transformer_follows_tensor2tensor():
    model = build("transformer-shaw-tiny", **ENC_DEC)
    cfg = model.config
    d, q, kv = cfg.d_model, cfg.n_heads * cfg.dim_head, cfg.kv_heads * cfg.dim_head
    assert token_embedding_std(cfg) == d**-0.5
    for name, p in model.named_parameters():
        if "norm" in name:
            _expect(p, 0.0, name, mean=1.0 if name.endswith("weight") else 0.0)
        elif name.endswith("bias"):
            _expect(p, 0.0, name)
        elif name == "tok_emb.weight":
            _expect(p, d**-0.5, name)
        elif name.endswith("attn.qkv.weight"):
            for part, rows in zip(p.split([q, kv, kv]), "qkv"):
                _expect_uniform(part, _glorot(part.shape[0], d), f"{name}[{rows}]")
        elif name.endswith("cross_attn.kv.weight"):
            for part, rows in zip(p.split([kv, kv]), "kv"):
                _expect_uniform(part, _glorot(part.shape[0], d), f"{name}[{rows}]")
        else:  # other dense kernels and Shaw's relative tables (2k + 1, head_dim)
            _expect_uniform(p, _glorot(*p.shape), name)
