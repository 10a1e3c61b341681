"""Gradual magnitude pruning while pretraining (Gordon et al. 2020, "Compressing BERT: Studying the Effects of Weight
Pruning on Transfer Learning"), on Zhu & Gupta's (2017) cubic schedule, and the masks that a fine-tuning run from a
pruned run keeps.

Gordon et al. pruned BERT with TensorFlow's model_pruning library: every weight matrix of the encoder (query, key,
value, attention output, both feed-forward layers, the pooler) and the word-embedding table is a masked layer, each
pruned on its own to the same sparsity (the smallest |w| of that matrix are zeroed); the masks are recomputed every
`pruning_frequency` = 10 steps at s_t = s_f + (s_i − s_f)(1 − p)³, p = (t − t_0) / (t_end − t_0) clipped to [0, 1],
with s_i = 0, t_0 = 0 and t_end = 10,000 steps of a 100,000-step run; the masks keep being recomputed at s_f after
t_end. Their GLUE runs load the masked layers, so fine-tuning keeps the pretraining masks.

Here the masked weights are set to zero after every optimizer step (the forward sees W ⊙ M, as with the library's
masked layers, and a weight once pruned is the smallest of its matrix, so it stays pruned while the sparsity rises).
The zeros are the mask: a resumed run and a fine-tuning run read it back from the weights (w ≠ 0)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor, nn

from lmforge.config.types import Fraction, NonNegInt, OpenFraction, PosFloat, PosInt
from lmforge.errors import LMForgeError
from lmforge.train.callbacks import Callbacks


@dataclass
class PruneConfig:
    """Pruning while pretraining (`prune.*` of a pretraining recipe)."""

    during_pretraining: bool = False
    """Gradual magnitude pruning of the blocks' linear weights (and the token embeddings) during this run (Gordon et
    al. 2020); a fine-tuning run initialised from it keeps the zeros (docs/compression.md)."""
    sparsity: OpenFraction = 0.5
    """Target sparsity s_f: the fraction of each pruned matrix set to zero (Gordon et al.: 0.3 to 0.9)."""
    initial_sparsity: Fraction = 0.0
    """s_i, the sparsity of the first mask (Zhu & Gupta's schedule starts there)."""
    begin_step: NonNegInt = 0
    """t_0: the optimizer step the schedule starts at (the first mask comes `every` steps later)."""
    end_step: PosInt | None = None
    """t_end: the step the target sparsity is reached (None: a tenth of train.max_steps, Gordon et al.'s 10k of
    100k); pruning goes on at the target afterwards."""
    every: PosInt = 10
    """Steps between two mask updates (the model_pruning library's pruning_frequency)."""
    exponent: PosFloat = 3.0
    """The schedule's power (3: Zhu & Gupta's cubic schedule)."""
    scope: Literal["layer", "global"] = "layer"
    """layer: each matrix pruned to the sparsity on its own (the library Gordon et al. used); global: one threshold
    over all of them together."""
    embeddings: bool = True
    """Prune the token-embedding table too (Gordon et al. pruned BERT's word embeddings)."""


def sparsity_at(step: int, cfg: PruneConfig, end_step: int) -> float:
    """s_t = s_f + (s_i − s_f)(1 − p)^exponent, p = (t − t_0) / (t_end − t_0) clipped to [0, 1] (Zhu & Gupta eq. 1)."""
    p = min(1.0, max(0.0, (step - cfg.begin_step) / (end_step - cfg.begin_step)))
    return cfg.sparsity + (cfg.initial_sparsity - cfg.sparsity) * (1.0 - p) ** cfg.exponent


def prunable_weights(model: nn.Module, embeddings: bool = True) -> list[tuple[str, nn.Parameter]]:
    """(name, weight) of every nn.Linear inside a transformer block (attention projections, MLPs), of BERT's pooler
    and, with `embeddings`, of every token-embedding table (`tok_emb`): the layers Gordon et al. masked. A tied LM
    head shares the table and is not listed twice; other heads and the position and segment tables are left out."""
    out, seen = [], set()
    for name, m in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        is_block_linear = isinstance(m, nn.Linear) and (".blocks." in f".{name}" or last == "pooler")
        is_token_table = embeddings and isinstance(m, nn.Embedding) and last == "tok_emb"
        if (is_block_linear or is_token_table) and id(m.weight) not in seen:
            seen.add(id(m.weight))
            out.append((f"{name}.weight", m.weight))
    if not out:
        raise LMForgeError("the model has no transformer-block linear layers to prune")
    return out


@torch.no_grad()
def magnitude_masks(weights: list[Tensor], sparsity: float, scope: Literal["layer", "global"]) -> list[Tensor]:
    """Boolean keep-masks: the round(n·(1 − sparsity)) largest |w| kept in each tensor (layer) or over all of
    them together (global), the rest False."""
    if scope == "layer":
        return [_keep_largest(w.abs().flatten(), sparsity).view_as(w) for w in weights]
    flat = torch.cat([w.abs().flatten().float() for w in weights])
    keep = _keep_largest(flat, sparsity)
    return [m.view_as(w) for m, w in zip(keep.split([w.numel() for w in weights]), weights)]


def _keep_largest(a: Tensor, sparsity: float) -> Tensor:
    k = round(a.numel() * (1.0 - sparsity))
    keep = torch.zeros(a.numel(), dtype=torch.bool, device=a.device)
    if k > 0:
        keep[a.topk(k, sorted=False).indices] = True
    return keep


class GradualPruner:
    """The `step` callback that recomputes the masks on the schedule and zeroes the pruned weights after every
    optimizer step. `total()` is the run's planned steps (for the default end step)."""

    def __init__(self, cfg: PruneConfig, model: nn.Module, total: Callable[[], int]) -> None:
        self.cfg, self.total = cfg, total
        self.named = prunable_weights(model, cfg.embeddings)
        self.masks: list[Tensor] | None = None
        self.sparsity = 0.0
        """The schedule's sparsity at the last mask update."""

    def end_step(self) -> int:
        return self.cfg.end_step if self.cfg.end_step is not None else max(self.cfg.begin_step + 1, self.total() // 10)

    def start(self, step: int) -> None:
        """Where the loop starts, before its first step: a run resumed after the schedule began takes the zeros of
        its checkpoint as the mask (they are exactly the pruned weights)."""
        if step > self.cfg.begin_step:
            self.masks = [w.detach() != 0 for _, w in self.named]

    @torch.no_grad()
    def __call__(self, step: int) -> None:
        c = self.cfg
        weights = [w for _, w in self.named]
        if self.masks is not None:  # first W ⊙ M: the optimizer step moved pruned weights off zero
            for w, m in zip(weights, self.masks):
                w.mul_(m)
        if step > 0 and step >= c.begin_step and (step - c.begin_step) % c.every == 0:
            # New masks from the masked weights (as model_pruning does): a pruned weight stays pruned.
            self.sparsity = sparsity_at(step, c, self.end_step())
            self.masks = magnitude_masks(weights, self.sparsity, c.scope)
            for w, m in zip(weights, self.masks):
                w.mul_(m)


class MaskKeeper:
    """A `step` callback that keeps fixed zeros zero: the pruned weights of a model initialised from a pruned run."""

    def __init__(self, named: list[tuple[str, nn.Parameter]]) -> None:
        self.weights = [w for _, w in named]
        self.masks = [w.detach() != 0 for w in self.weights]

    @torch.no_grad()
    def __call__(self, step: int) -> None:
        for w, m in zip(self.weights, self.masks):
            w.mul_(m)


def with_step_callback(callbacks: Callbacks | None, fn: Callable[[int], None]) -> Callbacks:
    """A copy of `callbacks` (default: the process-wide ones) with `fn` added at `step`, so the process-wide set is
    left as it is."""
    base = callbacks or Callbacks.installed()
    out = Callbacks()
    out.by_point = {point: list(fns) for point, fns in base.by_point.items()}
    out.add("step", fn)
    return out


def _check_parallel(parallel: str, what: str) -> None:
    if parallel == "fsdp":
        raise LMForgeError(f"{what} needs whole weights on every process: use train.parallel=ddp, not fsdp")


def pretraining_callbacks(
    cfg: PruneConfig, model: nn.Module, train, callbacks: Callbacks | None, total: Callable[[], int]
) -> tuple[Callbacks | None, GradualPruner | None]:
    """The loop's callbacks with the gradual pruner added when prune.during_pretraining is on (else unchanged)."""
    if not cfg.during_pretraining:
        return callbacks, None
    check_prune_config(cfg, train)
    pruner = GradualPruner(cfg, model, total)
    return with_step_callback(callbacks, pruner), pruner


def check_prune_config(cfg: PruneConfig, train) -> None:
    """One-line errors for pruning that cannot run as asked (`train`: the run's train section)."""
    if not cfg.during_pretraining:
        return
    _check_parallel(train.parallel, "prune.during_pretraining")
    max_steps = train.max_steps
    if cfg.initial_sparsity > cfg.sparsity:
        raise LMForgeError(
            f"prune.initial_sparsity ({cfg.initial_sparsity}) is above prune.sparsity ({cfg.sparsity}): the schedule "
            "only raises the sparsity"
        )
    if cfg.end_step is not None and cfg.end_step <= cfg.begin_step:
        raise LMForgeError(f"prune.end_step ({cfg.end_step}) must be after prune.begin_step ({cfg.begin_step})")
    end = cfg.end_step if cfg.end_step is not None else max(cfg.begin_step + 1, max_steps // 10)
    if end > max_steps:
        raise LMForgeError(
            f"prune.end_step ({end}) is past train.max_steps ({max_steps}): the target sparsity would never be reached"
        )


def pretraining_prune_section(init: str) -> dict | None:
    """The prune section of the run or checkpoint `init` when it pretrained with prune.during_pretraining on."""
    from lmforge.models.pretrained import find_pretrained

    path = Path(init)
    if not path.exists():
        return None  # a preset: nothing was pruned
    _, config = find_pretrained(path)  # None for a Hugging Face dir
    prune = (config or {}).get("prune")
    return prune if isinstance(prune, dict) and prune.get("during_pretraining") else None


def finetuning_callbacks(
    init: str, backbone: nn.Module, parallel: str, callbacks: Callbacks | None = None
) -> tuple[Callbacks | None, MaskKeeper | None]:
    """The fine-tuning loop's callbacks with a MaskKeeper over the backbone's pruned weights when `init` is a run that
    pruned while pretraining (Gordon et al. fine-tune with the pretraining masks); else unchanged."""
    prune = pretraining_prune_section(init)
    if prune is None:
        return callbacks, None
    _check_parallel(parallel, f"fine-tuning from {init}, pruned while pretraining,")
    keeper = MaskKeeper(prunable_weights(backbone, bool(prune.get("embeddings", True))))
    return with_step_callback(callbacks, keeper), keeper
