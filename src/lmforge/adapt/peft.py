"""The one entry point `apply_peft(model, method, options)`, the `ADAPTERS` registrations, and adapter-only
checkpoints: `save_adapter` writes the trainable weights (adapters + head) and the method with its options,
`load_adapter` re-applies the method to a fresh base model and loads them."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from lmforge.adapt.adamix import AdaMixOptions, apply_adamix
from lmforge.adapt.bottleneck import HoulsbyOptions, PfeifferOptions, apply_houlsby, apply_pfeiffer
from lmforge.adapt.inject import PeftOptions, count_parameters, transformers_in
from lmforge.adapt.lora import LoRAOptions, apply_lora
from lmforge.adapt.prefix import PrefixOptions, apply_prefix
from lmforge.adapt.prompt import PromptOptions, apply_prompt
from lmforge.adapt.topk import TopKOptions, apply_topk
from lmforge.errors import LMForgeError
from lmforge.files import loads_json
from lmforge.registry import ADAPTERS

Method = Literal["lora", "houlsby", "pfeiffer", "prefix", "prompt", "topk", "adamix"]
ADAPTER_WEIGHTS = "adapter.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
BASE_FIELDS = ("arch", "vocab_size", "d_model", "n_layers", "n_decoder_layers", "n_heads", "n_kv_heads", "head_dim")
"""Base-model config fields an adapter depends on, recorded with it and checked on load."""
PEFT_LR: dict[str, float] = {
    "lora": 5e-4,  # Hu et al. 2021, Table 9: RoBERTa-base on GLUE at 4e-4 to 5e-4 (SST-2 and MNLI: 5e-4)
    # docs/peft.md (gpt-small on the sentiment set, each method at two rates, 3 epochs): the best dev accuracy
    "houlsby": 2e-3,
    "pfeiffer": 2e-3,
    "adamix": 5e-4,
    "prefix": 5e-4,  # with Li & Liang's reparameterisation MLP, the default (learned directly: 1e-2)
    "prompt": 1e-2,
}
"""A PEFT method's own learning rate, in place of a recipe's full fine-tuning one (glue-sst2's 2e-5, BERT's, leaves
a LoRA model at the majority class). topk has none: it trains the model's own top blocks, as full fine-tuning does."""


@dataclass(frozen=True)
class PeftMethod:
    """A registered adaptation method: its typed options and the function that applies it to a model."""

    name: str
    Options: type
    apply: Callable[[nn.Module, Any], nn.Module]


for _m in (
    PeftMethod("lora", LoRAOptions, apply_lora),
    PeftMethod("houlsby", HoulsbyOptions, apply_houlsby),
    PeftMethod("pfeiffer", PfeifferOptions, apply_pfeiffer),
    PeftMethod("prefix", PrefixOptions, apply_prefix),
    PeftMethod("prompt", PromptOptions, apply_prompt),
    PeftMethod("topk", TopKOptions, apply_topk),
    PeftMethod("adamix", AdaMixOptions, apply_adamix),
):
    ADAPTERS.register(_m.name)(_m)


@dataclass
class PeftInfo:
    """What `apply_peft` did: the method, its resolved options, the adapted sites and the parameter counts."""

    method: str
    options: PeftOptions
    sites: list[str]
    trainable: int
    total: int

    @property
    def fraction(self) -> float:
        return self.trainable / max(self.total, 1)

    def __str__(self) -> str:
        return (
            f"peft {self.method}: {self.trainable:,} trainable of {self.total:,} parameters "
            f"({100 * self.fraction:.3f}%), {len(self.sites)} sites"
        )


def build_options(method: str, options: PeftOptions | dict | None, prefix: str = "peft.") -> PeftOptions:
    """The method's typed options from a dataclass, a recipe-style dict (validated key by key) or None."""
    from lmforge.config import all_keys, build_dataclass

    cls = ADAPTERS.get(method).Options
    if options is None:
        return cls()
    if isinstance(options, dict):
        keys = [f"{prefix}{k}" for k in all_keys(cls)] + [f"{prefix}method"]
        return build_dataclass(cls, dict(options), prefix, keys)
    if type(options) is not cls:
        raise LMForgeError(f"peft method '{method}' takes {cls.__name__}, got {type(options).__name__}")
    return options


def peft_lr(method: str, lr: float, recipe_method: str) -> tuple[float, str | None]:
    """The learning rate a run that turns `method` on over a recipe fine-tuning with `recipe_method` ("none": in
    full) trains at, and the note that says the change: the method's own (`PEFT_LR`) in place of the recipe's `lr`.
    The recipe's own method keeps its lr; the caller keeps a learning rate the user gives."""
    own = PEFT_LR.get(method)
    if own is None or method == recipe_method or own == lr:
        return lr, None
    return own, f"train.lr {_lr(lr)} → {_lr(own)} (peft.method={method}'s learning rate; --train.lr=VALUE sets another)"


def _lr(x: float) -> str:
    """2e-5, 6.25e-5: a learning rate as the recipes write it."""
    mantissa, exponent = f"{x:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts of `model`; tied and shared tensors count once."""
    return count_parameters(model)


def apply_peft(
    model: nn.Module, method: Method, options: PeftOptions | dict | None = None
) -> tuple[nn.Module, PeftInfo]:
    """Adapt `model` (a Transformer or a model holding one, e.g. a TaskModel) in place with `method`.

    Everything but the method's parameters (and, per the options, the task head) is frozen. Returns the model and
    a PeftInfo with the trainable-parameter count; `model.peft_config` records the method and options."""
    spec = ADAPTERS.get(method)
    opts = build_options(method, options)
    model = spec.apply(model, opts)
    trainable, total = trainable_parameters(model)
    return model, PeftInfo(method, opts, list(model.peft_config.sites), trainable, total)


def _strip_wrappers(name: str) -> str:
    # Names as a checkpoint stores them: no torch.compile / DDP wrapper segments.
    parts = [p for p in name.split(".") if p != "_orig_mod"]
    return ".".join(parts[1:] if parts and parts[0] == "module" else parts)


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters by name (adapters, prefixes, prompts, trained blocks, head): what an adapter
    checkpoint holds. Shared tensors appear once."""
    return {_strip_wrappers(n): p for n, p in model.named_parameters() if p.requires_grad}


def _base_fingerprint(model: nn.Module) -> list[dict]:
    return [{f: getattr(t.config, f) for f in BASE_FIELDS} for t in transformers_in(model)]


def save_adapter(
    directory: str | Path, model: nn.Module, method: str | None = None, options: PeftOptions | None = None
) -> Path:
    """Write `directory/adapter.safetensors` (the trainable weights) and `directory/adapter_config.json` (method,
    options, base-model fields, counts). method/options default to what `apply_peft` recorded on the model."""
    state = getattr(model, "peft_config", None)
    if method is None or options is None:
        if state is None:
            raise LMForgeError("the model has no adaptation method applied: nothing to save as an adapter")
        method, options = method or state.method, options or state.options
    opts = build_options(method, options)
    tensors = {k: t.detach().contiguous().cpu().clone() for k, t in adapter_state_dict(model).items()}
    if not tensors:
        raise LMForgeError("the model has no trainable parameters: nothing to save as an adapter")
    trainable, total = trainable_parameters(model)
    meta = {
        "format": 1,
        "method": method,
        "options": dataclasses.asdict(opts),
        "base": _base_fingerprint(model),
        "trainable": trainable,
        "total": total,
    }
    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".{ADAPTER_WEIGHTS}.tmp-{os.getpid()}"
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, out / ADAPTER_WEIGHTS)
        tmp = out / f".{ADAPTER_CONFIG}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, out / ADAPTER_CONFIG)  # written last: a directory with it holds a complete adapter
    except (OSError, SafetensorError) as e:
        raise LMForgeError(f"could not save the adapter to {out}: {e}") from e
    return out


def read_adapter_config(directory: str | Path) -> dict:
    """The adapter's method, options and base-model fields, as saved."""
    path = Path(directory) / ADAPTER_CONFIG
    try:
        meta = loads_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise LMForgeError(f"no {ADAPTER_CONFIG} in {directory}: not an adapter directory") from e
    except (OSError, json.JSONDecodeError) as e:
        raise LMForgeError(f"could not read {path}: {e}") from e
    if (
        not isinstance(meta, dict)
        or not isinstance(meta.get("method"), str)
        or not isinstance(meta.get("options"), dict)
    ):
        raise LMForgeError(f"{path} does not hold an adapter config (method and options)")
    return meta


def _check_base(meta: dict, model: nn.Module, where: Path) -> None:
    saved, own = meta.get("base"), _base_fingerprint(model)
    if not isinstance(saved, list) or len(saved) != len(own):
        raise LMForgeError(
            f"adapter {where} was trained on {len(saved or [])} transformer(s), the model has {len(own)}"
        )
    for s, o in zip(saved, own):
        for f in BASE_FIELDS:
            if s.get(f) != o[f]:
                raise LMForgeError(f"adapter {where} needs a base model with {f}={s.get(f)}, this one has {o[f]}")


def load_adapter(directory: str | Path, base_model: nn.Module) -> tuple[nn.Module, PeftInfo]:
    """Re-apply the saved method to `base_model` (the pretrained weights the adapter was trained on) and load the
    adapter weights; returns the adapted model and its PeftInfo."""
    where = Path(directory)
    meta = read_adapter_config(where)
    _check_base(meta, base_model, where)
    model, info = apply_peft(base_model, meta["method"], meta["options"])
    own = adapter_state_dict(model)
    path = where / ADAPTER_WEIGHTS
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            saved = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise LMForgeError(f"could not read {path}: {e}") from e
    for name, p in own.items():
        if name not in saved:
            raise LMForgeError(f"adapter {where} does not match the model: '{name}' is missing from it")
        if saved[name].shape != p.shape:
            got, want = tuple(saved[name].shape), tuple(p.shape)
            raise LMForgeError(f"adapter {where} does not match the model: '{name}' has shape {got}, not {want}")
    extra = sorted(set(saved) - set(own))
    if extra:
        raise LMForgeError(f"adapter {where} does not match the model: unexpected weight '{extra[0]}'")
    with torch.no_grad():
        for name, p in own.items():
            p.copy_(saved[name])
    return model, info
