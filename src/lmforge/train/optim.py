"""AdamW with decoupled weight decay on matrices only (optionally layer-wise learning rates), and the warmup +
decay learning-rate schedule."""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from lmforge.config import TrainConfig

_BLOCK = re.compile(r"(?:^|\.)(encoder|decoder)\.blocks\.(\d+)\.")
_STACK = re.compile(r"(?:^|\.)(encoder|decoder)\.")
_TOK_EMB = re.compile(r"(?:^|\.)tok_emb\.")


def layer_depths(model: nn.Module) -> tuple[dict[str, int], int]:
    """(parameter name → depth, L): the embeddings (and what a stack holds outside its blocks) are depth 0, the
    blocks 1..L in the order the input meets them (an encoder-decoder's encoder first), a stack's final norm one
    past its last block, everything else (pooler, task head) L + 1."""
    names = [n for n, _ in model.named_parameters()]
    blocks = {(m[1], int(m[2])) for n in names if (m := _BLOCK.search(n))}
    n_enc = 1 + max((i for stack, i in blocks if stack == "encoder"), default=-1)
    n_layers = len(blocks)
    depths = {}
    for n in names:
        if m := _BLOCK.search(n):
            depths[n] = int(m[2]) + 1 + (n_enc if m[1] == "decoder" else 0)
        elif m := _STACK.search(n):
            depths[n] = ((n_enc if m[1] == "encoder" else n_layers) + 1) if ".final_norm." in n else 0
        else:
            depths[n] = 0 if _TOK_EMB.search(n) else n_layers + 1
    return depths, n_layers


def param_groups(
    model: nn.Module, weight_decay: float, lr: float | None = None, layer_decay: float = 1.0
) -> list[dict]:
    """Decay linear weights; not norms, biases or embedding tables (GPT-2/nanoGPT practice). With ``layer_decay``
    < 1, layer-wise learning rates (ELECTRA, Clark et al. 2020; BEiT): a parameter at depth d (:func:`layer_depths`)
    learns at ``lr · layer_decay ** (L + 1 − d)``, so the task head keeps ``lr`` and the embeddings get the least."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    depths, n_layers = layer_depths(model) if layer_decay != 1.0 else ({}, 0)
    groups: dict[tuple[bool, int], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        decays = p.dim() >= 2 and id(p) not in embeddings
        groups.setdefault((decays, depths.get(name, 0)), []).append(p)
    out = []
    for decays in (True, False):  # matrices first, then the rest, each by depth (a group can be empty)
        for depth in sorted({d for dec, d in groups if dec == decays} or {0}):
            group = {"params": groups.get((decays, depth), []), "weight_decay": weight_decay if decays else 0.0}
            if layer_decay != 1.0:
                assert lr is not None, "layer_decay needs the base lr"
                group["lr"] = lr * layer_decay ** (n_layers + 1 - depth)
            out.append(group)
    return out


def build_optimizer(
    model: nn.Module, cfg: TrainConfig, device: torch.device, layer_decay: float = 1.0
) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay, cfg.lr, layer_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=device.type == "cuda",
    )


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to lr, then cosine or linear decay to min_lr_ratio·lr at max_steps."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape


def build_scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, cfg))
