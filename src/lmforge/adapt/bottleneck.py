"""Bottleneck adapters: Houlsby (two per layer) and Pfeiffer (one per layer); AdaMix mixes them (adapt/adamix.py).

A bottleneck is up(act(down(·))), d_model → bottleneck → d_model.

Houlsby (Houlsby et al. 2019 §2.1, Figure 2): h → h + up(act(down(h))) on a sublayer's output h. It wraps the
sublayer's output projection (attention's `o`, the MLP's `down`), so it runs after the projection and before
dropout, the residual sum and (post-LN) the norm.

Pfeiffer (Pfeiffer et al. 2021; AdapterHub's SeqBnConfig: original_ln_before, residual_before_ln and
original_ln_after true, ReLU, reduction factor 16), one after the feed-forward. In a post-LN block, where the
sublayer ends in z = x + h and the block's norm LN: the adapter reads LN(z), its residual is h (taken before that
norm) plus x, and the block's own LN is applied again after the sum,

    y = LN(h + x + up(act(down(LN(z))))) = LN(z + adapter(LN(z)))

(AdapterHub's pre_forward, Adapter.forward, post_forward). It wraps the sublayer's norm (`norm2` for the
feed-forward). In a pre-LN block (nothing normalises z) it is placed as Houlsby's is, after the feed-forward's output
projection: y = x + h + adapter(h); AdapterHub's pre-LN models (GPT-2, Llama) pass no norm, which gives
z + adapter(z) instead."""

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
from lmforge.models.layers import Block, RMSNorm, activation_fn

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

    def width(self, d_model: int) -> int:
        """The bottleneck width of an adapter on a sublayer of width d_model."""
        return self.bottleneck


@dataclass
class HoulsbyOptions(BottleneckOptions):
    """Houlsby adapters (`peft.method: houlsby`): after the attention and after the feed-forward of every layer."""


@dataclass
class PfeifferOptions(BottleneckOptions):
    """Pfeiffer adapters (`peft.method: pfeiffer`): one adapter per layer, after the feed-forward (Pfeiffer et al.
    2021 §3.1, their best-performing placement), as AdapterHub's SeqBnConfig places it (module docstring)."""

    bottleneck: int | None = None  # type: ignore[assignment]
    """Adapter width; None: d_model // reduction_factor."""
    reduction_factor: float = 16.0
    """d_model / bottleneck when `bottleneck` is None (AdapterHub's SeqBnConfig: 16)."""
    train_norms: bool = False
    targets: list[str] = field(default_factory=lambda: ["mlp.down"])
    """Sublayer output projections whose sublayer gets an adapter: "mlp.down" (the feed-forward), "attn.o" and
    "cross_attn.o" (in a post-LN block: after that sublayer's add & norm)."""

    def width(self, d_model: int) -> int:
        if self.bottleneck is not None:
            return self.bottleneck
        return max(1, int(d_model // self.reduction_factor))  # as AdapterHub's BottleneckLayer rounds it


def init_projection(w: Tensor, std: float) -> None:
    if std > 0:
        nn.init.trunc_normal_(w, std=std, a=-2 * std, b=2 * std)
    else:
        nn.init.zeros_(w)


class BottleneckAdapter(nn.Module):
    """up(act(down(h))): the adapter's residual branch, (..., d_model) -> (..., d_model)."""

    def __init__(self, d_model: int, options: BottleneckOptions, device=None, dtype=None) -> None:
        super().__init__()
        m = options.width(d_model)
        self.down = nn.Linear(d_model, m, device=device, dtype=dtype)
        self.up = nn.Linear(m, d_model, device=device, dtype=dtype)
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


class PostNormAdapter(nn.Module):
    """A post-LN sublayer's norm followed by an adapter, as AdapterHub's Pfeiffer adapter runs there: z (the
    sublayer's residual sum x + h) → base_layer(z + adapter(base_layer(z)))."""

    def __init__(self, base_layer: nn.Module, adapter: nn.Module) -> None:
        super().__init__()
        self.base_layer, self.adapter = base_layer, adapter

    def forward(self, z: Tensor) -> Tensor:
        return self.base_layer(z + self.adapter(self.base_layer(z)))


# The norm that closes each sublayer of a post-LN Block, by the name of the sublayer's output projection.
SUBLAYER_NORMS = {"attn.o": "norm1", "cross_attn.o": "norm_cross", "mlp.down": "norm2"}


def _block_of(model: nn.Module, name: str) -> tuple[str, Block] | None:
    """(name, module) of the innermost Block holding the module `name`, None when none does."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        owner = ".".join(parts[:i])
        module = model.get_submodule(owner)
        if isinstance(module, Block):
            return owner, module
    return None


def post_ln_norms(
    model: nn.Module, method: str, targets: list[tuple[str, nn.Module]]
) -> tuple[list[tuple[str, nn.Module]], dict[str, tuple[nn.Module, int]]]:
    """(the targets outside post-LN blocks, {norm name: (norm, width)} of the norms closing the targets' sublayers
    in post-LN blocks). A target in a post-LN block that is no sublayer output projection is refused."""
    plain, norms = [], {}
    for name, m in targets:
        found = _block_of(model, name)
        if found is None or found[1].pre:
            plain.append((name, m))
            continue
        owner, _ = found
        site = name[len(owner) + 1 :]
        if site not in SUBLAYER_NORMS:
            raise LMForgeError(f"{method}.targets: '{name}' is not a sublayer's output projection ("
                               f"{', '.join(SUBLAYER_NORMS)}) of its post-LN block")  # fmt: skip
        norm = f"{owner}.{SUBLAYER_NORMS[site]}"
        norms.setdefault(norm, (model.get_submodule(norm), m.out_features))
    return plain, norms


def apply_bottleneck(model: nn.Module, method: str, o: BottleneckOptions, make, post_ln: bool = False) -> nn.Module:
    """Put `make(d_model, device=, dtype=)` after every target output projection, freeze the rest (but the norms
    with `train_norms`, the head and `train_also`) and record the method on the model. `post_ln`: in post-LN blocks
    the adapter goes after the sublayer's add & norm instead (`PostNormAdapter`)."""
    if o.bottleneck is not None:
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
    norms: dict[str, tuple[nn.Module, int]] = {}
    if post_ln:
        targets, norms = post_ln_norms(model, method, targets)
    freeze(model)

    def wrap(m: nn.Module) -> nn.Module:
        return AdapterLayer(m, make(m.out_features, device=m.weight.device, dtype=m.weight.dtype))

    width = {id(n): d for n, d in norms.values()}

    def wrap_norm(m: nn.Module) -> nn.Module:
        p = next(m.parameters())
        return PostNormAdapter(m, make(width[id(m)], device=p.device, dtype=p.dtype))

    wrappers = list(replace_modules(model, targets, wrap).values())
    wrappers += replace_modules(model, [(n, m) for n, (m, _) in norms.items()], wrap_norm).values()
    for w in wrappers:
        train_params(w)
    if o.train_norms:
        for t in transformers_in(model):
            for m in t.modules():
                if isinstance(m, (nn.LayerNorm, RMSNorm)):
                    train_params(m)
    train_extras(model, o)
    model.peft_config = PeftState(method, o, [n for n, _ in targets] + list(norms))
    return model


def apply_houlsby(model: nn.Module, options: HoulsbyOptions | None = None) -> nn.Module:
    """Houlsby adapters after every attention and feed-forward sublayer; the rest frozen (+ norms, head)."""
    o = options or HoulsbyOptions()
    return apply_bottleneck(model, "houlsby", o, lambda d, **kw: BottleneckAdapter(d, o, **kw))


def apply_pfeiffer(model: nn.Module, options: PfeifferOptions | None = None) -> nn.Module:
    """One adapter per feed-forward sublayer, after its add & norm in post-LN blocks (module docstring); the rest
    frozen (+ head)."""
    o = options or PfeifferOptions()
    check_positive("pfeiffer", reduction_factor=o.reduction_factor)
    return apply_bottleneck(model, "pfeiffer", o, lambda d, **kw: BottleneckAdapter(d, o, **kw), post_ln=True)
