"""What fine-tuning needs from adaptation: the `peft` recipe section and adapter-only checkpoints.

A recipe's `peft` section names a method (`peft.method`, "none" = full fine-tuning); its other keys are that
method's options (`--peft.method=lora --peft.rank=8`). `AdapterWeights` is a checkpoint view of an adapted task
model: `lmforge.checkpoint` saves and loads it like any module, and it holds only the trainable tensors
(adapters + task head) and the embedding rows of tokens added for the task."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.module import _IncompatibleKeys

from lmforge.adapt.inject import named_transformers
from lmforge.adapt.peft import PeftInfo, adapter_state_dict, apply_peft, build_options
from lmforge.errors import LMForgeError


@dataclass
class PeftSection:
    method: str = "none"
    """Parameter-efficient fine-tuning: lora, houlsby, pfeiffer, prefix, prompt, topk, adamix, or none (train
    every parameter)."""
    options: Any = None
    """The method's own typed options (adapt/*.py), given as the other keys of the section."""


def build_peft_section(raw: dict | None) -> PeftSection:
    """`method` picks the method; every other key is validated against that method's options dataclass."""
    if raw is None:
        return PeftSection()
    if not isinstance(raw, dict):
        raise LMForgeError(f"peft: expected a mapping, got {raw!r}")
    raw = dict(raw)
    method = str(raw.pop("method", PeftSection.method))
    if method == "none":
        if raw:
            raise LMForgeError(f"peft.{next(iter(raw))} is set but peft.method is none")
        return PeftSection()
    return PeftSection(method, build_options(method, raw))


def peft_section_to_dict(section: PeftSection) -> dict:
    """The section as recipe keys (options flattened), e.g. {"method": "lora", "rank": 8, ...}."""
    if section.method == "none":
        return {"method": "none"}
    return {"method": section.method, **dataclasses.asdict(section.options)}


def apply_peft_section(model: nn.Module, section: PeftSection) -> PeftInfo | None:
    """Apply the section's method to a built task model (in place); None for full fine-tuning."""
    if section.method == "none":
        return None
    return apply_peft(model, section.method, section.options)[1]


class AdapterWeights(nn.Module):
    """A checkpoint view of an adapted model whose state dict is the model's trainable tensors plus, per
    Transformer, the token-embedding rows `token_rows` (and the untied LM head's) under `<name>.rows`.

    Task tokens added at fine-tuning time (GPT-1's start/delimiter/extract) get fresh rows that stay frozen under
    PEFT yet are not in the pretrained weights, so the checkpoint must carry them. `save_checkpoint(run, step,
    AdapterWeights(model, rows), ...)` writes an adapter-only checkpoint; `load_weights(ckpt,
    AdapterWeights(model, rows))` reads it into a model adapted the same way from the same pretrained base."""

    def __init__(self, model: nn.Module, token_rows: list[int] | None = None) -> None:
        super().__init__()
        self.__dict__["model"] = model  # not a submodule: the view's state dict is only the subset
        self.token_rows = sorted(set(token_rows or []))

    def _row_params(self) -> dict[str, Tensor]:
        out = {}
        if not self.token_rows:
            return out
        for name, t in named_transformers(self.model):
            prefix = f"{name}." if name else ""
            out[f"{prefix}tok_emb.weight"] = t.tok_emb.weight
            if t.config.lm_head and t.lm_head.weight is not t.tok_emb.weight:
                out[f"{prefix}lm_head.weight"] = t.lm_head.weight
        return out

    def state_dict(self, *args, **kwargs) -> dict[str, Tensor]:
        state = {k: p.detach() for k, p in adapter_state_dict(self.model).items()}
        rows = torch.tensor(self.token_rows, dtype=torch.long)
        for name, weight in self._row_params().items():
            if name not in state:  # a trained table is saved whole already
                state[f"{name}.rows"] = _whole(weight.detach())[rows.to(weight.device)]  # (n_rows, dim)
        return state

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Tensor], strict: bool = True, assign: bool = False):
        own = self.state_dict()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            first = missing[0] if missing else unexpected[0]
            raise LMForgeError(
                f"adapter weights do not match the model: '{first}' is {'missing' if missing else 'unexpected'}"
            )
        params = adapter_state_dict(self.model)
        tables = self._row_params()
        rows = torch.tensor(self.token_rows, dtype=torch.long)
        for key, value in state_dict.items():
            if key in params:
                _assign(params[key], value)
            elif key.endswith(".rows") and key[: -len(".rows")] in tables:
                table = tables[key[: -len(".rows")]]
                whole = _whole(table).clone() if table is not _whole(table) else table
                whole[rows.to(table.device)] = value.to(table.device, table.dtype)
                if whole is not table:
                    _assign(table, whole)
        return _IncompatibleKeys(missing, unexpected)


def _whole(t: Tensor) -> Tensor:
    """A tensor sharded over processes (a DTensor, under train.parallel=fsdp) gathered whole; others as they are.
    Every process must call it for a sharded tensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _assign(dst: Tensor, value: Tensor) -> None:
    """dst[...] = value, where dst may be a shard of a tensor and value the whole tensor (or its shards)."""
    if hasattr(dst, "device_mesh") and not hasattr(value, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        value = distribute_tensor(value.to(dst.device, dst.dtype), dst.device_mesh, dst.placements, src_data_rank=None)
    dst.copy_(value)
