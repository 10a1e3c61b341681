"""float8 training of the transformer blocks' Linear layers (`train.float8`) through torchao.

`to_float8` swaps the qualifying `nn.Linear` layers for torchao's `Float8Linear` with dynamic tensorwise scaling
(torchao's default recipe): each matrix product casts its input, weight and output gradient to float8 with one
scale per tensor, computed from the tensor's absolute maximum at every step, and multiplies on the GPU's float8
tensor cores; weights, gradients and optimizer state stay in their usual precision. Only Linear layers inside
transformer blocks whose in_features and out_features are both multiples of 16 (float8 matrix products need it)
are converted: the LM head, embeddings and task heads stay as they are. `parallel.parallelize` calls it before
activation checkpointing, compile and FSDP sharding.

Under parallel=fsdp the converted weights are also all-gathered in float8 (`enable_fsdp_float8_all_gather`), which
needs their scales computed once after each optimizer step: `precompute_scales`, called by the loop."""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Any

import torch
from torch import nn

from lmforge import extras
from lmforge.errors import LMForgeError
from lmforge.models.layers import Block

MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9) and Hopper (9.0) onwards
NEEDS = "train.float8 needs a CUDA GPU of compute capability 8.9 or higher (Hopper/Ada)"


def float8_linears(model: nn.Module) -> list[str]:
    """Names (as `model.named_modules` gives them) of the Linear layers `to_float8` converts: plain `nn.Linear`
    modules inside transformer blocks with in_features and out_features both divisible by 16."""
    inside: set[int] = set()
    for block in (m for m in model.modules() if isinstance(m, Block)):
        inside |= {id(m) for m in block.modules()}
    return [
        name
        for name, m in model.named_modules()
        if type(m) is nn.Linear and id(m) in inside and m.in_features % 16 == 0 and m.out_features % 16 == 0
    ]


def _capability(device: torch.device) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device))


def check_float8(cfg: Any, device: torch.device) -> None:
    """Refuse train.float8 where it cannot run, in one line: under precision=fp32, off CUDA, or on a GPU without
    float8 tensor cores. Needs no torchao."""
    if cfg.precision == "fp32":
        raise LMForgeError("train.float8 trains under bf16 autocast: use train.precision=auto or bf16, not fp32")
    if device.type != "cuda":
        raise LMForgeError(f"{NEEDS}; this run is on {device.type}")
    found = _capability(device)
    if found < MIN_CAPABILITY:
        raise LMForgeError(f"{NEEDS}; this run's GPU has compute capability {found[0]}.{found[1]}")


def _version(module: Any) -> tuple[int, ...]:
    match = re.match(r"(\d+)\.(\d+)", getattr(module, "__version__", ""))
    return tuple(int(x) for x in match.groups()) if match else (0, 0)


def float8_config(cfg: Any) -> Any:
    """torchao's `Float8LinearConfig` for `cfg`: dynamic tensorwise scaling; under fsdp, float8 all-gathers."""
    float8 = extras.require("torchao.float8", "train.float8")
    kwargs: dict[str, bool] = {}
    if cfg.parallel == "fsdp":
        kwargs["enable_fsdp_float8_all_gather"] = True
        fields = {f.name for f in dataclasses.fields(float8.Float8LinearConfig)}
        # Recomputing the float8 weight in backward keeps FSDP from holding every gathered weight until then. torchao
        # 0.12 made the flag a no-op that logs a deprecation warning (PyTorch now does it itself: pytorch/ao#2251).
        if "force_recompute_fp8_weight_in_bwd" in fields and _version(importlib.import_module("torchao")) < (0, 12):
            kwargs["force_recompute_fp8_weight_in_bwd"] = True
    return float8.Float8LinearConfig(**kwargs)


def to_float8(model: nn.Module, cfg: Any, device: torch.device) -> None:
    """Convert `model`'s qualifying block Linear layers (`float8_linears`) to torchao's Float8Linear, in place.

    Raises LMForgeError (one line) under precision=fp32, off a CUDA GPU of capability ≥ 8.9, when no Linear layer
    qualifies, or without torchao (`pip install 'lmforge[float8]'`); the hardware checks come first, so a CPU run
    is refused the same way with or without torchao."""
    check_float8(cfg, device)
    names = float8_linears(model)
    if not names:
        raise LMForgeError(
            "train.float8: no Linear layer of the model's transformer blocks has in_features and out_features "
            "divisible by 16 (float8 matrix products need it)"
        )
    float8 = extras.require("torchao.float8", "train.float8")
    chosen = {id(model.get_submodule(name)) for name in names}
    float8.convert_to_float8_training(
        model, config=float8_config(cfg), module_filter_fn=lambda module, fqn: id(module) in chosen
    )


def precompute_scales(model: nn.Module) -> None:
    """After an optimizer step under fsdp: compute the float8 scales of every sharded Float8Linear weight at once
    (one all-reduce), for the next step's float8 all-gathers. Does nothing for a model without such weights."""
    float8 = extras.require("torchao.float8", "train.float8")
    float8.precompute_float8_dynamic_scale_for_fsdp(model)
