"""Bottleneck adapters: Houlsby (two per layer), Pfeiffer (one per layer) and AdaMix (a mixture of them).

An adapter maps a sublayer's output h to h + up(act(down(h))) (Houlsby et al. 2019 §2.1), d_model → bottleneck →
d_model. It wraps the sublayer's output projection (attention's `o`, the MLP's `down`), so it runs after the
projection and before dropout, the residual sum and (post-LN) the norm, as in Houlsby et al.'s Figure 2."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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


@dataclass
class AdaMixOptions(BottleneckOptions):
    """AdaMix (`peft.method: adamix`, Wang et al. 2022): n_experts Houlsby adapters per site, one random
    down/up-projection pair per training forward, their averaged weights at inference."""

    n_experts: int = 4


def _init_projection(w: Tensor, std: float) -> None:
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
        _init_projection(self.down.weight, options.init_std)
        _init_projection(self.up.weight, 0.0 if options.zero_init_up else options.init_std)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.bias)

    def forward(self, h: Tensor) -> Tensor:
        return self.up(self.act(self.down(h)))


class MixtureAdapter(nn.Module):
    """AdaMix's adapter experts at one site: E down- and E up-projections.

    Training routes each forward through one random down-projection and one random up-projection, chosen
    independently (Wang et al. 2022 §3.1, stochastic routing); eval mode uses the experts' averaged weights
    (§3.3, adaptation merging), so inference costs one adapter and is deterministic."""

    def __init__(self, d_model: int, options: AdaMixOptions, device=None, dtype=None) -> None:
        super().__init__()
        E, m = options.n_experts, options.bottleneck
        kw = dict(device=device, dtype=dtype)
        self.n_experts = E
        self.down_weight = nn.Parameter(torch.empty(E, m, d_model, **kw))  # (E, m, d)
        self.down_bias = nn.Parameter(torch.zeros(E, m, **kw))
        self.up_weight = nn.Parameter(torch.empty(E, d_model, m, **kw))  # (E, d, m)
        self.up_bias = nn.Parameter(torch.zeros(E, d_model, **kw))
        self.act = activation_fn(options.activation)
        _init_projection(self.down_weight, options.init_std)
        _init_projection(self.up_weight, 0.0 if options.zero_init_up else options.init_std)

    def expert_weights(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(down W, down b, up W, up b) of this forward: a random expert of each in training, else the mean."""
        if self.training:
            i, j = torch.randint(self.n_experts, (2,)).tolist()
            return self.down_weight[i], self.down_bias[i], self.up_weight[j], self.up_bias[j]
        return self.down_weight.mean(0), self.down_bias.mean(0), self.up_weight.mean(0), self.up_bias.mean(0)

    def forward(self, h: Tensor) -> Tensor:
        wd, bd, wu, bu = self.expert_weights()
        return F.linear(self.act(F.linear(h, wd, bd)), wu, bu)

    def extra_repr(self) -> str:
        return f"n_experts={self.n_experts}, bottleneck={self.down_weight.shape[1]}"


class AdapterLayer(nn.Module):
    """A sublayer output projection followed by an adapter: h = base_layer(x); h + adapter(h)."""

    def __init__(self, base_layer: nn.Module, adapter: nn.Module) -> None:
        super().__init__()
        self.base_layer, self.adapter = base_layer, adapter

    def forward(self, x: Tensor) -> Tensor:
        h = self.base_layer(x)
        return h + self.adapter(h)


def _apply(model: nn.Module, method: str, o: BottleneckOptions, make) -> nn.Module:
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
    return _apply(model, "houlsby", o, lambda d, **kw: BottleneckAdapter(d, o, **kw))


def apply_pfeiffer(model: nn.Module, options: PfeifferOptions | None = None) -> nn.Module:
    """One adapter after every feed-forward sublayer; the rest frozen (+ head)."""
    o = options or PfeifferOptions()
    return _apply(model, "pfeiffer", o, lambda d, **kw: BottleneckAdapter(d, o, **kw))


def apply_adamix(model: nn.Module, options: AdaMixOptions | None = None) -> nn.Module:
    """A mixture of n_experts adapters at every Houlsby site; the rest frozen (+ norms, head)."""
    o = options or AdaMixOptions()
    check_positive("adamix", n_experts=o.n_experts)
    return _apply(model, "adamix", o, lambda d, **kw: MixtureAdapter(d, o, **kw))
