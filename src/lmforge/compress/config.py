"""Compression report configuration: typed sections loaded from YAML recipes in `recipes/compress/` with
dotted CLI overrides, validated by `lmforge.config`'s helpers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from lmforge.config import all_keys, build_dataclass, recipe_dict
from lmforge.config.sections import LoopConfig, OptimConfig, optim_defaults
from lmforge.config.types import NonNegFloat, NonNegInt, OpenFraction, PosFloat, PosInt, Range, Seed


@dataclass
class TeacherConfig:
    run: str | None = None
    """A fine-tuned run dir (`lmforge finetune ...`) to compress; None = fine-tune one first with `recipe`."""
    recipe: str = "sst2-gpt"
    """Fine-tuning recipe (recipes/finetune/ name or path) for the teacher when `run` is None."""
    overrides: list[str] = field(default_factory=list)
    """Dotted overrides of that fine-tuning, e.g. ["--train.epochs=1", "--data.max_train=2000"]."""
    max_eval: PosInt | None = None
    """Use only the first N dev examples for the accuracy column (None = all)."""


@dataclass
@optim_defaults(lr=1e-4, schedule="linear", min_lr_ratio=0.0, warmup_ratio=0.1, weight_decay=0.01, beta2=0.999)
class CompressTrain(LoopConfig, OptimConfig):
    """Training of a compressed variant: AdamW, linear warmup over 10% of the steps, linear decay to 0. Each
    variant trains as an ordinary run in OUT/<variant> (resumable with `lmforge compress report --resume`)."""

    max_steps: PosInt = 300
    batch_size: PosInt = 32
    save_every: PosInt = 100
    keep_last: PosInt = 1
    device: str = "cpu"
    """Where the variant trains: cpu, cuda or cuda:N (auto: cuda if a GPU is present). The report measures every
    model on the CPU, where a trained variant returns."""


@dataclass
class TinyBertOptions:
    """TinyBERT's task-specific distillation (Jiao et al. 2020 §3): stage 1 (intermediate-layer distillation) fits
    the student's embeddings, hidden states and attention scores to the teacher's layers g(m) = m·N/M; stage 2
    (prediction-layer distillation, distill.max_steps) its logits to the teacher's."""

    n_layers: PosInt | None = None
    """Student layers M (None: half the teacher's N); N must be a multiple of M."""
    d_model: PosInt | None = None
    """Student width (None: the teacher's); a narrower student learns projections W_e, W_h to the teacher's."""
    d_ff: PosInt | None = None
    """Student MLP width (None: the teacher's d_ff scaled by the width ratio)."""
    intermediate_steps: NonNegInt = 300
    """Steps of stage 1 (0: prediction-layer distillation only)."""
    embedding: NonNegFloat = 1.0
    """Weight of L_embd = MSE(E_S W_e, E_T)."""
    hidden: NonNegFloat = 1.0
    """Weight of each layer's L_hidn = MSE(H_S W_h, H_T)."""
    attention: NonNegFloat = 1.0
    """Weight of each layer's L_attn = (1/h) Σ_i MSE(A_i^S, A_i^T) over the unnormalised attention scores."""
    init: Literal["random", "teacher"] = "random"
    """Student start: random (the paper starts from a general-distilled TinyBERT, which lmforge has not made), or the
    teacher's mapped layers g(1), ..., g(M) (a student of the teacher's width only)."""


@dataclass
class DistillSection(CompressTrain):
    method: Literal["distilbert", "tinybert"] = "distilbert"
    """distilbert: a half-depth student of the teacher's width, Hinton soft targets + hard labels + DistilBERT's
    hidden-state loss. tinybert: TinyBERT's two stages (distill.tinybert.*; temperature, soft and hard weigh stage 2's
    prediction loss, without the T² factor)."""
    layers: list[int] | None = None
    """Teacher layers the distilbert student keeps (None = every other layer: 0, 2, 4, ...)."""
    temperature: PosFloat = 2.0
    soft: NonNegFloat = 0.5
    """Weight of the soft-target loss (Hinton et al. 2015: T²-scaled KL; tinybert: the soft cross-entropy)."""
    hard: NonNegFloat = 0.5
    """Weight of the cross-entropy with the gold labels."""
    hidden: NonNegFloat = 1.0
    """Weight of the hidden-state loss (DistilBERT's cosine loss; method distilbert)."""
    hidden_kind: Literal["cosine", "mse"] = "cosine"
    tinybert: TinyBertOptions = field(default_factory=TinyBertOptions)


@dataclass
class QATSection(CompressTrain):
    """Q8BERT quantisation-aware fine-tuning of a copy of the teacher (Zafrir et al. 2019), then its int8 export."""

    bits: Annotated[int, Range(2, 8)] = 8
    """Bits of the symmetric quantisation of weights and activations (M = 2^(bits-1) - 1)."""
    ema_decay: Annotated[float, Range(0, 1, lo_open=True, hi_open=True)] = 0.9999
    """Decay of the exponential moving average of max|x| each layer's input scale comes from (nlp-architect's)."""
    embeddings: bool = True
    """Quantise the token, segment and position tables too (Q8BERT quantises every Embedding)."""
    skip: list[str] = field(default_factory=list)
    """Linear or embedding layers left in float (qualified names or their last parts, e.g. lm_head)."""
    max_steps: PosInt = 200
    lr: NonNegFloat = 5e-5


@dataclass
class PruneSection(CompressTrain):
    sparsity: OpenFraction = 0.5
    """Global magnitude pruning: the fraction of the blocks' linear weights set to zero."""
    heads: OpenFraction = 0.5
    """Head pruning: the fraction of self-attention heads removed (lowest output-projection norm first)."""
    max_steps: PosInt = 200
    """Fine-tuning steps after each kind of pruning."""
    lr: NonNegFloat = 5e-5


@dataclass
class BenchSection:
    runs: PosInt = 10
    """Timed forward passes per batch size (the median is reported)."""
    warmup: NonNegInt = 2
    threads: PosInt = 1
    """CPU threads during the whole report (1 = comparable numbers on a shared machine)."""
    eval_batch_size: PosInt = 64


Variant = Literal["int8", "distill", "prune-magnitude", "prune-heads", "q8bert"]
DEFAULT_VARIANTS = ("int8", "distill", "prune-magnitude", "prune-heads")


@dataclass
class CompressConfig:
    out: str = "runs/compress"
    """Where report.md and report.json go (and the teacher's fine-tuning run when it is trained here)."""
    seed: Seed = 0
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    distill: DistillSection = field(default_factory=DistillSection)
    prune: PruneSection = field(default_factory=PruneSection)
    bench: BenchSection = field(default_factory=BenchSection)
    quantize_skip: list[str] = field(default_factory=list)
    """Linear layers left in float32 by int8 quantisation (qualified names or their last parts, e.g. lm_head)."""
    qat: QATSection = field(default_factory=QATSection)
    variants: list[Variant] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    """The rows built after the teacher's: int8 (dynamic quantisation), distill (the student and its int8 copy),
    prune-magnitude, prune-heads, q8bert (quantisation-aware fine-tuning, exported to int8)."""


def build_compress_config(raw: dict) -> CompressConfig:
    return build_dataclass(CompressConfig, raw, "", all_keys(CompressConfig))


def load_compress_config(
    recipe: str | Path | None = None, overrides: list[str] | dict | None = None, teacher: str | None = None
) -> CompressConfig:
    """Recipe (path or bundled name in recipes/compress/) + dotted overrides (+ `--teacher RUN`)."""
    extra = {"teacher": {"run": teacher}} if teacher is not None else None
    return build_compress_config(recipe_dict(recipe, "compress", overrides, extra, schema=CompressConfig))
