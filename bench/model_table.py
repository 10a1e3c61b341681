"""The benchmarked models: each is an lmforge preset, the builder of its Hugging Face twin, and a training loss.

Adding a model is one `BENCH_MODELS` entry. A `BenchLoss` makes a synthetic batch (token values do not change the
speed, only the shapes do), computes the loss of an lmforge model and of the HF model on that batch, and counts the
model FLOPs of one training step for MFU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models import ModelConfig, Transformer
from lmforge.models.lm_head import cross_entropy
from lmforge.objectives import OBJECTIVES, Objective
from lmforge.objectives.mlm import mlm_loss
from lmforge.pretraining.config import build_config
from lmforge.registry import MODELS
from lmforge.train.metrics import flops_per_token

Batch = dict[str, Tensor]
LossFn = Callable[[nn.Module, Batch], Tensor]


@dataclass(frozen=True)
class BenchLoss:
    """A training objective as the bench runs it, for both implementations."""

    name: str
    make_batch: Callable[[ModelConfig, int, int, torch.Generator], Batch]
    """(config, batch size, sequence length, generator) → CPU tensors, identical for both implementations."""
    lmforge: LossFn
    hf: LossFn
    flops_per_step: Callable[[Transformer, Batch], float]
    """Model FLOPs of one training step (forward + backward), the same count for both implementations."""

    def tokens_per_step(self, batch: Batch) -> int:
        """Tokens counted for throughput: the (encoder) input tokens."""
        return batch["input_ids"].numel()


@dataclass(frozen=True)
class BenchModel:
    """One row group of the benchmark: {lmforge preset, HF model builder, loss}."""

    preset: str
    build_hf: Callable[[Transformer], nn.Module]
    """Builds the equivalent `transformers` model with the lmforge model's weights (raises when there is none)."""
    loss: BenchLoss
    batch: int
    seq_len: int
    overrides: dict = field(default_factory=dict)
    """ModelConfig fields changed from the preset (e.g. an MLM-only BERT without the NSP head and pooler)."""


# --- Hugging Face twins ---------------------------------------------------------------------------------------


def hf_twin(model: Transformer, hf_class: str) -> nn.Module:
    """The equivalent `transformers` model (`lmforge.models.hf.to_hf_model`: identical weights) in train mode,
    checked to be `hf_class` and switched to SDPA attention, so both sides use the same attention kernels."""
    from lmforge.models.hf import to_hf_model

    hf = to_hf_model(model)
    if type(hf).__name__ != hf_class:
        raise LMForgeError(f"to_hf_model builds {type(hf).__name__} for '{model.config.name}', not {hf_class}")
    if getattr(hf.config, "_attn_implementation", None) != "sdpa":
        hf.set_attn_implementation("sdpa")
    return hf.train()


def require_available(name: str, spec: BenchModel, preset: str | None = None) -> ModelConfig:
    """The preset's config, or a clear error when lmforge has no such preset (yet)."""
    preset = preset or spec.preset
    if preset not in MODELS:
        raise LMForgeError(f"bench model '{name}' is not available: lmforge has no '{preset}' preset")
    return replace(MODELS.get(preset), **spec.overrides)


def _ce(logits: Tensor, labels: Tensor) -> Tensor:
    # The Hugging Face side's loss: mean NLL over labelled tokens with torch's cross_entropy, which runs in float32
    # under bf16 autocast (logits (..., V) → (N, V)). The lmforge side uses lmforge's own `cross_entropy`.
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100)


def _dense_flops(model: Transformer, seq_len: int) -> float:
    """6N + 12·L·d·T per token, N = every matmul weight (a tied LM head counts: it is a matmul, not a lookup)."""
    cfg = model.config
    n = model.num_params(non_embedding=True)
    if cfg.lm_head and cfg.tie_embeddings:
        n += model.lm_head.weight.numel()
    return flops_per_token(n, cfg.n_layers, cfg.n_heads * cfg.dim_head, seq_len)


# --- causal LM (GPT-2) ----------------------------------------------------------------------------------------


def _objective(name: str) -> Objective:
    """lmforge's registered objective with default options, so the lmforge side runs what training runs."""
    return OBJECTIVES.get(name)(build_config({"objective": {"name": name}}), None)


_CAUSAL = _objective("causal_lm")


def _causal_batch(cfg: ModelConfig, batch: int, seq: int, g: torch.Generator) -> Batch:
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=g)  # (B, T + 1) packed windows
    return _CAUSAL.transform(tokens)


def _causal_hf(model: nn.Module, batch: Batch) -> Tensor:
    # use_cache=False: a training forward builds no KV cache (lmforge's does not either).
    return _ce(model(input_ids=batch["input_ids"], use_cache=False).logits, batch["labels"])


CAUSAL_LM = BenchLoss(
    name="causal_lm",
    make_batch=_causal_batch,
    lmforge=lambda model, batch: _CAUSAL.loss(model, batch).loss,
    hf=_causal_hf,
    flops_per_step=lambda model, batch: _dense_flops(model, batch["input_ids"].shape[1]) * batch["input_ids"].numel(),
)


# --- masked LM (BERT) -----------------------------------------------------------------------------------------


def _mlm_batch(cfg: ModelConfig, batch: int, seq: int, g: torch.Generator) -> Batch:
    # Ids from 5 up: no padding id inside the text (RoBERTa's HF twin numbers positions past padding).
    tokens = torch.randint(5, cfg.vocab_size, (batch, seq), generator=g)
    # BERT §3.1: 15% of positions are predicted; a fixed count per row keeps the step's shapes constant.
    k = max(1, round(0.15 * seq))
    picked = torch.rand(batch, seq, generator=g).topk(k, dim=1).indices  # (B, k)
    selected = torch.zeros(batch, seq, dtype=torch.bool).scatter_(1, picked, True)
    mask_id = min(103, cfg.vocab_size - 1)  # [MASK] of the bert-base vocabulary
    return {
        "input_ids": tokens.masked_fill(selected, mask_id),
        "labels": tokens.masked_fill(~selected, -100),
        "mlm_index": selected.flatten().nonzero().squeeze(1),  # as the MLM objective's transform gives it
    }


def _mlm_lmforge(model: nn.Module, batch: Batch) -> Tensor:
    # The MLM objective's loss: the head runs on the masked positions only, (n_masked, d) → (n_masked, V).
    return mlm_loss(model, batch)[0]


def _mlm_hf(model: nn.Module, batch: Batch) -> Tensor:
    # BertForMaskedLM computes logits at every position (B, T, V); the loss ignores unmasked ones.
    return _ce(model(input_ids=batch["input_ids"]).logits, batch["labels"])


MASKED_LM = BenchLoss(
    name="masked_lm",
    make_batch=_mlm_batch,
    lmforge=_mlm_lmforge,
    hf=_mlm_hf,
    # Counted as if the head ran at every position (what HF computes), so both sides share one FLOP count.
    flops_per_step=lambda model, batch: _dense_flops(model, batch["input_ids"].shape[1]) * batch["input_ids"].numel(),
)


# --- span corruption (T5) -------------------------------------------------------------------------------------


def t5_target_len(input_len: int, noise: float = 0.15, mean_span: float = 3.0) -> int:
    """Target length for `input_len` corrupted inputs (T5 §3.1.4, `random_spans_helper`: 512 inputs → 114)."""
    raw = input_len
    while True:  # grow the raw length until its corrupted form (kept tokens + sentinels + EOS) fills input_len
        n_noise = round(raw * noise)
        n_spans = max(1, round(n_noise / mean_span))
        if raw - n_noise + n_spans + 1 > input_len:
            break
        raw += 1
    raw -= 1
    n_noise = round(raw * noise)
    return n_noise + max(1, round(n_noise / mean_span)) + 1


def _span_batch(cfg: ModelConfig, batch: int, seq: int, g: torch.Generator) -> Batch:
    inputs = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    labels = torch.randint(0, cfg.vocab_size, (batch, t5_target_len(seq)), generator=g)
    start = torch.full((batch, 1), cfg.decoder_start_id, dtype=torch.long)
    return {"input_ids": inputs, "decoder_input_ids": torch.cat([start, labels[:, :-1]], 1), "labels": labels}


def _span_lmforge(model: nn.Module, batch: Batch) -> Tensor:
    logits = model(batch["input_ids"], decoder_input_ids=batch["decoder_input_ids"]).logits
    return cross_entropy(logits, batch["labels"])


def _span_hf(model: nn.Module, batch: Batch) -> Tensor:
    out = model(input_ids=batch["input_ids"], decoder_input_ids=batch["decoder_input_ids"], use_cache=False)
    return _ce(out.logits, batch["labels"])


def _enc_dec_flops(model: Transformer, batch: Batch) -> float:
    """6N + attention FLOPs of one step, encoder over T_e input tokens and decoder over T_d target tokens."""
    cfg = model.config
    B, t_enc = batch["input_ids"].shape
    t_dec = batch["decoder_input_ids"].shape[1]
    d = cfg.n_heads * cfg.dim_head
    n_enc = sum(p.numel() for p in model.encoder.parameters())
    n_cross_kv = sum(p.numel() for n, p in model.decoder.named_parameters() if ".cross_attn.kv." in n)
    n_dec = sum(p.numel() for p in model.decoder.parameters()) - n_cross_kv + model.lm_head.weight.numel()
    # Cross-attention keys/values are projections of the T_e encoder outputs, not of the decoder tokens.
    per_row = t_enc * (6 * (n_enc + n_cross_kv) + 12 * cfg.n_layers * d * t_enc)
    per_row += t_dec * (6 * n_dec + 12 * cfg.decoder_layers * d * (t_dec + t_enc))
    return float(B * per_row)


SPAN_CORRUPTION = BenchLoss(
    name="span_corruption",
    make_batch=_span_batch,
    lmforge=_span_lmforge,
    hf=_span_hf,
    flops_per_step=_enc_dec_flops,
)


# --- the table ------------------------------------------------------------------------------------------------

# A missing preset makes a model "not available"; a preset without a Hugging Face converter still runs its lmforge
# rows, and its HF rows report why there is no twin.
BENCH_MODELS: dict[str, BenchModel] = {
    "gpt2": BenchModel("gpt2-124m", partial(hf_twin, hf_class="GPT2LMHeadModel"), CAUSAL_LM, 16, 1024),
    # MLM only (no NSP head or pooler), as BertForMaskedLM.
    "bert": BenchModel(
        "bert-base",
        partial(hf_twin, hf_class="BertForMaskedLM"),
        MASKED_LM,
        32,
        512,
        {"nsp_head": False, "pooler": False},
    ),
    # RoBERTa-base's MLM (no NSP), as RobertaForMaskedLM.
    "roberta": BenchModel("roberta-base", partial(hf_twin, hf_class="RobertaForMaskedLM"), MASKED_LM, 256, 128),
    # 512 inputs → 114 targets as in T5 pretraining.
    "t5": BenchModel("t5-base", partial(hf_twin, hf_class="T5ForConditionalGeneration"), SPAN_CORRUPTION, 16, 512),
}
