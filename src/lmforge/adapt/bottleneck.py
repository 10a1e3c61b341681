"""Bottleneck adapters: Houlsby (two per layer) and Pfeiffer (one per layer); AdaMix mixes them (adapt/adamix.py).

An adapter maps a sublayer's output h to h + up(act(down(h))) (Houlsby et al. 2019 §2.1), d_model → bottleneck →
d_model. It wraps the sublayer's output projection (attention's `o`, the MLP's `down`), so it runs after the
projection and before dropout, the residual sum and (post-LN) the norm, as in Houlsby et al.'s Figure 2."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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
    transformers_in,
)
from lmforge.errors import LMForgeError
from lmforge.models.layers import RMSNorm, activation_fn

AdapterActivation = Literal["relu", "gelu", "gelu_tanh", "silu"]


@dataclass
class BottleneckOptions(PeftOptions):
    """Options of the bottleneck adapters (Houlsby's defaults)."""

    bottleneck: int = 64
    """Adapter width m (Houlsby et al. §3.1 pick m from {8, 64, 256})."""
    activation: AdapterActivation = "relu"
    init_std: float = 1e-2
    """Both projections start N(0, init_std²) truncated at two standard deviations, biases 0: a near-identity
    adapter (Houlsby et al. §3.6)."""
    zero_init_up: bool = False
    """Start the up-projection at zero instead: the adapted model starts exactly at the base model."""
    train_norms: bool = True
    """Also train the backbone's layer norms (Houlsby et al. §2.1 do)."""
    targets: list[str] = field(default_factory=lambda: ["attn.o", "mlp.down"])
    """Sublayer output projections to put an adapter after (add "cross_attn.o" for encoder-decoder decoders)."""


@dataclass
class HoulsbyOptions(BottleneckOptions):
    """Houlsby adapters (`peft.method: houlsby`): after the attention and after the feed-forward of every layer."""


@dataclass
class PfeifferOptions(BottleneckOptions):
    """Pfeiffer adapters (`peft.method: pfeiffer`): one adapter per layer, after the feed-forward (Pfeiffer et al.
    2021 §3.1, their best-performing placement)."""

    train_norms: bool = False
    targets: list[str] = field(default_factory=lambda: ["mlp.down"])


def init_projection(w: Tensor, std: float) -> None:
    if std > 0:
        nn.init.trunc_normal_(w, std=std, a=-2 * std, b=2 * std)
    else:
        nn.init.zeros_(w)


class BottleneckAdapter(nn.Module):
    """up(act(down(h))): the adapter's residual branch, (..., d_model) -> (..., d_model)."""

    def __init__(self, d_model: int, options: BottleneckOptions, device=None, dtype=None) -> None:
        super().__init__()
        self.down = nn.Linear(d_model, options.bottleneck, device=device, dtype=dtype)
        self.up = nn.Linear(options.bottleneck, d_model, device=device, dtype=dtype)
        self.act = activation_fn(options.activation)
        init_projection(self.down.weight, options.init_std)
        init_projection(self.up.weight, 0.0 if options.zero_init_up else options.init_std)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.bias)

    def forward(self, h: Tensor) -> Tensor:
        return self.up(self.act(self.down(h)))


class AdapterLayer(nn.Module):
    """A sublayer output projection followed by an adapter: h = base_layer(x); h + adapter(h)."""

    def __init__(self, base_layer: nn.Module, adapter: nn.Module) -> None:
        super().__init__()
        self.base_layer, self.adapter = base_layer, adapter

    def forward(self, x: Tensor) -> Tensor:
        h = self.base_layer(x)
        return h + self.adapter(h)


def apply_bottleneck(model: nn.Module, method: str, o: BottleneckOptions, make) -> nn.Module:
    """Put `make(d_model, device=, dtype=)` after every target output projection, freeze the rest (but the norms
    with `train_norms`, the head and `train_also`) and record the method on the model."""
    check_positive(method, bottleneck=o.bottleneck)
    if o.init_std < 0:
        raise LMForgeError(f"{method}.init_std must be >= 0, got {o.init_std}")
    if getattr(model, "peft_config", None) is not None:
        raise LMForgeError(f"the model is already adapted with '{model.peft_config.method}'")
    targets = matching_modules(model, o.targets)
    if not targets:
        raise LMForgeError(f"{method}.targets {o.targets} match no module of the model")
    for name, m in targets:
        if not isinstance(getattr(m, "out_features", None), int):
            raise LMForgeError(f"{method}.targets: '{name}' is a {type(m).__name__}, not a Linear output projection")
    freeze(model)

    def wrap(m: nn.Module) -> nn.Module:
        return AdapterLayer(m, make(m.out_features, device=m.weight.device, dtype=m.weight.dtype))

    for w in replace_modules(model, targets, wrap).values():
        train_params(w)
    if o.train_norms:
        for t in transformers_in(model):
            for m in t.modules():
                if isinstance(m, (nn.LayerNorm, RMSNorm)):
                    train_params(m)
    train_extras(model, o)
    model.peft_config = PeftState(method, o, [n for n, _ in targets])
    return model


def apply_houlsby(model: nn.Module, options: HoulsbyOptions | None = None) -> nn.Module:
    """Houlsby adapters after every attention and feed-forward sublayer; the rest frozen (+ norms, head)."""
    o = options or HoulsbyOptions()
    return apply_bottleneck(model, "houlsby", o, lambda d, **kw: BottleneckAdapter(d, o, **kw))


def apply_pfeiffer(model: nn.Module, options: PfeifferOptions | None = None) -> nn.Module:
    """One adapter after every feed-forward sublayer; the rest frozen (+ head)."""
    o = options or PfeifferOptions()
    return apply_bottleneck(model, "pfeiffer", o, lambda d, **kw: BottleneckAdapter(d, o, **kw))
