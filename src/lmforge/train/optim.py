"""Optimizers and the learning-rate schedule of every run.

AdamW decays weight matrices only (GPT-2/nanoGPT practice), optionally with layer-wise learning rates; Muon (Jordan
et al. 2024) orthogonalises the momentum of the blocks' weight matrices with a Newton–Schulz iteration, beside AdamW
for the rest. Both can skip a step on the device (`found_inf`, as AMP's grad scaler does), so a non-finite step is
dropped without the host waiting for the GPU."""

from __future__ import annotations

import math
import re

import torch
from torch import Tensor, nn

from lmforge.checkpoint.tensors import is_dtensor
from lmforge.config.sections import OptimConfig

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
    model: nn.Module, weight_decay: float, lr: float | None = None, layer_decay: float = 1.0, exclude: set | None = None
) -> list[dict]:
    """Decay linear weights; not norms, biases or embedding tables (GPT-2/nanoGPT practice). With ``layer_decay``
    < 1, layer-wise learning rates (ELECTRA, Clark et al. 2020; BEiT): a parameter at depth d (:func:`layer_depths`)
    learns at ``lr · layer_decay ** (L + 1 − d)``, so the task head keeps ``lr`` and the embeddings get the least.
    Parameters whose id is in ``exclude`` (another optimizer's) are left out."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    depths, n_layers = layer_depths(model) if layer_decay != 1.0 else ({}, 0)
    groups: dict[tuple[bool, int], list[nn.Parameter]] = {}
    seen: set[int] = set(exclude or ())
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


def muon_params(model: nn.Module) -> list[nn.Parameter]:
    """The matrices Muon updates: the 2-D weights inside transformer blocks (not embeddings, heads, norms)."""
    return [p for n, p in model.named_parameters() if p.requires_grad and p.dim() == 2 and _BLOCK.search(n)]


class Muon(torch.optim.Optimizer):
    """MomentUm Orthogonalized by Newton–Schulz (Jordan et al. 2024): Nesterov momentum, then the update's
    nearest semi-orthogonal matrix by 5 quintic Newton–Schulz iterations in bf16, scaled by sqrt(max(1, rows /
    cols)); decoupled weight decay. Matrices of one shape are orthogonalised together (batched matmuls), and the
    step is skipped, on the device, where `found_inf` (a 0-d tensor) is non-zero."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    @staticmethod
    def orthogonalize(g: Tensor, steps: int = 5) -> Tensor:
        """(..., m, n) → the nearest semi-orthogonal matrices (approximately), batched over leading dims."""
        a, b, c = 3.4445, -4.7750, 2.0315  # coefficients maximising the slope at zero
        x = g.bfloat16()
        tall = x.size(-2) > x.size(-1)
        if tall:
            x = x.mT
        x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
        for _ in range(steps):
            s = x @ x.mT
            x = a * x + (b * s + c * s @ s) @ x
        return (x.mT if tall else x).to(g.dtype)

    @torch.no_grad()
    def step(self, closure=None):
        skip = getattr(self, "found_inf", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            mu, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
            grads = [p.grad for p in params]
            bufs = [self.state[p].setdefault("momentum_buffer", torch.zeros_like(p)) for p in params]
            new_bufs = torch._foreach_lerp(bufs, grads, 1 - mu)
            nesterov = torch._foreach_lerp(grads, new_bufs, mu)
            updates: list[Tensor] = [nesterov[0]] * len(params)
            by_shape: dict[tuple, list[int]] = {}
            for i, g in enumerate(nesterov):
                by_shape.setdefault(tuple(g.shape), []).append(i)
            for (rows, cols), idx in by_shape.items():
                ortho = self.orthogonalize(torch.stack([nesterov[i] for i in idx])) * max(1.0, rows / cols) ** 0.5
                for j, i in enumerate(idx):
                    updates[i] = ortho[j]
            stepped = torch._foreach_mul(params, 1 - lr * wd)
            torch._foreach_add_(stepped, updates, alpha=-lr)
            if skip is None:
                torch._foreach_copy_(bufs, new_bufs)
                torch._foreach_copy_(params, stepped)
                continue
            keep = skip.to(torch.bool)
            for p, b, nb, new in zip(params, bufs, new_bufs, stepped):
                b.copy_(torch.where(keep, b, nb))
                p.copy_(torch.where(keep, p, new))


class Optimizers:
    """One or two optimizers stepped together (AdamW alone, or Muon + AdamW), with one state dict."""

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    def step(self, found_inf: Tensor | None = None, grad_scale: Tensor | None = None) -> None:
        """One step of each optimizer, skipped on the device where `found_inf` (0-d) is non-zero, with every
        gradient divided by `grad_scale` (0-d, clipping): by fused AdamW as it reads them, by the others first."""
        for opt in self.optimizers.values():
            first = next((p for g in opt.param_groups for p in g["params"]), None)
            if first is None:
                continue
            # Parameters may sit on another device than the step's flags (fsdp cpu_offload).
            flag = found_inf.to(first.device) if found_inf is not None else None
            scale = grad_scale.to(first.device) if grad_scale is not None else None
            if scale is not None and not (isinstance(opt, torch.optim.AdamW) and opt.defaults.get("fused")):
                grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
                torch._foreach_div_(grads, scale)
                scale = None
            if not _fused_adamw_on_shards(opt, flag, scale):
                opt.found_inf, opt.grad_scale = flag, scale
                opt.step()
                del opt.found_inf, opt.grad_scale

    def zero_grad(self) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)

    def state_dict(self) -> dict:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != set(self.optimizers) and "state" in state:  # a checkpoint of a single AdamW
            state = {"adamw": state}
        if set(state) != set(self.optimizers):
            raise ValueError(f"optimizer state holds {sorted(state)}, this run uses {sorted(self.optimizers)}")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])


@torch.no_grad()
def _fused_adamw_on_shards(opt: torch.optim.Optimizer, found_inf: Tensor | None, grad_scale: Tensor | None) -> bool:
    """Step a fused AdamW whose parameters are DTensors (fsdp) on their local shards: the kernel torch's AdamW runs,
    without DTensor's dispatch of every tensor of every list (milliseconds of host time per step for a model of a
    few hundred tensors). Sharded element by element, each rank's update is its shard of the full one. Returns
    False, doing nothing, where torch's own step must run: another optimizer, plain tensors, or before the first
    step has made the state."""
    if not (isinstance(opt, torch.optim.AdamW) and opt.defaults.get("fused")):
        return False
    groups = []
    for g in opt.param_groups:
        params = [p for p in g["params"] if p.grad is not None]
        if not params:
            continue
        if g["amsgrad"] or g["maximize"] or not all(is_dtensor(p) and "step" in opt.state[p] for p in params):
            return False
        if len({(p.device, p.dtype) for p in params}) > 1:
            return False
        groups.append((g, params))
    for g, params in groups:
        states = [opt.state[p] for p in params]
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, 1)
        torch._fused_adamw_(
            [p.to_local() for p in params], [p.grad.to_local() for p in params],
            [s["exp_avg"].to_local() for s in states], [s["exp_avg_sq"].to_local() for s in states], [], steps,
            amsgrad=False, lr=g["lr"], beta1=g["betas"][0], beta2=g["betas"][1], weight_decay=g["weight_decay"],
            eps=g["eps"], maximize=False, grad_scale=grad_scale, found_inf=found_inf,
        )  # fmt: skip
        if found_inf is not None:  # a skipped step does not count (as torch's step)
            torch._foreach_sub_(steps, [found_inf] * len(steps))
    return True


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> Optimizers:
    """AdamW over the trainable parameters, or Muon over the blocks' matrices + AdamW over the rest. Each param
    group records its base (peak) learning rate, `base_lr`, which the schedule scales."""
    exclude: set[int] = set()
    optimizers: dict[str, torch.optim.Optimizer] = {}
    if cfg.optimizer == "muon":
        matrices = muon_params(model)
        exclude = {id(p) for p in matrices}
        optimizers["muon"] = Muon(matrices, lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay)
    groups = param_groups(model, cfg.weight_decay, cfg.lr, cfg.layer_decay, exclude)
    optimizers["adamw"] = torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=device.type in ("cuda", "cpu")
    )
    for opt in optimizers.values():
        for g in opt.param_groups:
            g["base_lr"] = g["lr"]
    return Optimizers(optimizers)


def warmup_steps(cfg: OptimConfig, total_steps: int) -> int:
    return round(cfg.warmup_ratio * total_steps) if cfg.warmup_ratio is not None else cfg.warmup_steps


def lr_factor(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Linear warmup to the peak, then cosine / linear decay to min_lr_ratio at total_steps, constant, or
    warmup-stable-decay (a linear decay over the last decay_ratio of the steps)."""
    warm = warmup_steps(cfg, total_steps)
    if step < warm:
        return (step + 1) / warm
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "wsd":
        decay = max(1, round(cfg.decay_ratio * total_steps))
        progress = min(1.0, max(0.0, (step - (total_steps - decay)) / decay))
        return 1 - (1 - cfg.min_lr_ratio) * progress
    span = max(1, total_steps - warm)
    progress = min(1.0, (step - warm) / span)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape


class Schedule:
    """Sets each param group's lr to its base lr × `lr_factor(step)`; `step()` after every optimizer step."""

    def __init__(self, optimizer: Optimizers, cfg: OptimConfig, total_steps: int) -> None:
        self.optimizer, self.cfg, self.total_steps = optimizer, cfg, total_steps
        self.last_step = 0
        self._apply()

    def _apply(self) -> None:
        factor = lr_factor(self.last_step, self.cfg, self.total_steps)
        for g in self.optimizer.param_groups:
            g["lr"] = g["base_lr"] * factor

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def set_total(self, total_steps: int) -> None:
        """Plan the schedule over a new number of steps (a run on a time budget replans)."""
        self.total_steps = total_steps
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {"step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        """Continue at the saved step, with this run's base rates and schedule (a resumed run's new lr or max_steps
        apply from here on)."""
        self.last_step = int(state.get("step", state.get("last_epoch", 0)))
        self._apply()
