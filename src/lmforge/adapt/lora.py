"""LoRA (Hu et al. 2021): a frozen Linear plus a trainable low-rank update, W x + (alpha / r) · B A x.

Attention's self-attention projection is one fused `qkv` Linear (d_model → q + 2·kv). LoRA on it adapts the whole
fused output with one rank-r pair (A: r × d_model, B: (q + 2·kv) × r), i.e. W_q, W_k and W_v together, where
Hu et al. §4.2 give W_q and W_v separate rank-r updates; merging is exact either way."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.adapt.inject import (
    PeftOptions,
    PeftState,
    check_positive,
    freeze,
    matching_modules,
    replace_modules,
    train_extras,
    train_params,
)
from lmforge.errors import LMForgeError


@dataclass
class LoRAOptions(PeftOptions):
    """LoRA (`peft.method: lora`)."""

    rank: int = 8
    alpha: float = 16.0
    """The update is scaled by alpha / rank (Hu et al. §4.1), so changing the rank needs no new learning rate."""
    dropout: float = 0.0
    """Dropout on the LoRA branch's input."""
    targets: list[str] = field(default_factory=lambda: ["qkv", "q", "kv", "o"])
    """Linear layers to adapt, as module name patterns (default: every attention projection, self and cross)."""


class LoRALinear(nn.Module):
    """`base_layer` (frozen) + scaling · B(A(dropout(x))); A is Kaiming-uniform, B zeros, so training starts at W."""

    def __init__(self, base_layer: nn.Linear, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(base_layer, nn.Linear):
            raise LMForgeError(f"LoRA adapts nn.Linear layers, not {type(base_layer).__name__}")
        check_positive("lora", rank=rank, alpha=alpha)
        if not 0 <= dropout < 1:
            raise LMForgeError(f"lora.dropout must be in [0, 1), got {dropout}")
        self.base_layer = base_layer
        self.rank, self.alpha, self.scaling = rank, alpha, alpha / rank
        w = base_layer.weight
        self.lora_A = nn.Parameter(torch.empty(rank, base_layer.in_features, device=w.device, dtype=w.dtype))
        self.lora_B = nn.Parameter(torch.zeros(base_layer.out_features, rank, device=w.device, dtype=w.dtype))
        # nn.Linear's own init for A (as the reference implementation); B = 0 makes the update start at zero.
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.merged = False

    @property
    def weight(self) -> Tensor:
        return self.base_layer.weight

    @property
    def bias(self) -> Tensor | None:
        return self.base_layer.bias

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    def delta_weight(self) -> Tensor:
        """The update scaling · B A, (out_features, in_features)."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def forward(self, x: Tensor) -> Tensor:
        y = self.base_layer(x)
        if self.merged:  # the update already sits in base_layer.weight
            return y
        # Two thin matmuls, (..., in) -> (..., r) -> (..., out): never forms the (out, in) update.
        return y + F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B) * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        """Fold the update into the base weight (inference without the extra matmuls)."""
        if not self.merged:
            self.base_layer.weight.add_(self.delta_weight().to(self.base_layer.weight.dtype))
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Take the update back out of the base weight."""
        if self.merged:
            self.base_layer.weight.sub_(self.delta_weight().to(self.base_layer.weight.dtype))
            self.merged = False

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, merged={self.merged}"


def apply_lora(model: nn.Module, options: LoRAOptions | None = None) -> nn.Module:
    """Wrap the target Linear layers in LoRALinear and freeze everything but the LoRA pairs (+ head, train_also)."""
    o = options or LoRAOptions()
    if getattr(model, "peft_config", None) is not None:
        raise LMForgeError(f"the model is already adapted with '{model.peft_config.method}'")
    targets = matching_modules(model, o.targets, nn.Linear)
    if not targets:
        raise LMForgeError(f"lora.targets {o.targets} match no Linear layer of the model")
    freeze(model)
    wrappers = replace_modules(model, targets, lambda m: LoRALinear(m, o.rank, o.alpha, o.dropout))
    for w in wrappers.values():
        train_params(w)
    train_extras(model, o)
    model.peft_config = PeftState("lora", o, [n for n, _ in targets])
    return model


def lora_layers(model: nn.Module) -> list[LoRALinear]:
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every LoRA update into its base weight (the LoRA modules stay, so `unmerge_lora` can undo it)."""
    for m in lora_layers(model):
        m.merge()
    return model


def unmerge_lora(model: nn.Module) -> nn.Module:
    for m in lora_layers(model):
        m.unmerge()
    return model


def merge_and_unload(model: nn.Module) -> nn.Module:
    """Merge every LoRA update and put the plain Linear layers back: the model's original module tree and names
    (for export), every parameter trainable again."""
    layers = lora_layers(model)
    for m in layers:
        m.merge()
    replace_modules(model, [("", m) for m in layers], lambda m: m.base_layer)
    for p in model.parameters():
        p.requires_grad_(True)
    model.peft_config = None
    return model
