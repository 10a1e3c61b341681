"""Int8 dynamic quantisation of linear layers for CPU inference.

`torch.ao.quantization.quantize_dynamic` replaces each `nn.Linear` by a module holding int8 weights (one scale
per output channel here) and quantising its input per batch at run time; matmuls run in int8 (fbgemm / x86
kernels) and outputs come back in float32. The model's fused projections (one `qkv` Linear per attention, one
`kv` per cross-attention) are ordinary Linear layers, so they are quantised like the rest; embeddings and norms
stay float32. The result is for inference: its linear layers have no trainable weights."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable

from torch import nn

from lmforge.errors import LMForgeError


def quantize_int8(model: nn.Module, skip: Iterable[str] = (), per_channel: bool = True) -> nn.Module:
    """A quantised copy of `model` (the original is untouched): every nn.Linear except those whose qualified
    name is in `skip` or ends with "." + an entry of it (e.g. skip=["lm_head"]) gets int8 weights."""
    try:
        from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError as e:  # removed from recent PyTorch releases in favour of torchao
        raise LMForgeError(f"this PyTorch has no torch.ao.quantization ({e}); int8 quantisation needs it") from None
    skip = tuple(skip)
    qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
    spec = {
        name: qconfig
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and not any(name == s or name.endswith("." + s) for s in skip)
    }
    if not spec:
        raise LMForgeError("the model has no linear layers to quantise")
    src = copy.deepcopy(model).cpu().eval()
    with warnings.catch_warnings():
        # torch.ao.quantization announces its move to torchao on every call; the kernels are unchanged.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return quantize_dynamic(src, spec, inplace=False)


def count_quantized(model: nn.Module) -> int:
    """Number of dynamically quantised linear modules in a model."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    return sum(isinstance(m, DynamicLinear) for m in model.modules())
