"""Module injection and freezing shared by every adaptation method.

An adapter is a module that wraps a `base_layer` and takes its place in the model (peft's design): the model's code
is unchanged, only its module tree. Targets are named by dotted glob patterns matched against the *end* of a
module's name, one glob per component: "qkv" matches `decoder.blocks.0.attn.qkv`, "attn.*" matches every direct
child of a self-attention module (`attn.qkv`, `attn.o`, not `cross_attn.q`), "blocks.1.mlp.up" one layer's MLP."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from torch import nn

from lmforge.errors import LMForgeError


@dataclass
class PeftOptions:
    """Options every adaptation method has."""

    train_head: bool = True
    """Also train the task head (`TaskModel.head`) when the model has one."""
    train_also: list[str] = field(default_factory=list)
    """Module name patterns whose parameters train as well (e.g. ["final_norm", "pooler"])."""


@dataclass
class PeftState:
    """What `apply_peft` did to a model, kept on it as `model.peft_config` (saved with the adapter weights)."""

    method: str
    options: PeftOptions
    sites: list[str]
    """Names of the modules the method replaced or extended."""


def matches(name: str, pattern: str) -> bool:
    """Whether the dotted module `name` ends with components matching the dotted glob `pattern`."""
    want, have = pattern.split("."), name.split(".")
    if not name or len(want) > len(have):
        return False
    return all(fnmatchcase(h, w) for h, w in zip(have[-len(want) :], want))


def matching_modules(model: nn.Module, patterns: list[str], kind: type | None = None) -> list[tuple[str, nn.Module]]:
    """(name, module) of every module (of type `kind`) whose name matches a pattern, in model order, each once."""
    out = []
    for name, module in model.named_modules():
        if (kind is None or isinstance(module, kind)) and any(matches(name, p) for p in patterns):
            out.append((name, module))
    return out


def replace_modules(
    model: nn.Module, targets: list[tuple[str, nn.Module]], wrap: Callable[[nn.Module], nn.Module]
) -> dict[int, nn.Module]:
    """Put `wrap(module)` in place of each target module, everywhere the module is referenced.

    A module shared by several parents (ALBERT's one block, T5's shared encoder-decoder layers) gets one wrapper
    installed at every place, so sharing survives injection. Returns {id(original): wrapper}."""
    wrappers = {id(m): wrap(m).train(m.training) for _, m in targets}  # new modules follow the model's mode
    # Collect every (parent, attribute) slot first: swapping while iterating would visit the new wrappers.
    slots = [
        (parent, attr, child)
        for _, parent in model.named_modules(remove_duplicate=False)
        for attr, child in parent._modules.items()
        if child is not None and id(child) in wrappers
    ]
    for parent, attr, child in slots:
        setattr(parent, attr, wrappers[id(child)])
    return wrappers


def freeze(model: nn.Module) -> None:
    """Stop gradients to every parameter of `model`."""
    for p in model.parameters():
        p.requires_grad_(False)


def train_params(module: nn.Module, skip_base: bool = True) -> None:
    """Let `module`'s parameters train; with `skip_base`, those under a `base_layer` (the wrapped weights) stay."""
    for name, p in module.named_parameters():
        if not (skip_base and (name.startswith("base_layer.") or ".base_layer." in name)):
            p.requires_grad_(True)


def train_extras(model: nn.Module, options: PeftOptions) -> None:
    """Unfreeze the task head (options.train_head) and the modules named by options.train_also."""
    head = getattr(model, "head", None)
    if options.train_head and isinstance(head, nn.Module):
        train_params(head, skip_base=False)
    if options.train_also:
        found = matching_modules(model, options.train_also)
        if not found:
            raise LMForgeError(f"train_also {options.train_also} matches no module of the model")
        for _, m in found:
            train_params(m)


def named_transformers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of the lmforge `Transformer`s inside `model` (the model itself, a TaskModel's backbone...)."""
    from lmforge.models.model import TransformerCore

    found = [(n, m) for n, m in model.named_modules() if isinstance(m, TransformerCore)]
    if not found:
        raise LMForgeError(f"{type(model).__name__} holds no lmforge Transformer to adapt")
    return found


def transformers_in(model: nn.Module) -> list[nn.Module]:
    return [m for _, m in named_transformers(model)]


def stacks_of(transformer: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """("encoder" | "decoder", stack) of a Transformer, bottom first (a prompt-tuning wrapper is looked through)."""
    for name in ("encoder", "decoder"):
        stack = getattr(transformer, name, None)
        if stack is not None:
            yield name, getattr(stack, "base_layer", stack)


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts; tied and shared tensors count once."""
    seen: set[int] = set()
    trainable = total = 0
    for p in model.parameters():  # parameters() yields each shared Parameter once
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total


def check_positive(section: str, **values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise LMForgeError(f"{section}.{name} must be positive, got {value}")
