"""Estimated GPU memory of training a model with AdamW under bf16 autocast, per GPU, for ddp and fsdp at 1-8 GPUs
(`lmforge model info PRESET --batch B --seq T`); and the check that refuses, before any work, a model whose
training state alone exceeds the machine's memory (`check_model_fits`).

Model states (Rajbhandari et al. 2020, ZeRO §3): fp32 weights (4 bytes per parameter), fp32 gradients (4) and
AdamW's two fp32 moments (8). ddp holds all of them on every GPU, plus its gradient buckets (4, with more than one
GPU) and autocast's bf16 copies of the weight matrices (2); fsdp divides the 16 bytes by the GPU count and adds
what is unsharded at a time: the root unit's weights in bf16 for the whole step (embeddings and head), and per
block two blocks' bf16 weights (the current one and the prefetched one) plus one block's fp32 gradients before
their reduce-scatter.

Activations (bf16 autocast, SDPA flash/memory-efficient attention so no T×T score matrix; cf. Korthikanti et al.
2022 §4) per token and layer: the fp32 residual entering each of the two norms (4·d each), the bf16 inputs of the
QKV and output projections (2·d each), q, k and v (2·d + 4·d_kv) and the attention output (2·d), the MLP input
(2·d) and its hidden activations (4·d_ff for GELU/ReLU, 8·d_ff for gated units), plus about 8·d outside the blocks
and 10·V for the logits (bf16 output, fp32 log-softmax and its gradient). With activation checkpointing a block
keeps only its fp32 input (4·d) and one block is recomputed at a time. Encoder-decoders count their decoder
blocks too, with 8·d more each for cross-attention. Estimates: the allocator's fragmentation and workspaces come
on top (count about 10%)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from lmforge.errors import LMForgeError
from lmforge.models import ModelConfig, Transformer

GIB = 1024**3
GPU_COUNTS = (1, 2, 4, 8)


@dataclass
class Sizes:
    """What the estimate needs of a model."""

    params: int
    root_params: int
    """Parameters outside the blocks that get their own FSDP unit (embeddings, heads, norms, shared blocks)."""
    block_params: int
    """Parameters of the largest block unit."""
    layers: int
    d_model: int
    act_per_token: float
    """Activation bytes per token of all blocks without checkpointing."""
    act_block: float
    """Activation bytes per token of the largest block."""
    act_outside: float
    """Activation bytes per token outside the blocks (embeddings, final norm, logits)."""


def model_sizes(cfg: ModelConfig) -> Sizes:
    """Parameter counts (from the model built on the meta device) and activation bytes per token."""
    from lmforge.train.parallel import shard_units

    with torch.device("meta"):
        model = Transformer(cfg)
    units = shard_units(model)
    in_units = {id(p) for u in units for p in u.parameters()}
    root = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values() if id(p) not in in_units)
    block = max((sum(p.numel() for p in u.parameters()) for u in units), default=0)
    d, d_kv = cfg.d_model, cfg.kv_heads * cfg.dim_head
    gated = cfg.activation in ("swiglu", "geglu", "reglu")
    per_layer = 16 * d + 4 * d_kv + (8 if gated else 4) * cfg.d_ff
    n_dec = cfg.decoder_layers if cfg.is_encoder_decoder else 0
    layers = cfg.n_layers + n_dec
    total = layers * per_layer + n_dec * 8 * d
    outside = 8 * d + (10 * cfg.vocab_size if cfg.lm_head else 0)
    return Sizes(model.num_params(), root, block, layers, d, total, per_layer + (8 * d if n_dec else 0), outside)


@dataclass
class Estimate:
    """Bytes per GPU."""

    weights: float
    grads: float
    optimizer: float
    buffers: float
    activations: float
    activations_ckpt: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.buffers + self.activations

    @property
    def total_ckpt(self) -> float:
        return self.total - self.activations + self.activations_ckpt


def estimate(s: Sizes, parallel: str, gpus: int, tokens: int) -> Estimate:
    """Memory per GPU of one training step over `tokens` tokens per GPU (batch × sequence length)."""
    acts = tokens * (s.act_per_token + s.act_outside)
    acts_ckpt = tokens * (s.layers * 4 * s.d_model + s.act_block + s.act_outside)
    if parallel == "ddp":
        buckets = 4 * s.params if gpus > 1 else 0
        return Estimate(4 * s.params, 4 * s.params, 8 * s.params, buckets + 2 * s.params, acts, acts_ckpt)
    shard = s.params / gpus
    unsharded = 2 * s.root_params + 2 * 2 * s.block_params + 4 * s.block_params
    return Estimate(4 * shard, 4 * shard, 8 * shard, unsharded, acts, acts_ckpt)


def memory_table(cfg: ModelConfig, batch: int, seq: int) -> str:
    """A table of the estimated memory per GPU (GiB) for ddp and fsdp on 1, 2, 4 and 8 GPUs."""
    s = model_sizes(cfg)
    tokens = batch * seq
    head = (f"memory per GPU (GiB), AdamW + bf16 autocast, batch {batch} × {seq} tokens per GPU "
            f"(estimate; allocator overhead not included):")  # fmt: skip
    cols = ["parallel", "GPUs", "weights", "grads", "AdamW", "buffers", "activations", "total", "with act. ckpt"]
    rows = [cols]
    for parallel in ("ddp", "fsdp"):
        for n in GPU_COUNTS:
            e = estimate(s, parallel, n, tokens)
            values = (e.weights, e.grads, e.optimizer, e.buffers, e.activations, e.total, e.total_ckpt)
            rows.append([parallel, str(n), *(f"{v / GIB:.1f}" for v in values)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    note = "buffers: ddp gradient buckets and autocast's bf16 weight copies; fsdp: unsharded bf16 blocks and root"
    return "\n".join([head, *lines, note])


# --- refusing a model that cannot fit, before any work ----------------------------------------------------------

STATE_BYTES = {"adamw": 16, "muon": 12}
"""Bytes per parameter that training holds whatever the batch: fp32 weights (4) and gradients (4), and the
optimizer's state: AdamW's two moments (8); Muon's momentum (4) on the blocks' matrices, whose AdamW rest makes
this a lower bound."""


OPTIMIZER_NAMES = {"adamw": "AdamW", "muon": "Muon"}


def host_memory() -> int:
    """This machine's RAM in bytes, or the memory limit of this process's cgroup (a container's) when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):  # cgroup v2, v1
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def available_memory(device: torch.device, parallel: str = "ddp", world_size: int = 1, offload: bool = False):
    """(bytes, what they are) that a run's training state may take on `device`: the GPU's memory (times the GPUs
    under fsdp, which shards the state, unless fsdp keeps it in CPU memory), else the machine's RAM."""
    if device.type == "cuda" and not (parallel == "fsdp" and offload):
        total = torch.cuda.mem_get_info(device)[1]
        if parallel == "fsdp" and world_size > 1:
            return total * world_size, f"the {world_size} GPUs' {_gib(total * world_size)} (fsdp shards it)"
        return total, f"the GPU's {_gib(total)}"
    return host_memory(), f"this machine's {_gib(host_memory())} of RAM"


def check_model_fits(cfg: ModelConfig, optimizer: str, available: int, where: str) -> None:
    """Refuse, in one line naming the fields that make it so large, a model whose training state (weights, gradients,
    optimizer state: `STATE_BYTES` a parameter, from the config's lower-bound parameter count) exceeds `available`
    bytes (`where`: what they are, as `available_memory` says). Activations come on top, so a model refused here
    could never train there."""
    from lmforge.models.size import estimate_params
    from lmforge.registry import MODELS

    size = estimate_params(cfg)
    need = size.total * STATE_BYTES.get(optimizer, 16)
    if need <= available:
        return
    part, fields = size.largest()
    base = MODELS.get(cfg.name) if cfg.name in MODELS else None
    changed = [f for f in fields if base is not None and getattr(base, f) != getattr(cfg, f)]
    named = ", ".join(f"model.{f}={getattr(cfg, f)}" for f in changed) or f"model {cfg.name}"
    per = STATE_BYTES.get(optimizer, 16)
    raise LMForgeError(
        f"{named}: about {_count(size.total)} parameters (most in its {part}), whose training needs at least "
        f"{_gib(need)} for fp32 weights, gradients and {OPTIMIZER_NAMES.get(optimizer, optimizer)} state ({per} "
        f"bytes a parameter), more than {where}; make the model smaller"
    )


def _gib(n: float) -> str:
    return f"{n / GIB:,.0f} GiB" if n >= 10 * GIB else f"{n / GIB:.1f} GiB"


def _count(n: int) -> str:
    for unit, scale in (("trillion", 1e12), ("billion", 1e9), ("million", 1e6)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,}"
